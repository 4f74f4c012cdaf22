"""`iobench run` stage "report": plans from the run's measurements, then the HTML page and Markdown summary.

run.json is written after the stages, so the report is built from the stage results files
(``ctx.results_files``) plus the summary rows gathered so far.
"""

from __future__ import annotations

from pathlib import Path

TABLE_WIDTH = 120    # the run's table fits a 120-column terminal (a wider one still gets 120)


class Row(tuple):
    """(stage, what, value), a tuple so that readers unpack three, and the caveats it carries."""

    notes: tuple[str, ...]

    def __new__(cls, stage: str, what: str, value: str, notes: tuple[str, ...] = ()) -> Row:
        r = super().__new__(cls, (stage, what, value))
        r.notes = tuple(notes)
        return r


def footnoted(rows: list) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Rows with "[n]" after each value that carries caveat n, and the caveats, each once, in order."""
    notes: list[str] = []
    out = []
    for r in rows:
        marks = []
        for n in getattr(r, "notes", ()):
            if n not in notes:
                notes.append(n)
            marks.append(str(notes.index(n) + 1))
        out.append((r[0], r[1], r[2] + (f" [{','.join(marks)}]" if marks else "")))
    return out, notes


def print_summary(console, verdict: str, rows: list) -> None:
    """The verdict, the run's table (at most TABLE_WIDTH columns) and its footnotes."""
    from rich.table import Table

    width = min(TABLE_WIDTH, console.size.width if console.is_terminal else TABLE_WIDTH)
    console.width = width
    if verdict:
        console.print(verdict, markup=False, highlight=False, soft_wrap=False)
    lines, notes = footnoted(rows)
    table = Table(title="iobench run — summary", width=width)
    table.add_column("stage", no_wrap=True)
    table.add_column("what", ratio=2)
    table.add_column("value", ratio=5)
    for r in lines:
        table.add_row(*r)
    console.print(table)
    for i, n in enumerate(notes, 1):
        console.print(f"[{i}] {n}", markup=False, highlight=False)

# Planner inputs the suite cannot measure; a cluster config may override them under `planner:`.
DEFAULT_ASSUMPTIONS = {
    "job_mtbf": "7.9h",          # the domain models' 1,024-accelerator job (per-accelerator MTBF ≈ 337 days)
    "accelerators": 8,           # one node, for the bandwidth plan
}


def _plans(docs: list[tuple[str, dict]], assumptions: dict) -> list[tuple[str, dict]]:
    """(file stem, plan) for each model the measured results can feed."""
    from ..errors import ConfigError
    from ..planner.models import lookup, plan

    out = []
    loads = [(lookup(d, "metrics.stall_ratio") or 0.0, n, d) for n, d in docs
             if d.get("command") == "load" and lookup(d, "metrics.batch_bytes") and lookup(d, "metrics.compute_s.mean")]
    try:
        for name, doc in docs:
            if doc.get("command") == "ckpt" and lookup(doc, "metrics.checkpoint.blocking_s.mean"):
                out.append((f"interval-{Path(name).stem}", plan("interval", {"job_mtbf": assumptions["job_mtbf"]},
                                                                doc)))
        if loads:
            # The load that stalled most is the one whose bandwidth need matters.
            _, name, doc = max(loads, key=lambda x: x[0])
            out.append((f"bandwidth-{Path(name).stem}", plan("bandwidth", {"accelerators": assumptions["accelerators"]},
                                                             doc)))
    except ConfigError:
        pass   # a model whose inputs this run did not measure is simply not planned
    return out


def suite_stage(ctx) -> dict:
    from ..errors import ConfigError
    from ..results import Results, read_results
    from iobench.report.build import build_report

    docs, seen = [], set()
    for f in map(Path, ctx.results_files):
        if not f.exists() or f.resolve() in seen:
            continue
        seen.add(f.resolve())
        try:
            docs.append((_short(ctx.out_dir, f), read_results(f)))
        except ConfigError as e:
            ctx.warnings.append(f"report: skipped {f}: {e}")
    assumptions = {**DEFAULT_ASSUMPTIONS, **((ctx.config or {}).get("planner") or {})}
    plan_docs = []
    plan_dir = ctx.out_dir / "plans"
    plans = _plans(docs, assumptions)
    for stem, p in plans:
        res = Results(command="plan", config={"model": p["model"], "assumptions": assumptions},
                      metrics={"plan": p})
        path = res.write(plan_dir / f"{stem}.json")
        ctx.results_files.append(path)
        plan_docs.append((path.name, res.to_dict()))
        ctx.row("plan", p["model"], p["recommendation"])
    stage_metrics = dict(ctx.state.stage_metrics)
    # the run so far as a results document of its own (started at the run's start, as run.json will be)
    summary = Results(command="run", config=dict(ctx.config or {}), metrics={"summary": [
        {"stage": s, "what": w, "value": v} for s, w, v in ctx.rows], "stages": stage_metrics},
        warnings=list(ctx.warnings), environment={"object_tier": ctx.s3_url, "endpoint_url": ctx.endpoint_url,
                                                  "quick": ctx.quick}).to_dict()
    rep = build_report([("summary", summary), *plan_docs, *docs], ctx.out_dir, title="iobench run")
    ctx.verdict = rep.verdict   # run_suite prints it before its summary table
    ctx.row("report", "HTML", str(rep.html))
    ctx.row("report", "Markdown", str(rep.markdown))
    return {"verdict": rep.verdict, "html": str(rep.html), "markdown": str(rep.markdown), "results_files": len(docs),
            "plans": [p["model"] for _, p in plans]}


def _short(root: Path, p: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)
