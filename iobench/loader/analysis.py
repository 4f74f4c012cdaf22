"""Prefetch sizing from a load's measured batch I/O time, and the DS-Analyzer stall split.

Prefetch (seed Eq. 4.3): depth = ceil(P99 batch I/O time / compute time), plus a safety
margin; host memory = depth × batch bytes × consumers.  The batch I/O time is what a
worker spends making a batch ready (a block's read and parse count on its first batch,
which every later batch of the block waits behind), so the rule is conservative when
several workers read in parallel.

Stall analysis (Mohan et al., "Analyzing and Mitigating Data Stalls in DNN Training"):
a synthetic pass (no I/O: batches from memory) measures the harness alone; a warm pass
(data in the page cache) adds preparation; a cold pass adds the fetch from storage.
prep stall = warm − synthetic, fetch stall = cold − warm.
"""

from __future__ import annotations

from dataclasses import replace

from ..planner.pipeline import prefetch_depth
from .core import LoadConfig, LoadRun, run_load


def recommend(metrics: dict, compute_s: float, consumers: int = 1, margin: int = 2) -> dict:
    """The ``metrics.prefetch_recommendation`` block of a load's results."""
    p99 = metrics["batch_io_s"]["p99"] or 0.0
    out = {"formula": "depth_min = ceil(P99 batch I/O time / compute time); recommended = depth_min + margin",
           "p99_batch_io_s": p99, "compute_s": compute_s, "margin": margin, "consumers": consumers,
           "batch_bytes": metrics.get("batch_bytes", 0.0)}
    if compute_s <= 0:
        out.update(depth_min=None, depth_recommended=None,
                   note="compute time is zero: the consumer never waits on compute, so no depth hides I/O; "
                        "give --compute-ms")
        return out
    plan = prefetch_depth(p99, compute_s, batch_bytes=metrics.get("batch_bytes", 0.0), consumers=consumers,
                          margin=margin)
    out.update(depth_min=plan.depth_min, depth_recommended=plan.depth_recommended,
               host_bytes_per_consumer=plan.host_bytes_per_consumer, host_bytes_total=plan.host_bytes_total)
    return out


def validate(cfg: LoadConfig, depth: int, storage_options: dict | None = None, **kw) -> dict:
    """Stall at the recommended depth against depth 1, on the same settings."""
    at_depth = run_load(replace(cfg, prefetch=depth), storage_options, **kw)
    at_one = run_load(replace(cfg, prefetch=1), storage_options, **kw)
    return {"depth": depth, "stall_ratio_at_depth": at_depth.metrics["stall_ratio"],
            "stall_ratio_at_depth_1": at_one.metrics["stall_ratio"],
            "improved": at_depth.metrics["stall_ratio"] <= at_one.metrics["stall_ratio"]}


def analyze(cfg: LoadConfig, storage_options: dict | None = None, **kw) -> tuple[dict, LoadRun]:
    """Synthetic, warm and cold passes; returns the analysis block and the cold run."""
    synthetic = run_load(replace(cfg, cache="as-is"), storage_options, synthetic=True, **kw)
    # Cached data never reaches the (emulated) storage: the warm pass reads without emulation.
    warm = run_load(replace(cfg, cache="warm", emulate="none"), storage_options, **kw)
    cold = run_load(replace(cfg, cache="cold"), storage_options, **kw)
    s, w, c = (r.metrics["stall_ratio"] for r in (synthetic, warm, cold))
    block = {
        "method": "DS-Analyzer: synthetic (no I/O) / warm (prep only) / cold (fetch + prep) passes",
        "stall_ratio": {"synthetic": s, "warm": w, "cold": c},
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
