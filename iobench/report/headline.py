"""The few numbers a reader looks for first, pulled from any results file by their names."""

from __future__ import annotations

from . import data

# (suffix of a metric path, label); the first results' matches are listed in this order.
HEADLINE = (
    ("mlperf.max_accelerators_per_node", "simulated accelerators sustained per node (MLPerf Storage)"),
    ("accelerator_utilization", "accelerator utilization"),
    ("stall_ratio", "data stall"),
    ("throughput.bytes_per_s", "throughput"),
    ("throughput.samples_per_s", "samples/s"),
    ("batch_wait_s.p99", "batch wait P99"),
    ("blocking_s.mean", "checkpoint blocking (mean)"),
    ("commit_latency_s.p99", "checkpoint commit P99"),
    ("restore_s", "restore time"),
)


def _top_level(path: str) -> bool:
    # Table cells (gds cells[3], generate's per-dataset rows) are shown in their tables instead.
    return "[" not in path and path.count(".") <= 3


def headline_rows(docs: list[tuple[str, dict]], limit: int = 30, group_size: int = 3) -> list[list[str]]:
    """Headline numbers per results file; commands with many files get one min–max row per metric."""
    from .format import fmt

    by_cmd: dict[str, list[tuple[str, dict]]] = {}
    for name, doc in docs:
        by_cmd.setdefault(str(doc.get("command")), []).append((name, doc))
    rows = []
    for cmd, members in by_cmd.items():
        if len(members) > group_size:
            for suffix, label in HEADLINE:
                vals = [(v, p) for _, d in members for p, v in data.find(d.get("metrics", {}) or {}, suffix)
                        if _top_level(p)]
                if vals:
                    lo, hi = min(vals), max(vals)
                    rows.append([f"{cmd} ({len(members)} files)", f"{label} ({lo[1]}), min – max",
                                 f"{fmt(lo[1], lo[0])} – {fmt(hi[1], hi[0])}"])
            continue
        for name, doc in members:
            metrics = doc.get("metrics", {}) or {}
            for suffix, label in HEADLINE:
                for path, v in [x for x in data.find(metrics, suffix) if _top_level(x[0])][:2]:
                    rows.append([name, f"{label} ({path})", fmt(path, v)])
    return rows[:limit]
