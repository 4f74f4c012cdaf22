"""The few numbers a reader looks for first, pulled from any results file by their names."""

from __future__ import annotations

from . import data

# (suffix of a metric path, label); the first results' matches are listed in this order.
HEADLINE = (
    ("accelerator_utilization", "accelerator utilization"),
    ("stall_ratio", "data stall"),
    ("throughput.bytes_per_s", "throughput"),
    ("throughput.samples_per_s", "samples/s"),
    ("batch_wait_s.p99", "batch wait P99"),
    ("blocking_s.mean", "checkpoint blocking (mean)"),
    ("commit_latency_s.p99", "checkpoint commit P99"),
    ("restore_s", "restore time"),
)


def headline_rows(docs: list[tuple[str, dict]], limit: int = 40) -> list[list[str]]:
    from .html import fmt

    rows = []
    for name, doc in docs:
        metrics = doc.get("metrics", {}) or {}
        for suffix, label in HEADLINE:
            for path, v in data.find(metrics, suffix)[:6]:
                rows.append([name, f"{label} ({path})", fmt(path, v)])
    return rows[:limit]
