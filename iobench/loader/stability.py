"""How far a load's stall and P99 can be trusted, and when a load has measured enough.

Measurement rule 9 ("enough samples", docs/design.md): a percentile or ratio carries its confidence interval and the count
it rests on.  Two estimators, both on the steady steps (step 0 excluded):

- **stall ratio — batch means**: the steps are cut into ``m`` (≤ 20) contiguous groups of
  equal length; each group's stall is Σ wait / Σ step time; the 95% interval is the
  ratio estimate ± t(0.975, m−1) · sd(group stalls) / √m.  Contiguous groups absorb the
  short-range correlation of consecutive steps (one slow read delays a few of them).
- **P99 — order statistics** (distribution-free, for independent draws): the 95% interval
  of the p-quantile runs between the sorted values of rank n·p ∓ 1.96·√(n·p·(1−p)).  Its
  upper end exists only when n(1−p) > 1.96²·p, i.e. n ≳ 380 for the P99: a run with fewer
  batches has no P99 worth printing, and says so.

``StopRule`` ends a load once both are within their stated widths (after ``min_steps``)
or its time cap has passed; the results say which.

**Steady window** (the headline stall): before the clock starts the workers already read
ahead (up to W·Q batches, DataLoader's head start); when storage is the bottleneck the
consumer lives off that stock for a while without waiting, and a short run's first-step-
excluded stall (MLPerf's) reads 5–10 pp under the steady state.  The steady window runs
from the second step that waited (the consumer has caught up with production: the queue
is empty; the first such wait may be a partial one) to the last step that waited; both
ends are the same state (empty queue), so the window holds whole produce/consume cycles
and no stock from before the clock.  Where the waits do not span at least a third of the
steps (compute-bound runs, or waits only at start-up) the window is every step but the
first, as MLPerf counts.
"""

from __future__ import annotations

from ..schema import STALL_RATIO
import math
from typing import Any
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093}
MIN_GROUPS = 5
MAX_GROUPS = 20


def t975(df: int) -> float:
    return _T975.get(df, Z95 if df > 19 else 12.706)


WAITED_S = 0.001   # a step "waited" when its batch was not there: above the hand-off (pipe + wake-up, < 1 ms)


def steady_window(waits, waited_s: float = WAITED_S) -> tuple[int, int, str]:
    """``(from, to, rule)``: the steps ``[from, to)`` the steady-state stall is measured over (see module doc)."""
    n = len(waits)
    full = (1 if n > 1 else 0, n, "every step but the first (MLPerf)")
    hit = [k for k in range(1, n) if waits[k] > waited_s]
    if len(hit) < 3:
        return full
    # the first wait may come mid-cycle (the stock ran out part-way through a batch): from the second
    k0, k1 = hit[1], hit[-1]
    if (k1 - k0) * 3 < n - 1:
        return full
    return k0, k1, "second to last step that waited (head start drained)"


def window_stall(waits, steps, window) -> float:
    k0, k1 = window[0], window[1]
    s = sum(steps[k0:k1])
    return sum(waits[k0:k1]) / s if s > 0 else 0.0


def stall_interval(waits, steps, min_group: int = 3) -> dict:
    """Batch-means 95% interval of Σ wait / Σ step over the given (steady) steps."""
    out = ratio_interval(waits, steps, min_group)
    return out | {"high": min(1.0, out["high"])} if out["high"] is not None else out


