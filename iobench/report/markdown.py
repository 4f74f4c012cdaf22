"""The Markdown summary beside the HTML report: headline, checks, recommendations, HDR tables."""

from __future__ import annotations

from . import data
from .headline import headline_rows


def _md_table(headers: list[str], rows: list[list]) -> str:
    def cell(c) -> str:
        return str(c).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render(docs: list[tuple[str, dict]], title: str = "iobench report", checks: list[dict] | None = None,
           generated_at: str = "", html_name: str = "report.html") -> str:
    from ..units import format_seconds
    from .format import fmt
    from .html import group_tables, plotted, recommendations, verdict

    out = [f"# {title}", "", f"**{verdict(docs, checks)[0]}**", "",
           f"Generated {generated_at} from {len(docs)} results file(s); plots are in [{html_name}]({html_name}).", ""]
    head = headline_rows(docs)
    if head:
        out += ["## Headline", "", _md_table(["results", "metric", "value"], head), ""]
    if checks:
        out += ["## Checks", "", _md_table(["check", "results", "metric", "value", "result"],
                                           [[c["check"], c.get("where") or c.get("results") or "", c["path"],
                                             "-" if c["value"] is None else fmt(c["path"], c["value"]),
                                             "pass" if c["ok"] else "**FAIL**"] for c in checks]), ""]
    recs = recommendations(docs)
    if recs:
        out += ["## Recommendations", ""] + [f"- **{what}** ({n}): {r}" for n, what, r in recs] + [""]
    for cmd, members, headers, rows in group_tables(docs):
        out += [f"## {cmd}: {len(members)} results files", "", _md_table(headers, rows), "",
                "Details below only for the first, the most stalled and the slowest of these; "
                "`iobench report FILE` renders any one in full.", ""]
    keep = plotted(docs)
    grouped = {id(d) for _, members, _, _ in group_tables(docs) for _, d in members}
    for i, (name, doc) in enumerate(docs):
        if id(doc) in grouped and i not in keep:
            continue
        metrics = data.without_plans(doc.get("metrics", {}) or {})
        out += [f"## {doc.get('command', '?')}: {name}", ""]
        for w in doc.get("warnings") or []:
            out.append(f"> warning: {w}")
        for p in data.plans(doc):
            out += [f"**plan {p['model']}** — {p.get('recommendation', '')}", "",
                    _md_table(["input", "value", "from"], [[k, v, (p.get("inputs_from") or {}).get(k, "")]
                                                           for k, v in (p.get("inputs") or {}).items()]), "",
                    _md_table(["output", "value"], [[k, fmt(k, v)] for k, v in (p.get("outputs") or {}).items()
                                                    if k != "overhead_table"]), ""]
        hdrs = data.hdrs(metrics)
        if hdrs:
            rows = [[p, s.get("count", 0)] + ["-" if s.get(k) is None else
                                              (format_seconds(s[k]) if data.hdr_in_seconds(p) else f"{s[k]:.4g}")
                                              for k in ("mean", "p50", "p99", "max")] for p, s in hdrs]
            out += ["", _md_table(["HDR summary", "count", "mean", "p50", "p99", "max"], rows), ""]
        for path, table in data.tables(metrics):
            if table:
                cols = list(dict.fromkeys(k for r in table for k in r))[:12]
                out += ["", f"**{path or 'table'}**", "",
                        _md_table(cols, [[fmt(c, r[c]) if data.is_number(r.get(c)) else r.get(c, "") for c in cols]
                                         for r in table[:30]]), ""]
        scal = [(p, v) for p, v in data.scalars(metrics)
                if data.is_number(v) and "recommendation" not in p]
        if scal:
            out += ["", _md_table(["metric", "value"], [[p, fmt(p, v)] for p, v in scal[:60]]), ""]
    return "\n".join(out) + "\n"
