"""The per-tier table a person reads at a glance, built from the probes' own summaries.

Row keys (all optional; SI units): ``seq_read_bytes_per_s``, ``seq_write_bytes_per_s``,
``rand_read_iops_qd1``, ``rand_read_iops_qd32`` (with ``*_actual_qd`` when the sweep had
no such depth), ``rand_read_bs``, ``p99_read_latency_s``, ``metadata_ops_per_s``,
``smallfile_penalty`` and ``source`` (which probes filled the row).
"""

from __future__ import annotations

from ..units import format_bytes, format_rate, format_seconds

_PERF_KEYS = ("seq_read_bytes_per_s", "seq_write_bytes_per_s", "rand_read_iops_qd1", "rand_read_iops_qd1_actual_qd",
              "rand_read_iops_qd32", "rand_read_iops_qd32_actual_qd", "rand_read_bs", "p99_read_latency_s")


def tier_row(probes: dict) -> dict:
    """One table row from {probe name: probe metrics} of one tier."""
    row: dict = {"source": sorted(probes)}
    perf = (probes.get("file") or probes.get("s3") or {}).get("summary") or {}
    for k in _PERF_KEYS:
        if k in perf:
            row[k] = perf[k]
    if "metadata" in probes:
        row["metadata_ops_per_s"] = probes["metadata"].get("ops_per_s")
    if "smallfiles" in probes:
        row["smallfile_penalty"] = probes["smallfiles"].get("penalty")
    return row


def _iops(row: dict, qd: int) -> str:
    v = row.get(f"rand_read_iops_qd{qd}")
    if v is None:
        return "—"
    actual = row.get(f"rand_read_iops_qd{qd}_actual_qd")
    return f"{v:,.0f}" + (f" (qd {actual})" if actual not in (None, qd) else "")


def _deep_iops(row: dict) -> str:
    """The deep-queue IOPS with the depth it was measured at (the sweep's deepest, up to 32)."""
    v = row.get("rand_read_iops_qd32")
    if v is None:
        return "—"
    return f"{v:,.0f} (qd {row.get('rand_read_iops_qd32_actual_qd') or 32})"


COLUMNS = (
    ("seq read", lambda r: format_rate(r["seq_read_bytes_per_s"]) if r.get("seq_read_bytes_per_s") else "—"),
    ("seq write", lambda r: format_rate(r["seq_write_bytes_per_s"]) if r.get("seq_write_bytes_per_s") else "—"),
    ("rand read IOPS qd1", lambda r: _iops(r, 1)),
    ("rand read IOPS, deep qd", _deep_iops),     # a header of "qd32" over "(qd 16)" contradicted itself
    ("p99 read", lambda r: format_seconds(r["p99_read_latency_s"]) if r.get("p99_read_latency_s") else "—"),
    ("metadata ops/s", lambda r: f"{r['metadata_ops_per_s']:,.0f}" if r.get("metadata_ops_per_s") else "—"),
    ("small-file penalty", lambda r: f"{r['smallfile_penalty']:.1f}×" if r.get("smallfile_penalty") else "—"),
)


def table(summary: dict):
    """A rich Table of {tier: row}."""
    from rich.table import Table

    t = Table(title="iobench probe — per tier")
    t.add_column("tier")
    for name, _ in COLUMNS:
        t.add_column(name, justify="right")
    for tier, row in summary.items():
        rb = row.get("rand_read_bs")
        t.add_row(tier + (f" (random {format_bytes(rb)})" if rb and rb != 4096 else ""),
                  *(fmt(row) for _, fmt in COLUMNS))
    return t