def ratio_interval(num, den, min_group: int = 3) -> dict:
    """Batch-means 95% interval of Σ num / Σ den over consecutive steps (stall: waits / step times;
    batches per second: ones / step times)."""
    w = np.asarray(num, dtype=float)
    s = np.asarray(den, dtype=float)
    n = len(s)
    value = float(w.sum() / s.sum()) if n and s.sum() > 0 else 0.0
    m = min(MAX_GROUPS, n // max(1, min_group))
    out = {"value": value, "n": n, "method": "batch means (contiguous groups), 95%", "groups": m}
    if m < MIN_GROUPS:
        return out | {"low": None, "high": None, "half_width": None,
                      "note": f"{n} steps: need at least {MIN_GROUPS * min_group} for an interval"}
    size = n // m
    gw = w[: m * size].reshape(m, size).sum(axis=1)
    gs = s[: m * size].reshape(m, size).sum(axis=1)
    g = np.divide(gw, gs, out=np.zeros(m), where=gs > 0)
    half = t975(m - 1) * float(g.std(ddof=1)) / math.sqrt(m)
    return out | {"low": max(0.0, value - half), "high": value + half, "half_width": half}


def mean_interval(values) -> dict:
    """Student-t 95% interval of the mean of independent repeats (each a whole measurement, e.g. one
    timed generation); ``low``/``high`` are None below two repeats."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    out = {"n": n, "method": "mean of independent repeats, Student t 95%"}
    value = float(v.mean()) if n else None
    if value is None or n < 2:
        return out | {"value": value, "low": None, "high": None, "half_width": None,
                      "note": "one repeat: no interval" if n else "no values"}
    half = t975(n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
    return out | {"value": value, "low": value - half, "high": value + half, "half_width": half}


def rate_interval(amount: float, seconds) -> dict:
    """``amount`` done in each of several repeats taking ``seconds``: the rate amount / geometric-mean
    time, with the Student t interval of the mean log time carried over.  Times are positive and
    skewed (the first repeat pays for imports and connections): on the log scale the interval stays
    positive, where a plain mean's lower bound can cross zero and leave the rate without an upper one."""
    t = np.asarray(seconds, dtype=float)
    if len(t) == 0 or np.any(t <= 0):
        return {"value": None, "low": None, "high": None, "n": len(t)}
    lt = mean_interval(np.log(t))
    out = {"value": amount / math.exp(lt["value"]), "n": lt["n"], "low": None, "high": None}
    if lt["low"] is not None:
        out |= {"low": amount / math.exp(lt["high"]), "high": amount / math.exp(lt["low"])}
    return out


def quantile_interval(values, q: float = 0.99) -> dict:
    """Order-statistic 95% interval of the q-quantile; ``high`` is None when n is too small for it."""
    v = np.sort(np.asarray(values, dtype=float))
    n = len(v)
    out: dict[str, Any] = {"q": q, "n": n, "method": "order statistics, 95%"}
    if n == 0:
        return out | {"value": None, "low": None, "high": None, "note": "no values"}
    value = float(np.quantile(v, q, method="higher"))
    spread = Z95 * math.sqrt(n * q * (1 - q))
    lo = int(math.floor(n * q - spread))
    hi = int(math.ceil(n * q + spread))
    need = math.ceil(Z95 * Z95 * q / (1 - q)) + 1
    out |= {"value": value, "low": float(v[lo - 1]) if lo >= 1 else float(v[0]),
            "high": float(v[hi - 1]) if hi <= n else None}
    if out["high"] is None:
        out["note"] = f"{n} values: the P{q * 100:g} needs at least {need} for an upper bound"
    else:
        out["relative_half_width"] = (out["high"] - out["low"]) / 2 / value if value > 0 else 0.0
    return out


@dataclass(frozen=True)
class StopRule:
    """Stop once the stall is within ±``stall_ci`` and the P99 batch time within ±``p99_ci`` (relative)."""

    min_steps: int = 50
    max_time_s: float = 60.0
    stall_ci: float = 0.02           # half-width of the stall interval, absolute (0.02 = ±2 pp)
    p99_ci: float = 0.25             # half-width of the P99 interval, relative to the P99
    every: int = 10                  # steps between checks

    def check(self, rec, elapsed_s: float) -> str | None:
        n = len(rec.waits)
        if elapsed_s >= self.max_time_s:
            return f"time cap {self.max_time_s:g} s"
        if n < self.min_steps or n % self.every:
            return None
        return "stable" if steady_verdict(rec, self)["stable"] else None

    def describe(self) -> dict:
        return {"min_steps": self.min_steps, "max_time_s": self.max_time_s, "stall_ci_half_width": self.stall_ci,
                "p99_ci_relative_half_width": self.p99_ci}


def service(rec) -> list[float]:
    """Per batch: storage + prep time at its worker (a stream's buffer fill excluded)."""
    return [a + b for a, b in zip(rec.io_s, rec.prep_s)]


def steady_verdict(rec, rule: StopRule) -> dict:
    """``verdict`` over a run's steady window (stall) and its batches from step 1 (P99); adds ``window``."""
    k0, k1, why = steady_window(rec.waits)
    v = verdict(rec.waits[k0:k1], rec.steps_s[k0:k1], service(rec)[1:], rule)
    return v | {"window": {"from_step": k0, "to_step": k1, "rule": why}}


def verdict(waits, steps, service_s, rule: StopRule) -> dict:
    """The intervals, and whether both meet the rule's widths."""
    st, p99 = stall_interval(waits, steps), quantile_interval(service_s, 0.99)
    reasons = not_stable_because(st, p99, rule)
    return {"stable": not reasons, "not_stable_because": reasons, STALL_RATIO: st,
            "batch_service_p99_s": p99, "batch_wait_p99_s": quantile_interval(waits, 0.99)}


def not_stable_because(stall: dict, p99: dict, rule: StopRule, what: str = "stall") -> list[str]:
    """Why a stall interval and a P99 interval do not meet the rule's widths (empty: they do)."""
    reasons = []
    hw = stall["half_width"]
    if hw is None or hw > rule.stall_ci:
        reasons.append(stall["note"] if hw is None else f"{what} ±{hw * 100:.1f} pp > ±{rule.stall_ci * 100:g} pp")
    if p99["high"] is None:
        reasons.append(p99["note"])
    elif p99["relative_half_width"] > rule.p99_ci:
        reasons.append(f"P99 batch time ±{p99['relative_half_width']:.0%} > ±{rule.p99_ci:.0%}")
    return reasons
