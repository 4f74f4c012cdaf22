"""Which plots a results file gets: generic ones for every shape, specific ones for known keys."""

from __future__ import annotations

from ..schema import STALL_RATIO
from dataclasses import dataclass

from . import data, plots
from ..schema import LoadMetrics, is_load_metrics

_START_END = (("start_s", "end_s"), ("t_start", "t_end"), ("start", "end"), ("t0_s", "t1_s"), ("t0", "t1"),
              ("begin_s", "end_s"))
_LANE = ("checkpoint", "step", "name", "id", "rank", "phase")
_KIND = ("phase", "kind", "event", "stage", "name")


@dataclass(frozen=True)
class Figure:
    caption: str
    png: bytes
    kind: str          # latency-cdf | series | throughput | timeline | overhead


_WORDS = {"bytes_per_s": "throughput", "samples_per_s": "samples per second", STALL_RATIO: "data stall",
          "batch_wait_s": "batch wait", "batch_io_s": "batch I/O time", "read_latency_s": "read latency",
          "accelerator_utilization": "accelerator utilization", "commit_latency_s": "commit latency",
          "blocking_s": "blocking pause", "points": "", "file": "", "metrics": ""}


def _label(path: str) -> str:
    """A metric path in words for plot titles: tiers.nvme.file.points[0].bytes_per_s -> "tiers nvme throughput"."""
    import re

    words = []
    for part in path.split("."):
        part = re.sub(r"\[\d+\]$", "", part)
        w = _WORDS.get(part, part.replace("_", " "))
        if w and w not in words:
            words.append(w)
    return " ".join(words) or "value"


def timeline_rows(table: list[dict]) -> list[tuple[str, float, float, str]] | None:
    """Gantt rows from records that have a start and an end time."""
    keys = next(((a, b) for a, b in _START_END if all(data.is_number(r.get(a)) and data.is_number(r.get(b))
                                                      for r in table)), None)
    if keys is None:
        return None
    a, b = keys
    lane_k = next((k for k in _LANE if all(k in r for r in table)), None)
    kind_k = next((k for k in _KIND if k != lane_k and all(k in r for r in table)), None)
    return [(str(r[lane_k]) if lane_k else str(i), float(r[a]), float(r[b]), str(r[kind_k]) if kind_k else "busy")
            for i, r in enumerate(table)]


def checkpoint_rows(records: list[dict]) -> list[tuple[str, float, float, str]] | None:
    """Gantt rows from `iobench ckpt` save records (t_call, t_snapshot_done, t_local_done, t_durable)."""
    if not records or not all(isinstance(r, dict) and data.is_number(r.get("t_call")) for r in records):
        return None
    rows = []
    for r in records:
        lane = f"step {r.get('step', '?')} ({r.get('status', '')})"
        t0, snap = r["t_call"], r.get("t_snapshot_done")
        local, durable = r.get("t_local_done"), r.get("t_durable")
        if data.is_number(snap):
            rows.append((lane, t0, snap, "blocking (snapshot)"))
        start = snap if data.is_number(snap) else t0
        if data.is_number(local):
            rows.append((lane, start, local, "local write"))
            start = local
        if data.is_number(durable):
            rows.append((lane, start, durable, "commit to durable"))
    return rows or None


def gds_bars(cells: list[dict]) -> tuple[list[str], list[float]] | None:
    """Throughput per GDS path cell (`iobench gds bench` metrics.cells)."""
    labels, values = [], []
    for c in cells:
        if not isinstance(c, dict) or "path_effective" not in c:
            return None
        bps = (c.get("throughput") or {}).get("bytes_per_s")
        if not data.is_number(bps):
            continue
        size = c.get("io_size_bytes")
        cache = (c.get("cache") or {}).get("declared", "")
        labels.append(f"{c['path_effective']} {size // 1024 if isinstance(size, int) else size} KiB ×{c.get('threads')}"
                      f" {cache}")
        values.append(bps)
    return (labels, values) if labels else None


