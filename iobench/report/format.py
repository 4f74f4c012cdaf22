"""The one home of how numbers are shown: results fields, plan inputs and outputs.

A value's display follows its SI-style name (``..._bytes``, ``..._bytes_per_s``, ``..._s``,
``..._ratio``, ``..._usd``) or its results path (``read_latency_s.get.p99``); the HTML page,
the Markdown summary, ``iobench compare``, ``iobench plan`` and the headline rows all call
``fmt`` / ``format_value`` / ``format_input`` here.  Unit primitives (``format_bytes``,
``format_rate``, ``format_seconds``, ``format_duration``) stay in ``iobench.units``, below
every layer.
"""

from __future__ import annotations

from ..units import format_bytes, format_duration, format_rate, format_seconds
from . import data


def fmt(path: str, v) -> str:
    parent, _, last = path.rpartition(".")
    # An HDR field (p99, mean, ...) of a latency: some part of its path names seconds (read_latency_s.get.p99).
    if last in data.HDR_KEYS and isinstance(v, (int, float)) and any(x.endswith("_s") for x in parent.split(".")):
        return f"{v:,}" if last == "count" else format_seconds(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and (last == "seconds" or last.endswith("_seconds")):
        return format_seconds(v)
    if isinstance(v, float) and (last.endswith("utilization") or last.endswith("_ratio")):
        return f"{v:.2%}"
    if isinstance(v, (int, float)) and not isinstance(v, bool) and "bytes" in parent and "per_s" not in path:
        return format_bytes(v)  # peak_rss_bytes.parent: the unit is in the parent's name
    if isinstance(v, (int, float)) and not isinstance(v, bool) and last.endswith("_per_s") and "bytes" not in last:
        return f"{plain(v)} {last[: -len('_per_s')]}/s"  # samples_per_s -> "10,180 samples/s"
    if isinstance(v, float) and not last.endswith(("_s", "bytes_per_s")) and "bytes" not in last:
        return plain(v)
    return format_value(last, v)


def plain(v: float) -> str:
    """A number without exponent notation where people read it (CI logs): 10,180 · 3.14 · 0.0012."""
    a = abs(v)
    if a == 0 or a >= 1000:
        return f"{v:,.0f}"
    if a >= 1e-4:
        return f"{v:.4g}"
    return f"{v:.9f}".rstrip("0")


def format_value(name: str, v) -> str:
    """Human form of an output named in SI style (…_bytes, …_s, …_ratio, …_usd…)."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, list):
        return ", ".join(format_value(name, x) for x in v[:8]) + (" …" if len(v) > 8 else "")
    if not isinstance(v, (int, float)):
        return str(v)
    if name.endswith("bytes_per_s"):
        return format_rate(v)
    if "bytes" in name and "per_param" not in name and not name.endswith("_ratio"):
        return format_bytes(v)
    if name.endswith("_s") and not name.endswith("_per_s"):
        return format_duration(v)
    if name.endswith("_ratio") or name.startswith("p_") or name.startswith("utilization"):
        return f"{v:.2%}"
    if "usd" in name:
        return f"${v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:.4g}"


def format_input(kind: str, v) -> str:
    if kind == "points":
        return f"{len(v)} measured points"
    if isinstance(v, list):
        return ", ".join(format_input(kind, x) for x in v) or "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v) if v != "" else "-"
    return {"size": format_bytes, "rate": format_rate, "duration": format_duration,
            "ratio": lambda x: f"{x:.2%}"}.get(kind, lambda x: f"{x:,}" if isinstance(x, int) else f"{x:.4g}")(v)


def check_line(c: dict) -> str:
    """``FAIL: data stall ≤ 5.00% — load.json · load · dataset s3://b/d: stall_ratio = 42.75%``"""
    value = "-" if c.get("value") is None else fmt(c["path"], c["value"])
    subject = c.get("where") or c.get("results") or ""
    return f"{'pass' if c['ok'] else 'FAIL'}: {c['check']} — {subject + ': ' if subject else ''}{c['path']} = {value}"


def prefetch_advice(rec: dict) -> str:
    """A load's prefetch recommendation (``metrics.prefetch_recommendation``) in the one wording the
    terminal, the report and the run's table share: "num_workers 4, prefetch_factor 3 (12 batches in
    flight)"; "" when there is none (zero compute time, or no bound on the P99 yet)."""
    w, q, total = rec.get("workers_recommended"), rec.get("prefetch_factor_recommended"), rec.get("depth_total")
    if not w or not q:   # a one-producer recommendation (older results): its depth alone
        return f"prefetch depth {rec['depth_recommended']}" if rec.get("depth_recommended") else ""
    return f"num_workers {w}, prefetch_factor {q}" + (f" ({total} batches in flight)" if total else "")
