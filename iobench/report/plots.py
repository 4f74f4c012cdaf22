"""Plots for reports, as PNG bytes (matplotlib's Agg backend: no display needed).

Latencies are drawn in milliseconds on a log axis; a CDF built from an HDR summary uses its
percentiles (min, p50, p90, p99, p99.9, max), so tails stay visible.
"""

from __future__ import annotations

import io
import math

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _plt():
    from ..extras import require

    matplotlib = require("matplotlib", "report plots")

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
                         "xtick.labelsize": 9, "ytick.labelsize": 9})   # legible at the page's width

    return plt


def to_png(fig) -> bytes:
    plt = _plt()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


_PCTS = (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999), ("max", 1.0))


def summary_cdf(summary: dict) -> list[tuple[float, float]]:
    """(seconds, fraction ≤) points from an HDR summary's percentiles."""
    pts = [(float(summary[k]), q) for k, q in _PCTS if isinstance(summary.get(k), (int, float))]
    return [(x, q) for x, q in pts if x > 0]


def histogram_cdf(encoded: str, points: int = 60) -> list[tuple[float, float]]:
    """(seconds, fraction ≤) from an encoded HDR histogram (``LatencyHistogram.encode``)."""
    from ..metrics import LatencyHistogram

    return [(x, q) for x, q in LatencyHistogram.decode(encoded).cdf(points) if x > 0]


def latency_cdf(title: str, curves: list[tuple[str, list[tuple[float, float]]]]) -> bytes | None:
    """Latency by percentile, HDR style: the x axis counts "nines" so P99 and P99.9 get room."""
    curves = [(label, pts) for label, pts in curves if len(pts) >= 2]
    if not curves:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    top = 4.0   # where the max is drawn: beyond P99.9
    for i, (label, pts) in enumerate(curves[:8]):
        xs = [top if q >= 1.0 else -math.log10(1.0 - q) for _, q in pts]
        ax.plot(xs, [x * 1e3 for x, _ in pts], marker="o", ms=3, color=_COLORS[i % len(_COLORS)], label=label)
    ax.set_xticks([0, -math.log10(0.5), 1, 2, 3, top])
    ax.set_xticklabels(["min", "p50", "p90", "p99", "p99.9", "max"])
    ys = [x for _, pts in curves for x, _ in pts if x > 0]
    if ys and spans_decades(ys):
        ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    from matplotlib.ticker import NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    lo, hi = ax.get_ylim()
    # Label minor ticks only when the plot spans less than a decade (otherwise they crowd).
    ax.yaxis.set_minor_formatter(plain if hi / max(lo, 1e-12) < 10 else NullFormatter())
    ax.tick_params(axis="y", which="minor", labelsize=8)
    ax.set_ylabel("latency (ms)")
    ax.set_xlabel("percentile")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")
    return to_png(fig)


def cdf(title: str, curves: list[tuple[str, list[tuple[float, float]]]]) -> bytes | None:
    """A true CDF (fraction of requests ≤ latency) from full histograms."""
    # A histogram with a single distinct value has no shape to show.
    curves = [(label, pts) for label, pts in curves if len({x for x, _ in pts}) >= 2]
    if not curves:
        return None
    plt = _plt()
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    for i, (label, pts) in enumerate(curves[:8]):
        ax.plot([x * 1e3 for x, _ in pts], [q for _, q in pts], drawstyle="steps-post",
                color=_COLORS[i % len(_COLORS)], label=label)
    xs = [x for _, pts in curves for x, _ in pts]
    if spans_decades(xs):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction ≤")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=9, loc="lower right")
    return to_png(fig)


def time_series(title: str, x: list[float], ys: dict[str, list[float]], xlabel: str = "t (s)") -> bytes | None:
    names = [n for n, v in ys.items() if any(not math.isnan(y) for y in v)][:4]
    if not names or len(x) < 2:
        return None
    plt = _plt()
    fig, axes = plt.subplots(len(names), 1, figsize=(7.5, 1.0 + 1.5 * len(names)), sharex=True, squeeze=False)
    for i, n in enumerate(names):
        ax = axes[i][0]
        ax.plot(x, ys[n], color=_COLORS[i % len(_COLORS)], lw=1.2)
        ax.set_ylabel(n, fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[-1][0].set_xlabel(xlabel)
    axes[0][0].set_title(title, fontsize=10)
    return to_png(fig)


def bars(title: str, labels: list[str], values: list[float], unit: str = "", scale: float = 1.0) -> bytes | None:
    if not labels:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 0.8 + 0.35 * len(labels)))
    vals = [v / scale for v in values]
    if spans_decades(vals):
        ax.set_xscale("log")  # e.g. probe GB/s beside load MB/s: a linear axis would hide the small bars
    ax.barh(range(len(labels)), vals, color=[_COLORS[i % len(_COLORS)] for i in range(len(labels))])
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.3g}", va="center", fontsize=9)
    return to_png(fig)


