"""Tail-latency amplification when a step waits for many servers, and hedged requests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TailAmplification:
    p_all_fast: float
    p_step_slow: float        # at least one of the fan-out requests is slow


def tail_amplification(p_slow: float, fanout: int) -> TailAmplification:
    """A step that needs ``fanout`` independent responses is slow when any one of them is."""
    fast = (1 - p_slow) ** fanout
    return TailAmplification(fast, 1 - fast)


@dataclass(frozen=True)
class Hedged:
    p_request_slow: float     # every replica of one request is slow
    p_step_slow: float
    p_step_slow_unhedged: float
    extra_requests_ratio: float   # (replicas − 1) extra requests per request when always hedging


def hedged(p_slow: float, fanout: int, replicas: int = 2) -> Hedged:
    """Send each request to ``replicas`` copies and take the first answer."""
    p_req = p_slow ** replicas
    return Hedged(p_req, 1 - (1 - p_req) ** fanout, tail_amplification(p_slow, fanout).p_step_slow,
                  float(replicas - 1))
