from __future__ import annotations


def register(sub) -> None:
    from .. import guard
    from ..cli import add_json_flag
    from .report import add_threshold_flags

    p = sub.add_parser("compare", help="put two results files side by side with the differences")
    p.add_argument("a", metavar="A.json", help="baseline results")
    p.add_argument("b", metavar="B.json", help="candidate results (thresholds are checked on it)")
    p.add_argument("--all", action="store_true", help="show metrics that did not change too")
    p.add_argument("--max-regression", type=float, metavar="R",
                   help="fail if throughput/utilization drops (or stall rises) by more than R (e.g. 0.1)")
    p.add_argument("--markdown", metavar="PATH", help="also write the comparison as Markdown")
    add_threshold_flags(p)
    add_json_flag(p)
    guard.declare(p, guard.in_file("a", "A.json"), guard.in_file("b", "B.json"),
                  guard.out_file("markdown", "--markdown", owner="markdown"))
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from ..io.atomic import atomic_write_bytes
    from ..errors import ConfigError
    from ..report.build import check
    from rich.markup import escape

    from ..report.format import check_line
    from ..report.compare import (HIGHER_IS_BETTER, LOWER_IS_BETTER, change, compare_runs, markdown, regressions,
                                  with_ci)
    from ..results import Results
    from .report import threshold_limits

    from ..report.build import load

    # A run.json brings its stage files: two runs are compared file by file.
    docs_a, docs_b = load([args.a]), load([args.b])
    a, b = docs_a[0][1], docs_b[0][1]
    if args.max_regression is not None and not 0 <= args.max_regression <= 1:
        raise ConfigError("--max-regression", f"must be between 0 and 1, got {args.max_regression}", "give e.g. 0.1")
    rows = compare_runs(docs_a, docs_b)
    checks = check(docs_b, threshold_limits(args))
    if args.max_regression is not None:
        checks += [c | {"where": f"B: {args.b} vs A: {args.a}"} for c in regressions(rows, args.max_regression)]
    if args.markdown:
        atomic_write_bytes(args.markdown, markdown(rows, Path(args.a).name, Path(args.b).name, checks).encode(),
                           fsync=False)
    # files first: a reader that stops early (| head) must not cost them
    if args.json:
        Results(command="compare", config={"a": args.a, "b": args.b, "max_regression": args.max_regression},
                metrics={"rows": [r.to_dict() for r in rows], "checks": checks,
                         "passed": all(c["ok"] for c in checks)}).write(args.json)
    shown = rows if args.all else [r for r in rows if r.a != r.b and not r.within_noise]
    noise = sum(1 for r in rows if r.a != r.b and r.within_noise)
    t = Table(title=f"A: {args.a} ({a.get('command')})  vs  B: {args.b} ({b.get('command')})")
    for col in ("metric", "A", "B", "change (B − A)", "B / A"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for r in shown:
        ratio = r.ratio
        better = 1 if r.path.endswith(HIGHER_IS_BETTER) else -1 if r.path.endswith(LOWER_IS_BETTER) else 0
        style = "" if ratio is None or not better or r.within_noise or abs(ratio - 1) < 0.05 else (
            "green" if (ratio > 1) == (better > 0) else "red")
        t.add_row(escape(r.path), escape(with_ci(r.path, r.a, r.ci_a)), escape(with_ci(r.path, r.b, r.ci_b)), change(r),
                  "-" if ratio is None else f"[{style}]{ratio:.3f}×[/]" if style else f"{ratio:.3f}×")
    con = Console()
    if shown:
        con.print(t)
    else:
        con.print(f"A: {args.a}  B: {args.b}: no metric changed beyond the runs' noise")
    if len(shown) < len(rows):
        con.print(f"({len(rows) - len(shown)} metrics hidden: unchanged"
                  f"{f', or within the confidence intervals ({noise})' if noise else ''}; --all shows them)")
    failed = [c for c in checks if not c["ok"]]
    for c in failed:
        con.print(escape(check_line(c)), style="red")
    if checks:
        con.print(f"{len(checks) - len(failed)} of {len(checks)} checks passed")
    return 0 if all(c["ok"] for c in checks) else 1
