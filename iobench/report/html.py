"""One self-contained HTML page: every plot embedded as a PNG data URI, no scripts, no links out."""

from __future__ import annotations

from ..schema import STALL_RATIO
import base64
import html
import json

from . import data
from .format import fmt, plain  # noqa: F401  (fmt: other report modules import it from .format)
from .figures import figures
from .headline import Loads, headline_rows, stall_text

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;max-width:1300px;color:#222;
line-height:1.4;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin:1.4em 0 .5em}
h3{margin-top:1.4em}table{border-collapse:collapse;margin:.6em 0;font-size:.88em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:#16794c;font-weight:600}.fail{color:#b3261e;font-weight:600}.warn{background:#fff6d6;padding:.5em;
border-left:4px solid #e0b000}.rec{background:#eef6ff;padding:.5em .8em;border-left:4px solid #1f77b4}
figure{margin:1em 0}figcaption{font-size:.85em;color:#555}img{max-width:100%;height:auto}
details pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em}.muted{color:#777;font-size:.85em}
table{display:block;max-width:100%;overflow-x:auto}td,th{overflow-wrap:anywhere;max-width:40em}
td.num{white-space:nowrap}
.figs{display:flex;gap:1em;flex-wrap:wrap}.figs figure{flex:1 1 600px;margin:.4em 0}
pre{white-space:pre-wrap;overflow-wrap:anywhere}
.verdict{font-size:1.1em;background:#f4f8f4;border-left:5px solid #16794c;padding:.6em 1em}
.verdict.bad{background:#fdf1f0;border-left-color:#b3261e}
details.section{border-top:1px solid #ddd;padding:.3em 0}details.section>summary{cursor:pointer;font-weight:600;
font-size:1.05em;padding:.3em 0}details.section>summary .muted{font-weight:400}
"""


def esc(v) -> str:
    return html.escape(str(v), quote=True)


def _table(headers: list[str], rows: list[list], num_cols: set[int] | None = None) -> str:
    num_cols = num_cols or set()
    out = ["<table><thead><tr>", *(f"<th>{esc(h)}</th>" for h in headers), "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td class=\"num\">{esc(c)}</td>" if i in num_cols else f"<td>{esc(c)}</td>"
                                    for i, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _img(fig) -> str:
    b64 = base64.b64encode(fig.png).decode("ascii")
    return (f'<figure><img alt="{esc(fig.caption)}" src="data:image/png;base64,{b64}">'
            f"<figcaption>{esc(fig.caption)}</figcaption></figure>")


def _hdr_table(items: list[tuple[str, dict]]) -> str:
    from ..units import format_seconds

    rows = []
    for p, s in items:
        cells = []
        for k in data.HDR_KEYS[1:]:
            v = s.get(k)
            cells.append("-" if v is None else (format_seconds(v) if data.hdr_in_seconds(p) else f"{v:.4g}"))
        rows.append([p.replace("metrics.", ""), f"{s.get('count', 0):,}", *cells])
    return _table(["HDR summary", "count", *data.HDR_KEYS[1:]], rows, set(range(1, 9)))


def _plan_html(p: dict) -> str:
    from .format import format_input, format_value
    from ..planner.models import MODELS

    model = MODELS.get(p.get("model", ""))
    inputs = []
    for k, v in (p.get("inputs") or {}).items():
        kind = next((x.kind for x in model.params if x.name == k), "float") if model else "float"
        inputs.append([k, format_input(kind, v), (p.get("inputs_from") or {}).get(k, "")])
    outputs = [[k, format_value(k, v)] for k, v in (p.get("outputs") or {}).items() if k != "overhead_table"]
    return (f"<h3>plan {esc(p.get('model'))}</h3><p class=\"muted\">{esc(p.get('summary', ''))}</p>"
            + (f"<p class=\"rec\"><b>Recommendation:</b> {esc(p['recommendation'])}</p>" if p.get("recommendation")
               else "")
            + "<div style=\"display:flex;gap:2em;flex-wrap:wrap\"><div><b>inputs</b>"
            + _table(["input", "value", "from"], inputs, {1}) + "</div><div><b>outputs</b>"
            + _table(["output", "value"], outputs, {1}) + "</div></div>")


def recommendations(docs: list[tuple[str, dict]], group_size: int = 3) -> list[tuple[str, str, str]]:
    """(results name, what, recommendation) from planner results and any metric named *recommendation;
    commands with many files list theirs in their overview table instead."""
    counts: dict[str, int] = {}
    for _, d in docs:
        counts[str(d.get("command"))] = counts.get(str(d.get("command")), 0) + 1
    out = [(n, f"plan {p.get('model')}", p["recommendation"]) for n, d in docs for p in data.plans(d)
           if p.get("recommendation")]
    for n, d in docs:
        if counts[str(d.get("command"))] > group_size:
            continue
        for path, v in data.walk_all(data.without_plans(d.get("metrics", {}) or {})):
            if path.rsplit(".", 1)[-1].endswith("recommendation") and v:
                out.append((n, path, describe_recommendation(v)))
    return out


def describe_recommendation(v) -> str:
    """One line from a recommendation: a string, or a dict such as the loader's prefetch block."""
    from ..units import format_bytes, format_seconds

    if not isinstance(v, dict):
        return str(v)
    if "depth_recommended" in v:
        from .format import prefetch_advice

        line = prefetch_advice(v) or v.get("note") or "no prefetch depth (compute time is zero)"
        if data.is_number(v.get("p99_batch_service_s", v.get("p99_batch_io_s"))) and data.is_number(v.get("compute_s")):
            line += (f"; one producer needs depth {v.get('depth_min')} (P99 batch time "
                     f"{format_seconds(v.get('p99_batch_service_s', v.get('p99_batch_io_s')))} / compute "
                     f"{format_seconds(v['compute_s'])})")
        if data.is_number(v.get("host_bytes_loader")) and v["host_bytes_loader"]:
            line += f", {format_bytes(v['host_bytes_loader'])} of host memory"
        return line
    return ", ".join(f"{k}={x}" for k, x in v.items() if not isinstance(x, (dict, list)))


def _environment_line(env: dict) -> str:
    """Storage kind, emulation and cache state, declared and measured: what the numbers mean."""
    bits = []
    if isinstance(env.get("storage"), str):
        bits.append(f"storage: {env['storage']}")
    emu = env.get("emulation")
    if isinstance(emu, dict) and emu.get("text"):
        bits.append(f"emulation: {emu['text']}")
    elif isinstance(emu, str) and emu not in ("", "none"):
        bits.append(f"emulation: {emu}")
    cache = env.get("cache")
    if isinstance(cache, dict) and "declared" in cache:
        declared = cache["declared"] if not isinstance(cache["declared"], list) else "/".join(map(str, cache["declared"]))
        line = f"cache declared {declared}"
        if data.is_number(cache.get("measured_residency")):
            line += f", measured residency {cache['measured_residency']:.0%}"
        if "verified" in cache:
            line += f", verified {cache['verified']}"
        bits.append(line)
    return " · ".join(bits)


def _gds_tables(env: dict) -> str:
    """The GPU read-path table: which paths this node has, why not, and what actually ran."""
    out = []
    paths = (env.get("gds") or {}).get("paths")
    if isinstance(paths, dict) and paths:
        rows = [[name, "yes" if (c or {}).get("available") else "no", (c or {}).get("reason") or ""]
                for name, c in paths.items()]
        best = (env.get("gds") or {}).get("best_path")
        out.append("<h3>GPU read paths on this node</h3>" + _table(["path", "available", "reason"], rows)
                   + (f"<p>best available path: <b>{esc(best)}</b></p>" if best else ""))
    eff = env.get("effective_gds_path")
    if isinstance(eff, dict) and eff and all(isinstance(v, dict) for v in eff.values()):
        rows = [[req, v.get("effective", ""), v.get("fallback_reason") or ""] for req, v in eff.items()]
        out.append("<h3>Requested vs effective read path</h3>" + _table(["requested", "effective", "fallback"], rows))
    return "".join(out)


def _doc_section(i: int, name: str, doc: dict, plots: bool = True) -> str:
    metrics = data.without_plans(doc.get("metrics", {}) or {})
    host = doc.get("host", {}) or {}
    parts = [f'<p class="muted">started {esc(doc.get("started_at", "?"))} · finished {esc(doc.get("finished_at", "?"))}'
             f' · iobench {esc(doc.get("iobench_version", "?"))} · host {esc(host.get("hostname", "?"))} '
             f'({esc(host.get("cpu_count", "?"))} CPUs, {esc(host.get("os", "?"))}) · world size '
             f'{esc((doc.get("world") or {}).get("size", 1))}</p>']
    env_line = _environment_line(doc.get("environment") or {})
    if env_line:
        parts.append(f'<p class="muted">{esc(env_line)}</p>')
    for w in doc.get("warnings") or []:
        parts.append(f'<p class="warn">⚠ {esc(w)}</p>')
    for p in data.plans(doc):
        parts.append(_plan_html(p))
    parts.append(_gds_tables(doc.get("environment") or {}))
    if plots:
        try:
            figs = figures(doc, name)
        except Exception as e:  # noqa: BLE001 - one odd results file must not cost the whole report
            figs = []
            parts.append(f'<p class="warn">⚠ plots for this file failed: {esc(type(e).__name__)}: {esc(e)}</p>')
        for fig in figs:
            parts.append(_img(fig))
    else:
        parts.append('<p class="muted">Plots for this file are in the overview of its command above; '
                     "`iobench report` on this file alone draws them all.</p>")
    hdrs = data.hdrs(metrics)
    if hdrs:
        parts.append("<h3>Latency summaries (HDR)</h3>" + _hdr_table(hdrs))
    for path, table in data.tables(metrics):
        if not table:
            continue
        cols = list(dict.fromkeys(k for r in table for k in r))
        parts.append(f"<h3>{esc(path.replace('metrics.', ''))}</h3>"
                     + _table(cols, [[fmt(c, r.get(c, "")) if data.is_number(r.get(c)) else r.get(c, "")
                                      for c in cols] for r in table[:200]]))
    scal = [(p, v) for p, v in data.scalars(metrics) if "recommendation" not in p]
    if scal:
        parts.append("<h3>Metrics</h3>" + _table(["metric", "value"], [[p, fmt(p, v)] for p, v in scal], {1}))
    env = doc.get("environment") or {}
    parts.append("<details><summary>config and environment</summary><pre>"
                 + esc(json.dumps({"config": doc.get("config", {}), "environment": env}, indent=1, default=str))
                 + "</pre></details>")
    return "\n".join(parts)


def plotted(docs: list[tuple[str, dict]], per_group: int = 3) -> set[int]:
    """Which files get their own plots when many share a command: the first, the worst stall, the slowest."""
    groups: dict[str, list[int]] = {}
    for i, (_, d) in enumerate(docs):
        groups.setdefault(str(d.get("command")), []).append(i)
    keep: set[int] = set()
    for idx in groups.values():
        if len(idx) <= per_group:
            keep.update(idx)
            continue
        keep.add(idx[0])

        def metric(i, suffix):
            found = data.find(docs[i][1].get("metrics", {}) or {}, suffix)
            return found[0][1] if found else None

        stalls = [(metric(i, STALL_RATIO), i) for i in idx if metric(i, STALL_RATIO) is not None]
        rates = [(metric(i, "throughput.bytes_per_s"), i) for i in idx if metric(i, "throughput.bytes_per_s")]
        if stalls:
            keep.add(max(stalls)[1])
        if rates:
            keep.add(min(rates)[1])
    return keep


def group_tables(docs: list[tuple[str, dict]], per_group: int = 3) -> list[tuple[str, list, list[str], list[list]]]:
    """(command, members, headers, rows) for each command with more than ``per_group`` results files."""
    from .headline import HEADLINE

    groups: dict[str, list[tuple[str, dict]]] = {}
    for name, d in docs:
        groups.setdefault(str(d.get("command")), []).append((name, d))
    out = []
    for cmd, members in groups.items():
        if len(members) <= per_group:
            continue
        cols = [(suffix, label) for suffix, label in HEADLINE
                if any(data.find(d.get("metrics", {}) or {}, suffix) for _, d in members)]
        rows = []
        for name, d in members:
            m = d.get("metrics", {}) or {}
            row = [name]
            for suffix, _ in cols:
                found = data.find(m, suffix)
                row.append(fmt(found[0][0], found[0][1]) if found else "-")
            recs = [describe_recommendation(v) for p, v in data.walk_all(m) if p.endswith("recommendation") and v]
            row.append(recs[0] if recs else "")
            rows.append(row)
        out.append((cmd, members, ["results", *[label for _, label in cols], "recommendation"], rows))
    return out


def _group_overview(docs: list[tuple[str, dict]], plots: bool = True) -> str:
    from .figures import group_figures

    parts = []
    for cmd, members, headers, rows in group_tables(docs):
        parts.append(f"<h2>{esc(cmd)}: {len(members)} results files</h2>"
                     + _table(headers, rows, set(range(1, len(headers) - 1))))
        if plots:
            parts.extend(_img(f) for f in group_figures(cmd, members))
    return "\n".join(parts)


def load_advice(m: dict) -> str:
    """A load's workers / prefetch advice, in the words the terminal uses (``format.prefetch_advice``)."""
    from .format import prefetch_advice

    return prefetch_advice(m.get("prefetch_recommendation") or {})


def _short_dataset(url: str) -> str:
    """"s3 · raw-tokens" for s3://bucket/run/datasets/raw-tokens: where, and the dataset's own name."""
    if not url:
        return ""
    scheme, sep, rest = url.partition("://")
    where = scheme if sep else "local"
    name = (rest if sep else url).rstrip("/").rsplit("/", 1)[-1]
    return f"{where} · {name}"[:48]


def _advice_cell(rec: dict) -> str:
    """The recommendation in the loads table: "18 × 3 (54 in flight)" under "num_workers × prefetch_factor"."""
    w, q, total = rec.get("workers_recommended"), rec.get("prefetch_factor_recommended"), rec.get("depth_total")
    if w and q:
        return f"{w} × {q}" + (f" ({total} in flight)" if total else "")
    return f"depth {rec['depth_recommended']}" if rec.get("depth_recommended") else "-"


LOAD_COLUMNS = ["results", "dataset", "data stall", "storage delivered", "P99 batch wait",
                "num_workers × prefetch_factor", "validated"]


def load_rows(docs: list[tuple[str, dict]]) -> list[list[str]]:
    """The headline table: one row per load, worst stall first (``headline.Loads``'s order)."""
    from ..units import format_rate, format_seconds

    rows = []
    for name, d in Loads.of(docs).docs:
        m = d.get("metrics") or {}
        rec = m.get("prefetch_recommendation") or {}
        wait = (m.get("batch_wait_s") or {}).get("p99")
        bps = (m.get("throughput") or {}).get("bytes_per_s")
        val = rec.get("validation")
        validated = (f"{val['stall_ratio_at_depth']:.1%} at depth {val['depth']}, "
                     f"{val['stall_ratio_at_depth_1']:.1%} at 1" if isinstance(val, dict) and
                     data.is_number(val.get("stall_ratio_at_depth")) else "no")
        dataset = _short_dataset(str((d.get("config") or {}).get("dataset") or ""))
        rows.append([name, dataset, stall_text(m), format_rate(bps) if data.is_number(bps) else "-",
                     format_seconds(wait) if data.is_number(wait) else "-", _advice_cell(rec), validated])
    if rows and all(r[-1] == "no" for r in rows):      # no load ran --validate: no column of "no"
        rows = [r[:-1] for r in rows]
    return rows


def _loads_table(rows: list[list[str]]) -> str:
    return _table(LOAD_COLUMNS[:len(rows[0])], rows, {2, 3, 4}) if rows else ""


def _where_time_goes(docs: list[tuple[str, dict]]) -> str:
    """The most stalled load's stall over time and service times, side by side: the first plots to read."""
    from ..schema import LoadMetrics, is_load_metrics
    from .figures import load_figures

    loads = [(n, d) for n, d in Loads.of(docs).docs if is_load_metrics(d.get("metrics"))]
    if not loads:
        return ""
    name, doc = loads[0]
    figs = [f for f in load_figures(name, LoadMetrics.from_dict(doc["metrics"])) if f.kind != "throughput"][:2]
    if not figs:
        return ""
    return (f"<h2>Where the time goes: {esc(name)}</h2><div class=\"figs\">" + "".join(_img(f) for f in figs)
            + "</div>")


def verdict(docs: list[tuple[str, dict]], checks: list[dict] | None) -> tuple[str, bool]:
    """(one paragraph, bad?) — what a reader acts on, before any table."""
    from ..units import format_rate

    bits, bad = [], False
    if checks:
        failed = [c for c in checks if not c["ok"]]
        bad = bool(failed)
        bits.append(f"{len(failed)} of {len(checks)} checks failed." if failed else f"All {len(checks)} checks passed.")
    loads = Loads.of(docs)
    if loads.docs:
        n, worst = loads.worst
        line = loads.stall_line()
        bps = (worst.get("throughput") or {}).get("bytes_per_s")
        if len(loads.docs) == 1:
            bits.append(line[0].upper() + line[1:] + (f", storage delivered {format_rate(bps)}"
                                                      if data.is_number(bps) else "") + ".")
        else:
            bits.append(f"{len(loads.docs)} loads: {line}.")
        bad = bad or worst[STALL_RATIO] > 0.05
        advice = load_advice(worst)
        if worst[STALL_RATIO] > 0.05 and advice:
            # the most stalled load's own advice is what to act on first; its caveat (e.g. more
            # workers than cores) comes with it
            note = (worst.get("prefetch_recommendation") or {}).get("note")
            note = note.split(":")[0] if note else note    # its first clause: the loads table has the rest
            bits.append(f"To feed {'it' if len(loads.docs) == 1 else n}: {advice}" + (f"; {note}" if note else "")
                        + ".")
    recs = recommendations(docs)
    if recs:
        bits.append(f"First recommendation: {recs[0][2]} ({recs[0][0]}).")
    if not bits:
        bits.append(f"{len(docs)} results file(s); the headline numbers are below.")
    return " ".join(bits), bad


def render(docs: list[tuple[str, dict]], title: str = "iobench report", checks: list[dict] | None = None,
           generated_at: str = "", plots: bool = True) -> str:
    """Verdict, headline table, checks and contents first; every long section collapsed below."""
    text, bad = verdict(docs, checks)
    body = [f"<h1>{esc(title)}</h1>",
            f'<p class="muted">generated {esc(generated_at)} from {len(docs)} results file(s)</p>',
            f'<p class="verdict{" bad" if bad else ""}">{esc(text)}</p>']
    loads = load_rows(docs)
    if loads:
        shown = loads[:6]
        body.append("<h2>Loads</h2>" + _loads_table(shown))
        if len(loads) > len(shown):
            body.append(f"<details><summary>{len(loads) - len(shown)} more loads</summary>"
                        + _loads_table(loads[len(shown):]) + "</details>")
        if plots:
            body.append(_where_time_goes(docs))
    # loads are in their own table above: the headline keeps the other commands' numbers
    head = [r for r in headline_rows(docs) if not (loads and (any(r[0] == lr[0] for lr in loads)
                                                               or r[0].startswith("load (")))]
    if head:
        body.append("<h2>Other commands</h2>" + _table(["results", "metric", "value"], head[:6], {2}))
    if checks:
        rows = [[c["check"], c.get("where") or c.get("results") or "", c["path"],
                 "-" if c["value"] is None else fmt(c["path"], c["value"]), "pass" if c["ok"] else "FAIL"]
                for c in sorted(checks, key=lambda c: c["ok"])]
        table = _table(["check", "results", "metric", "value", "result"], rows, {3}).replace(
            "<td>FAIL</td>", '<td class="fail">FAIL</td>').replace("<td>pass</td>", '<td class="pass">pass</td>')
        body.append(f"<h2>Checks</h2>{table}" if len(rows) <= 8 else
                    f"<h2>Checks</h2><details><summary>{sum(not c['ok'] for c in checks)} failed, "
                    f"{sum(c['ok'] for c in checks)} passed (failures first)</summary>{table}</details>")
    recs = recommendations(docs)
    if recs:
        items = "".join(f"<li><b>{esc(what)}</b> ({esc(n)}): {esc(r)}</li>" for n, what, r in recs)
        body.append(f"<h2>Recommendations</h2><ul>{items}</ul>" if len(recs) <= 5 else
                    f"<h2>Recommendations</h2><details><summary>{len(recs)} recommendations</summary>"
                    f"<ul>{items}</ul></details>")
    if not plots:
        body.append('<p class="warn">No plots: matplotlib is not installed (pip install \'iobench[report]\'); '
                    "the tables below hold every number.</p>")
    # the detail: one collapsed block, so the page above stays a screen or two however many files there are
    overview = _group_overview(docs, plots)
    keep = plotted(docs)
    sections = "".join(f'<details class="section" id="r{i}"><summary>{esc(doc.get("command", "?"))}: {esc(name)}'
                       f'</summary>{_doc_section(i, name, doc, plots=plots and i in keep)}</details>'
                       for i, (name, doc) in enumerate(docs))
    body.append(f'<h2>Detail</h2><details class="section"{" open" if len(docs) <= 2 else ""}><summary>{len(docs)} '
                f'results file(s), each in its own section{" (and an overview by command)" if overview else ""}'
                f'</summary>'
                + (f'<details class="section"><summary>Overview by command</summary>{overview}</details>'
                   if overview else "") + sections + "</details>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"generator\" content=\"iobench\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{esc(title)}</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
