"""Stragglers: a synchronous step waits for the slowest of N ranks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of n iid N(0,1)] = ∫ x·n·φ(x)·Φ(x)^(n−1) dx, by Simpson's rule on [−12, 12]."""
    if n < 1:
        raise ValueError("n must be at least 1")
    if n == 1:
        return 0.0
    import numpy as np

    x = np.linspace(-12.0, 12.0, 24001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    f = x * n * phi * cdf ** (n - 1)
    h = x[1] - x[0]
    return float(h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum()))


@dataclass(frozen=True)
class StragglerStep:
    expected_max_sigmas: float
    step_s: float
    extra_s: float          # over the jitter-free step (μ + overhead)


def straggler_step(mean_s: float, sigma_s: float, ranks: int, overhead_s: float = 0.0) -> StragglerStep:
    """Expected step time when each rank's compute is N(μ, σ²) and the step waits for the slowest."""
    e = expected_max_normal(ranks)
    return StragglerStep(e, mean_s + e * sigma_s + overhead_s, e * sigma_s)


@dataclass(frozen=True)
class StragglerResponses:
    wait_extra_s: float          # keep waiting for a straggler at 3σ
    wait_extra_sigmas: float
    redistribute_step_s: float   # drop it and give its work to the other N−1 ranks
    evict_cost_s: float          # restart without it from the last checkpoint: τ/2 + r
    evict_cost_steps: float


def straggler_responses(mean_s: float, sigma_s: float, ranks: int, overhead_s: float, interval_s: float,
                        recovery_s: float, step_s: float, straggler_sigmas: float = 3.0) -> StragglerResponses:
    """Compare waiting, redistributing and evicting for one rank that runs ``straggler_sigmas`` slow."""
    e = expected_max_normal(ranks - 1)
    wait_sig = max(0.0, straggler_sigmas - e)
    evict = interval_s / 2 + recovery_s
    return StragglerResponses(wait_sig * sigma_s, wait_sig, mean_s * ranks / (ranks - 1) + e * sigma_s + overhead_s,
                              evict, evict / step_s)