def load_figures(name: str, m: LoadMetrics) -> list[Figure]:
    """Where a load's time went: stall over time (warm-up marked), service times with the P99, bytes read."""
    out: list[Figure] = []
    s = m.series
    png = plots.stall_over_time(f"{name}: data stall over time", s.get("t_s") or [], s.get("wait_s") or [],
                                s.get("step_s") or [], (m.steady_window["from_step"], m.steady_window["to_step"]))
    if png:
        out.append(Figure(f"data stall over time (headline {m.stall_ratio:.2%}, over the unshaded steady window)",
                          png, "series"))
    if m.batch_service_hist:
        from ..metrics import LatencyHistogram

        compute = m.compute_s.get("mean")
        # the P99 marked is the plotted histogram's own (results of older suites pooled one and not the other)
        p99 = LatencyHistogram.decode(m.batch_service_hist).summary()["p99"]
        png = plots.service_distribution(f"{name}: batch service time", plots.histogram_cdf(m.batch_service_hist),
                                         p99, compute)
        if png:
            out.append(Figure("batch service time: a batch slower than the step time × prefetch depth stalls the "
                              "step", png, "latency-cdf"))
    dev = m.device_io or {}
    delivered = dev.get("delivered_bytes") or (m.batch_bytes * m.steps if m.batch_bytes else None)
    parts = [("handed to the step", delivered), ("asked of storage", m.bytes_read),
             ("read by the device", dev.get("device_bytes_read"))]
    png = plots.read_amplification(f"{name}: read amplification", [(k, float(v)) for k, v in parts if v])
    if png:
        out.append(Figure("read amplification: bytes read per byte delivered", png, "throughput"))
    return out


