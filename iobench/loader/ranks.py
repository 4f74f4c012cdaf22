"""Which of a load's metrics add up across MPI ranks and which do not (merged by iobench.dist).

A data-parallel step waits for the slowest rank, so the world stall ratio is the worst
rank's; its spread (min/mean/max) is kept beside it.  Samples and bytes add up; rates are
the total over the slowest rank's wall time; batch wait, batch I/O and compute histograms
are merged.
"""

from __future__ import annotations

from ..dist.aggregate import MergeSpec, merge

LOAD_SPEC = MergeSpec(
    duration="wall_s",
    sums=("samples", "bytes_read", "wait_s_total", "compute_s_total", "read_calls"),
    maxes=("steps", "stall_ratio", "stall_ratio_first_step_excluded", "batch_bytes_max", "startup_s", "first_step_s"),
    spreads=("stall_ratio", "accelerator_utilization", "throughput.samples_per_s", "throughput.bytes_per_s",
             "throughput.steady_samples_per_s", "startup_s"),
    hists={"batch_wait_s": "batch_wait_hist", "batch_io_s": "batch_io_hist", "compute_s": "compute_hist"},
    rates={"throughput.samples_per_s": "samples", "throughput.bytes_per_s": "bytes_read"},
)


def merge_ranks(per_rank: list[dict], hosts: list[str] | None = None) -> dict:
    ranks = [m for m in per_rank if m]
    out = merge(ranks, LOAD_SPEC, hosts)
    out["ranks"] = len(ranks)
    out["accelerator_utilization"] = 1.0 - out["stall_ratio"]
    out["stall_ratio_by_rank"] = [m["stall_ratio"] for m in ranks]
    out["first_step_excluded"] = True
    out["batch_bytes"] = sum(m["batch_bytes"] for m in ranks) / len(ranks)
    steady = [m.get("throughput", {}).get("steady_samples_per_s") for m in ranks]
    # ranks run concurrently: the world's steady rate is the sum of theirs
    out["throughput"]["steady_samples_per_s"] = sum(steady) if all(v is not None for v in steady) else None
    return out
