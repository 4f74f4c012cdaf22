"""Loader advice from a load's measured per-batch service time, and the DS-Analyzer stall split.

Advice (formulas in ``iobench.planner.pipeline``): from the batch service time S at a
worker (storage + prep; a stream's buffer fill excluded) and the step time C —
- the domain models' Eq. 4.3 for one producer: depth_min = ceil(P99[S] / C) (recommended + margin);
- DataLoader settings (``loader_plan``): num_workers W = ceil(E[S] / (0.8·C)) (W producers
  supply W / E[S] batches/s), prefetch_factor Q = ceil(ceil(P99[S] / C) / W) (W producers
  divide the depth), host memory (W·Q + 1) batches.
``--validate`` runs the neighbourhood (depth 1, rec/2, rec, 2·rec; W−1, W+1) and says
whether the recommendation is within 2 pp of the best stall found, at the least memory.

Stall analysis (Mohan et al., "Analyzing and Mitigating Data Stalls in DNN Training"):
a synthetic pass (no I/O: batches from memory) measures the harness alone; a warm pass
(data in the page cache) adds preparation; a cold pass adds the fetch from storage.
prep stall = warm − synthetic, fetch stall = cold − warm.
"""

from __future__ import annotations

from ..schema import STALL_RATIO
import os
from dataclasses import replace

from ..planner.pipeline import loader_plan, prefetch_depth
from .core import LoadConfig, LoadRun, run_load, slots_for
from .sampler import order_of

WITHIN_PP = 0.02


def recommend(metrics: dict, compute_s: float, consumers: int = 1, margin: int = 2,
              max_workers: int | None = None) -> dict:
    """The ``metrics.prefetch_recommendation`` block of a load's results."""
    svc = metrics.get("batch_service_s") or metrics["batch_io_s"]   # older results: batch_io_s was io + prep
    p99 = svc["p99"] or 0.0
    mean = svc.get("mean") or 0.0
    bb = metrics.get("batch_bytes", 0.0)
    out = {"formula": "depth_min = ceil(P99 batch service time / compute time); recommended = depth_min + margin",
           "model": "workers = ceil(mean S / (0.8 compute)); prefetch_factor = ceil(ceil(P99 S / compute) / "
                    "workers); host memory = (workers x prefetch_factor + 1) batches (iobench.planner.pipeline."
                    "loader_plan); S = storage + prep time per batch at its worker, buffer fill excluded",
           "p99_batch_service_s": p99, "mean_batch_service_s": mean, "p99_batch_io_s": metrics["batch_io_s"]["p99"],
           "p99_interval": (metrics.get("intervals") or {}).get("batch_service_p99_s"),
           "compute_s": compute_s, "margin": margin, "consumers": consumers, "batch_bytes": bb,
           "measured_with": {"access": metrics.get("access"), "steps": metrics.get("steps")}}
    if compute_s <= 0:
        out.update(depth_min=None, depth_recommended=None, workers_recommended=None,
                   prefetch_factor_recommended=None,
                   note="compute time is zero: the consumer never waits on compute, so no depth hides I/O; "
                        "give --compute-ms")
        return out
    plan = prefetch_depth(p99, compute_s, batch_bytes=bb, consumers=consumers, margin=margin)
    cores = max_workers or os.cpu_count() or 1
    lp = loader_plan(mean, p99, compute_s, batch_bytes=bb, max_workers=None)
    out.update(depth_min=plan.depth_min, depth_recommended=plan.depth_recommended,
               host_bytes_per_consumer=plan.host_bytes_per_consumer, host_bytes_total=plan.host_bytes_total,
               workers_min=lp.workers_min, workers_recommended=lp.workers,
               prefetch_factor_recommended=lp.prefetch_factor,
               depth_total=lp.depth_total, host_bytes_loader=lp.host_bytes * consumers,
               worker_utilization=lp.utilization_per_worker)
    if lp.workers > cores:
        out["note"] = (f"{lp.workers} workers exceed this host's {cores} cores: CPU-bound preparation would slow "
                       "each worker; expect the stall floor of fewer workers")
        out["stall_floor_at_cores"] = loader_plan(mean, p99, compute_s, bb, max_workers=cores).stall_floor
    return out