def figures(doc: dict, name: str = "") -> list[Figure]:
    metrics = doc.get("metrics", {}) or {}
    cmd = doc.get("command", "?")
    if is_load_metrics(metrics):
        # a load's own plots; its other numbers are in its tables
        return load_figures(name or cmd, LoadMetrics.from_dict(metrics))
    out: list[Figure] = []

    # HDR summaries are in seconds (results schema), so one plot holds them all, eight per plot.
    curves = [(_label(p), plots.summary_cdf(v)) for p, v in data.hdrs(metrics) if v.get("count")]
    curves = [c for c in curves if len(c[1]) >= 2]
    for i in range(0, len(curves), 8):
        part = curves[i:i + 8]
        png = plots.latency_cdf(f"{cmd}: latency by percentile (HDR)", part)
        if png:
            names = ", ".join(label for label, _ in part)
            out.append(Figure(f"latency by percentile: {names}", png, "latency-cdf"))

    # Encoded HDR histograms (e.g. the loader's batch_io_hist) give a full-resolution CDF.
    hists = []
    for path, v in data.walk(metrics):
        if isinstance(v, str) and path.rsplit(".", 1)[-1].endswith(("_hist", "_hdr")) and len(v) > 16:
            try:
                hists.append((_label(path), plots.histogram_cdf(v)))
            except Exception:  # noqa: BLE001 - not an HDR encoding after all: no plot
                continue
    if hists:
        png = plots.cdf(f"{cmd}: latency CDF (full HDR histogram)", hists)
        if png:
            out.append(Figure("latency CDF: " + ", ".join(label for label, _ in hists[:8]), png, "latency-cdf"))

    for path, spec in data.plot_specs(metrics)[:12]:
        png = plots.spec_plot(spec, f"{cmd}: ")
        if png:
            out.append(Figure(f"{_label(path)}: {spec.get('title', '')}", png, "spec"))

    for path, (x, ys, xlabel) in data.series(metrics)[:6]:
        png = plots.time_series(f"{cmd}: {_label(path)} over time", x, ys, xlabel)
        if png:
            out.append(Figure(f"{_label(path)} over time", png, "series"))

    rates = [(p, v) for p, v in data.flat_numbers(metrics).items()
             if p.endswith("bytes_per_s") and v > 0 and ".cells[" not in p and "per_worker[" not in p]
    if len(rates) >= 2:
        png = plots.bars(f"{cmd}: throughput", [_label(p) for p, _ in rates[:24]], [v for _, v in rates[:24]],
                         "throughput (MiB/s)", 2**20)
        if png:
            out.append(Figure("throughput by tier / path", png, "throughput"))

    stage_times = [(p, v) for p, v in data.flat_numbers(metrics).items() if p.endswith(".stage_s")]
    if len(stage_times) >= 2:
        png = plots.bars(f"{cmd}: time per suite stage", [p[: -len(".stage_s")].rsplit(".", 1)[-1]
                                                          for p, _ in stage_times], [v for _, v in stage_times], "s")
        if png:
            out.append(Figure("time per suite stage", png, "throughput"))

    for path, v in data.walk(metrics):
        if isinstance(v, list) and path.endswith("timeline"):
            rows = checkpoint_rows(v)
            if rows:
                png = plots.timeline(f"{cmd}: checkpoint saves", rows[:90])
                if png:
                    out.append(Figure("checkpoint saves: snapshot and commit phases", png, "timeline"))
        if isinstance(v, list) and path.endswith("cells"):
            bars = gds_bars(v)
            if bars:
                png = plots.bars(f"{cmd}: throughput by read path", bars[0][:32], bars[1][:32],
                                   "throughput (MiB/s)", 2**20)
                if png:
                    out.append(Figure("GDS read paths: throughput", png, "throughput"))

    for path, table in data.tables(metrics):
        rows = timeline_rows(table)
        if rows:
            png = plots.timeline(f"{cmd}: {_label(path)}", rows[:60])
            if png:
                out.append(Figure(f"{_label(path)}: timeline", png, "timeline"))

    for p in data.plans(doc):
        o = p.get("outputs", {})
        if o.get("overhead_table"):
            table = o["overhead_table"]
            tau, lam, inp = o.get("optimal_interval_s"), o.get("failure_rate_per_s"), p.get("inputs", {})
            if tau and lam and data.is_number(inp.get("cost")) and data.is_number(inp.get("recovery_time")):
                from ..planner.checkpoint import checkpoint_overhead

                grid = [tau / 8 * (64 ** (i / 60)) for i in range(61)]   # τ*/8 … 8τ*, log-spaced
                table = [{"interval_s": t, "save_ratio": x.save, "redo_ratio": x.redo, "recover_ratio": x.recover,
                          "total_ratio": x.total}
                         for t, x in ((t, checkpoint_overhead(inp["cost"], lam, inp["recovery_time"], t)) for t in grid)]
            png = plots.overhead_curve("checkpoint overhead L(τ)", table, tau)
            if png:
                out.append(Figure(f"plan {p['model']}: overhead by interval", png, "overhead"))
        if o.get("snapshots_s") and o.get("commits_s"):
            copy = p["inputs"].get("copy_time", 0.0) or 0.0
            write = o.get("write_s", 0.0)
            rows = []
            for i, (s, c) in enumerate(zip(o["snapshots_s"], o["commits_s"])):
                rows.append((f"checkpoint {i + 1}", s, s + copy, "snapshot (blocking)"))
                rows.append((f"checkpoint {i + 1}", c - write, c, "commit"))
            fail = p["inputs"].get("fail_at")
            png = plots.timeline("async commit: snapshots, commits and a failure", rows,
                                 {"failure": fail} if data.is_number(fail) else None)
            if png:
                out.append(Figure(f"plan {p['model']}: commit timeline", png, "timeline"))
    return out


def group_figures(command: str, docs: list[tuple[str, dict]]) -> list[Figure]:
    """Overview plots for many results of one command: one bar per file, one overlaid latency plot."""
    out: list[Figure] = []
    for suffix, unit, scale, words in (("throughput.bytes_per_s", "throughput (MiB/s)", 2**20, "throughput"),
                                       (STALL_RATIO, "data stall (%)", 0.01, "data stall"),
                                       ("batch_wait_s.p99", "P99 batch wait (ms)", 1e-3, "P99 batch wait")):
        labels, values = [], []
        for name, d in docs:
            found = data.find(d.get("metrics", {}) or {}, suffix)
            if found and found[0][1] is not None:
                labels.append(name)
                values.append(found[0][1])
        if len(labels) >= 2:
            png = plots.bars(f"{command}: {words} per results file", labels[:40], values[:40], unit, scale)
            if png:
                out.append(Figure(f"{command}: {words} per results file", png, "throughput"))
    return out
