"""Which of a load's metrics add up across MPI ranks and which do not (merged by iobench.dist).

A data-parallel step waits for the slowest rank, so the world stall ratio is the worst
rank's; its spread (min/mean/max) is kept beside it.  The world's intervals are recomputed
from the ranks' per-batch series (``world_intervals``): the worst stall lies between the
largest of the ranks' lower bounds and the largest of their upper bounds; the P99 batch
times are order statistics over every rank's batches together.  Samples and bytes add up; rates are
the total over the slowest rank's wall time; batch wait, batch I/O and compute histograms
are merged.
"""

from __future__ import annotations

from ..schema import STALL_RATIO
from ..dist.aggregate import MergeSpec, merge
from .stability import StopRule, not_stable_because, quantile_interval, stall_interval, steady_window

LOAD_SPEC = MergeSpec(
    duration="wall_s",
    sums=("samples", "bytes_read", "wait_s_total", "compute_s_total", "read_calls"),
    maxes=("steps", STALL_RATIO, "stall_ratio_first_step_excluded", "batch_bytes_max", "startup_s", "first_step_s"),
    spreads=(STALL_RATIO, "accelerator_utilization", "throughput.samples_per_s", "throughput.bytes_per_s",
             "throughput.steady_samples_per_s", "startup_s"),
    hists={"batch_wait_s": "batch_wait_hist", "batch_io_s": "batch_io_hist", "compute_s": "compute_hist"},
    rates={"throughput.samples_per_s": "samples", "throughput.bytes_per_s": "bytes_read"},
)


def merge_ranks(per_rank: list[dict], hosts: list[str] | None = None) -> dict:
    ranks = [m for m in per_rank if m]
    out = merge(ranks, LOAD_SPEC, hosts)
    out["ranks"] = len(ranks)
    out["accelerator_utilization"] = 1.0 - out[STALL_RATIO]
    out["stall_ratio_by_rank"] = [m[STALL_RATIO] for m in ranks]
    out["first_step_excluded"] = True
    out["batch_bytes"] = sum(m["batch_bytes"] for m in ranks) / len(ranks)
    # ranks run concurrently: the world's steady and batch rates are the sums of theirs
    for key in ("steady_samples_per_s", "batches_per_s"):
        vals = [m.get("throughput", {}).get(key) for m in ranks]
        out["throughput"][key] = sum(vals) if all(v is not None for v in vals) else None
    if all(m.get("series") for m in ranks):
        out.update(world_intervals(ranks))
    return out


def world_intervals(ranks: list[dict]) -> dict:
    """``intervals``, ``stable``, ``stability`` and ``steady_window`` of the world, from each rank's series."""
    per, service, waits = [], [], []
    for m in ranks:
        s = m["series"]
        w, st = s["wait_s"], s.get("step_s") or _steps(s)
        k0, k1, _why = steady_window(w)
        per.append(stall_interval(w[k0:k1], st[k0:k1]) | {"window": [k0, k1]})
        service += [a + b for a, b in zip(s["io_s"][1:], s["prep_s"][1:])]
        waits += w[k0:k1]
    worst = max(range(len(per)), key=lambda r: per[r]["value"])
    lows, highs = [p["low"] for p in per], [p["high"] for p in per]
    whole = None not in lows and None not in highs
    stall = {"value": per[worst]["value"], "n": sum(p["n"] for p in per), "worst_rank": worst,
             "method": "worst rank's stall: between the largest lower and the largest upper bound of the "
                       "ranks' batch-means 95% intervals",
             "low": max(lows) if whole else None, "high": max(highs) if whole else None, "by_rank": per}
    stall["half_width"] = (stall["high"] - stall["low"]) / 2 if whole else None
    if not whole:
        stall["note"] = "a rank ran too few steps for an interval"
    p99, wait99 = quantile_interval(service, 0.99), quantile_interval(waits, 0.99)
    d = (ranks[0].get("stability") or {}).get("rule") or {}
    rule = StopRule(min_steps=d.get("min_steps", 50), max_time_s=d.get("max_time_s", 60.0),
                    stall_ci=d.get("stall_ci_half_width", 0.02), p99_ci=d.get("p99_ci_relative_half_width", 0.25))
    reasons = not_stable_because(stall, p99, rule, what="world stall")
    stopped = sorted({str((m.get("stability") or {}).get("stopped", "")) for m in ranks} - {""})
    windows = [p["window"] for p in per]
    return {"intervals": {STALL_RATIO: stall, "batch_service_p99_s": p99, "batch_wait_p99_s": wait99},
            "stable": not reasons,
            "stability": {"rule": rule.describe(), "not_stable_because": reasons,
                          "until_stable": any((m.get("stability") or {}).get("until_stable") for m in ranks),
                          "stopped": "; ".join(stopped),
                          "world": "stall per rank (its own steady window); P99 over every rank's batches"},
            # the world's window: the steps where every rank was in its own steady window
            "steady_window": {"from_step": max(w[0] for w in windows), "to_step": min(w[1] for w in windows),
                              "by_rank": windows, "rule": "each rank's own (see per_rank); the world's is where all overlap"}}


def _steps(series: dict) -> list[float]:
    from ..planner.loader_sim import consumer_busy_s

    return [w + b for w, b in zip(series["wait_s"], consumer_busy_s(series))]