def timeline(title: str, rows: list[tuple[str, float, float, str]], marks: dict[str, float] | None = None
             ) -> bytes | None:
    """A Gantt chart: (lane, start s, end s, kind) per bar; ``marks`` draws labelled vertical lines."""
    rows = [r for r in rows if r[2] >= r[1]]
    if not rows:
        return None
    plt = _plt()
    lanes = list(dict.fromkeys(r[0] for r in rows))
    kinds = list(dict.fromkeys(r[3] for r in rows))
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.4 * len(lanes)))
    for lane, start, end, kind in rows:
        c = _COLORS[kinds.index(kind) % len(_COLORS)]
        ax.barh(lanes.index(lane), max(end - start, 1e-6), left=start, color=c, alpha=0.85,
                label=kind if kind not in ax.get_legend_handles_labels()[1] else None)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes, fontsize=9)
    ax.invert_yaxis()
    for label, x in (marks or {}).items():
        ax.axvline(x, color="black", ls="--", lw=1.2)
        ax.text(x, -0.5, f" {label}", fontsize=9, va="top")
    ax.set_xlabel("t (s)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=9, loc="lower right")
    return to_png(fig)


def overhead_curve(title: str, table: list[dict], optimum_s: float | None = None) -> bytes | None:
    """Checkpoint overhead L(τ) = save + redo + recover against the interval."""
    if len(table) < 2:
        return None
    plt = _plt()
    t = [r["interval_s"] for r in table]
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    for i, k in enumerate(("save_ratio", "redo_ratio", "recover_ratio", "total_ratio")):
        ax.plot(t, [r[k] * 100 for r in table], color=_COLORS[i], label=k.replace("_ratio", ""))
    if spans_decades(t):
        ax.set_xscale("log")
    if optimum_s:
        ax.axvline(optimum_s, color="gray", ls="--", lw=1, label="τ*")
    ax.set_xlabel("checkpoint interval (s)")
    ax.set_ylabel("overhead (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    return to_png(fig)


def _axis(label: str) -> tuple[float, str, bool]:
    """(divide by, shown label, human bytes ticks) for an SI axis label."""
    lab = label or ""
    if "bytes_per_s" in lab:
        return 2**20, lab.replace("bytes_per_s", "throughput (MiB/s)"), False
    if lab == "seconds" or lab.endswith("(s)"):
        return 1e-3, lab.replace("(s)", "(ms)") if lab.endswith("(s)") else "ms", False
    return 1.0, lab, "bytes" in lab


def spans_decades(values, decades: float = 2.0) -> bool:
    """True when positive values span at least ``decades`` powers of ten (and there are 3+ of them)."""
    pos = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return len(pos) >= 3 and max(pos) / min(pos) >= 10 ** decades


def _human_bytes(v: float, _=None) -> str:
    # Binary units, as in every table of the report.
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= f:
            return f"{v / f:g} {unit}"
    return f"{v:g} B"


def spec_plot(spec: dict, title_prefix: str = "") -> bytes | None:
    """Draw a plot described in a results file (x/y in SI units, optional log axes)."""
    series = [s for s in spec.get("series", []) if len(s.get("points") or []) >= 1]
    if not series:
        return None
    plt = _plt()
    from matplotlib.ticker import FuncFormatter, NullFormatter

    xs, xl, xbytes = _axis(spec.get("x_label", ""))
    ys, yl, ybytes = _axis(spec.get("y_label", ""))
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    cdf = "fraction" in (spec.get("y_label") or "")
    for i, s in enumerate(series[:10]):
        pts = [(p[0], p[1]) for p in s["points"] if isinstance(p, (list, tuple)) and len(p) == 2
               and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in p)]
        if not pts:
            continue
        ax.plot([x / xs for x, _ in pts], [y / ys for _, y in pts], marker=None if cdf else "o", ms=3,
                drawstyle="steps-post" if cdf else "default", color=_COLORS[i % len(_COLORS)], lw=1.2,
                label=str(s.get("label", ""))[:40])
    all_x = [p[0] / xs for s in series for p in s["points"] if isinstance(p, (list, tuple)) and len(p) == 2
             and isinstance(p[0], (int, float))]
    all_y = [p[1] / ys for s in series for p in s["points"] if isinstance(p, (list, tuple)) and len(p) == 2
             and isinstance(p[1], (int, float))]
    # log axes only where the data span decades: two points on a log axis mislead
    if spec.get("x_log") and spans_decades(all_x):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    if spec.get("y_log") and spans_decades(all_y):
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(_human_bytes if xbytes else (lambda v, _: f"{v:g}")))
    ax.yaxis.set_major_formatter(FuncFormatter(_human_bytes if ybytes else (lambda v, _: f"{v:g}")))
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    ax.set_title(f"{title_prefix}{spec.get('title', '')}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=9, loc="best")
    return to_png(fig)


def stall_over_time(title: str, t_s: list[float], wait_s: list[float], step_s: list[float],
                    steady: tuple[int, int] | None) -> bytes | None:
    """Data stall per window of steps against time, the warm-up and the drain shaded: where the time went."""
    n = min(len(t_s), len(wait_s), len(step_s))
    if n < 4:
        return None
    plt = _plt()
    k = max(1, n // 30)                       # about 30 windows whatever the run's length
    xs, ys = [], []
    for i in range(0, n, k):
        w, st = sum(wait_s[i:i + k]), sum(step_s[i:i + k])
        xs.append(t_s[min(i + k, n) - 1])
        ys.append(100.0 * w / st if st > 0 else 0.0)
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    ax.plot(xs, ys, color=_COLORS[1], lw=1.6, marker="o", ms=3, label=f"stall per {k} steps")
    if steady is not None:
        k0, k1 = steady
        if 0 < k0 < n:
            ax.axvspan(t_s[0], t_s[k0], color="#999999", alpha=0.25, label=f"warm-up (steps 0–{k0 - 1}, not counted)")
        if 0 < k1 < n:
            ax.axvspan(t_s[k1], t_s[n - 1], color="#cccccc", alpha=0.3, label="drain (not counted)")
    ax.set_ylim(0, min(100.0, max(5.0, max(ys) * 1.1)))
    ax.set_xlabel("time since the first step (s)")
    ax.set_ylabel("data stall (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
    return to_png(fig)


def service_distribution(title: str, pts: list[tuple[float, float]], p99_s: float | None,
                         step_s: float | None) -> bytes | None:
    """CDF of per-batch service time with its P99 and the step time marked."""
    if len({x for x, _ in pts}) < 2:
        return None
    plt = _plt()
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    ax.plot([x * 1e3 for x, _ in pts], [q for _, q in pts], drawstyle="steps-post", color=_COLORS[0], lw=1.4,
            label="batches ≤ this time")
    if p99_s:
        ax.axvline(p99_s * 1e3, color=_COLORS[1], ls="--", lw=1.2, label=f"P99 {p99_s * 1e3:.3g} ms")
    if step_s:
        ax.axvline(step_s * 1e3, color="black", ls=":", lw=1.2, label=f"step (compute) {step_s * 1e3:.3g} ms")
    xs = [x * 1e3 for x, _ in pts if x > 0]
    if spans_decades(xs, 1.5):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("batch service time: storage + preparation at a worker (ms)")
    ax.set_ylabel("fraction of batches")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
    return to_png(fig)


def read_amplification(title: str, parts: list[tuple[str, float]]) -> bytes | None:
    """Bytes the loader handed on, asked storage for and the device read (MiB), with the ratios."""
    parts = [(label, v) for label, v in parts if v and v > 0]
    if len(parts) < 2:
        return None
    plt = _plt()
    base = parts[0][1]
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.45 * len(parts)))
    vals = [v / 2**20 for _, v in parts]
    ax.barh(range(len(parts)), vals, color=[_COLORS[i] for i in range(len(parts))])
    ax.set_yticks(range(len(parts)))
    ax.set_yticklabels([label for label, _ in parts])
    ax.invert_yaxis()
    for i, (_, v) in enumerate(parts):
        ax.text(v / 2**20, i, f" {v / 2**20:.4g} MiB ({v / base:.2f}×)", va="center")
    ax.set_xlim(0, max(vals) * 1.35)
    ax.set_xlabel("MiB")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    return to_png(fig)