def validate(cfg: LoadConfig, rec: dict, storage_options: dict | None = None, access: str | None = None,
             **kw) -> dict:
    """Measure the recommendation's neighbourhood: depth 1, rec/2, rec, 2·rec at W; and W−1, W+1 at rec.

    For map/stream the depth is the prefetch factor (per worker); for block, ``-Q`` in all.
    """
    access = access or rec.get("measured_with", {}).get("access") or "map"
    w = int(rec.get("workers_recommended") or cfg.workers)
    q = int((rec.get("prefetch_factor_recommended") if order_of(access) in ("map", "stream") else rec.get("depth_total"))
            or cfg.prefetch)
    grid = [(w, 1), (w, max(1, q // 2)), (w, q), (w, 2 * q), (max(1, w - 1), q), (w + 1, q)]
    runs = []
    for ww, qq in dict.fromkeys(grid):   # each point once, in the grid's order
        m = run_load(replace(cfg, workers=ww, prefetch=qq, access=access), storage_options, **kw).metrics
        runs.append({"workers": ww, "prefetch": qq, STALL_RATIO: m[STALL_RATIO],
                     "stall_interval": (m.get("intervals") or {}).get(STALL_RATIO),
                     "host_bytes": slots_for(access, ww, qq) * m["batch_bytes"],
                     "recommended": (ww, qq) == (w, q)})
    best = min(r[STALL_RATIO] for r in runs)
    mine = next(r for r in runs if r["recommended"])
    ok = [r for r in runs if r[STALL_RATIO] <= best + WITHIN_PP]
    least = min(ok, key=lambda r: (r["host_bytes"], r[STALL_RATIO]))
    at_1 = next(r[STALL_RATIO] for r in runs if (r["workers"], r["prefetch"]) == (w, 1))
    return {"runs": runs, "access": access, "best_stall_ratio": best, "recommended_stall_ratio": mine[STALL_RATIO],
            "within_2pp_of_best": mine[STALL_RATIO] <= best + WITHIN_PP,
            "least_memory_within_2pp": {k: least[k] for k in ("workers", "prefetch", "host_bytes", STALL_RATIO)},
            "recommended_is_least_memory_within_2pp": mine in ok and mine["host_bytes"] <= least["host_bytes"],
            # the earlier fields, for old readers
            "depth": q, "stall_ratio_at_depth": mine[STALL_RATIO], "stall_ratio_at_depth_1": at_1,
            "improved": mine[STALL_RATIO] <= at_1}


def analyze(cfg: LoadConfig, storage_options: dict | None = None, **kw) -> tuple[dict, LoadRun]:
    """Synthetic, warm and cold passes; returns the analysis block and the cold run."""
    synthetic = run_load(replace(cfg, cache="as-is"), storage_options, synthetic=True, **kw)
    # Cached data never reaches the (emulated) storage: the warm pass reads without emulation.
    warm = run_load(replace(cfg, cache="warm", emulate="none"), storage_options, **kw)
    cold = run_load(replace(cfg, cache="cold"), storage_options, **kw)
    s, w, c = (r.metrics[STALL_RATIO] for r in (synthetic, warm, cold))
    block = {
        "method": "DS-Analyzer: synthetic (no I/O) / warm (prep only) / cold (fetch + prep) passes",
        STALL_RATIO: {"synthetic": s, "warm": w, "cold": c},
        "prep_stall_ratio": max(0.0, w - s),
        "fetch_stall_ratio": max(0.0, c - w),
        "samples_per_s": {name: r.metrics["throughput"]["samples_per_s"]
                          for name, r in (("synthetic", synthetic), ("warm", warm), ("cold", cold))},
        "cache": {"warm": warm.environment["cache"], "cold": cold.environment["cache"]},
    }
    if cold.environment["storage"] == "emulated":
        block["emulation"] = "the cold pass reads through the emulated storage; the warm pass does not"
    if cold.environment["cache"].get("measured_residency") is None and cold.environment["storage"] != "synthetic":
        block["note"] = "no client page cache on this backend: warm and cold differ only by server-side caching"
    return block, cold
