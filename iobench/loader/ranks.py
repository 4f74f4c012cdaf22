"""One load's metrics across MPI ranks (measurement rule 5).

Ranks start together (a barrier before the load) and a data-parallel step waits for the
slowest rank, so: durations and the stall ratio are the maximum over ranks, counts and
bytes are summed, throughput is total / the longest wall time, and HDR histograms are
merged from their encodings — never averaged.
"""

from __future__ import annotations

from ..metrics import LatencyHistogram

_HISTS = {"batch_wait_s": "batch_wait_hist", "batch_io_s": "batch_io_hist", "compute_s": "compute_hist"}


def merge_ranks(per_rank: list[dict]) -> dict:
    ranks = [m for m in per_rank if m]
    wall = max(m["wall_s"] for m in ranks)
    samples = sum(m["samples"] for m in ranks)
    nbytes = sum(m["bytes_read"] for m in ranks)
    stall = max(m["stall_ratio"] for m in ranks)
    out = {
        "ranks": len(ranks),
        "steps": max(m["steps"] for m in ranks),
        "samples": samples,
        "bytes_read": nbytes,
        "wall_s": wall,
        "stall_ratio": stall,
        "accelerator_utilization": 1.0 - stall,
        "stall_ratio_by_rank": [m["stall_ratio"] for m in ranks],
        "first_step_excluded": True,
        "throughput": {"samples_per_s": samples / wall if wall > 0 else None,
                       "bytes_per_s": nbytes / wall if wall > 0 else None},
        "batch_bytes": sum(m["batch_bytes"] for m in ranks) / len(ranks),
    }
    for name, key in _HISTS.items():
        encs = [m.get(key) for m in ranks if m.get(key)]
        if encs:
            h = LatencyHistogram()
            for e in encs:
                h.merge(LatencyHistogram.decode(e))
            out[name] = h.summary()
            out[key] = h.encode()
    return out
