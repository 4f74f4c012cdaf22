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
    p.add_argument("--allow-different", action="store_true",
                   help="compare runs whose dataset format, access, cache or step time differ (refused otherwise)")
    add_threshold_flags(p)
    add_json_flag(p)
    guard.declare(p, guard.in_file("a", "A.json"), guard.in_file("b", "B.json"),
                  guard.out_file("markdown", "--markdown", owner="markdown"))
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..errors import ConfigError
    from ..io.atomic import atomic_write_bytes
    from ..report.build import check, load
    from ..report.compare import (HIGHER_IS_BETTER, LOWER_IS_BETTER, change, compare_runs, markdown, ratio_text,
                                  regressions, setup_differences, shown, verdict, with_ci, UNJUDGED_SHOWN)
    from ..report.format import check_line
    from ..results import Results
    from ..schema import CompareMetrics
    from .report import threshold_limits

    if args.max_regression is not None and not 0 <= args.max_regression <= 1:
        raise ConfigError("--max-regression", f"must be between 0 and 1, got {args.max_regression}", "give e.g. 0.1")
    limits = threshold_limits(args)
    # A run.json brings its stage files: two runs are compared file by file.
    docs_a, docs_b = load([args.a]), load([args.b])
    different = setup_differences(docs_a, docs_b)
    if different and not args.allow_different:
        raise ConfigError("compare", "A and B are not the same setup (" + "; ".join(different[:3])
                          + (f"; {len(different) - 3} more" if len(different) > 3 else "") + ")",
                          "compare runs of the same format, access, cache and step time, or add --allow-different")
    rows = compare_runs(docs_a, docs_b)
    checks = check(docs_b, limits)
    if args.max_regression is not None:
        checks += [c | {"where": f"B: {args.b} vs A: {args.a}"} for c in regressions(rows, args.max_regression)]
    gated = args.max_regression is not None or any(v is not None for v in limits.values())
    line = verdict(rows, checks, gated)
    if args.markdown:
        atomic_write_bytes(args.markdown, markdown(rows, Path(args.a).name, Path(args.b).name, checks, gated).encode(),
                           fsync=False)
    # files first: a reader that stops early (| head) must not cost them
    if args.json:
        metrics = CompareMetrics(verdict=line, setup_differences=different, rows=[r.to_dict() for r in rows],
                                 checks=checks, passed=all(c["ok"] for c in checks))
        Results(command="compare", config={"a": args.a, "b": args.b, "max_regression": args.max_regression},
                metrics=metrics.to_dict()).write(args.json)
    con = Console()
    failed = [c for c in checks if not c["ok"]]
    con.print(escape(line), style="bold red" if failed else "bold", highlight=False)
    for d in different:
        con.print(escape(f"WARNING: not the same setup: {d} — differences below may be the setup's, not the storage's"),
                  style="bold red", highlight=False)
    picked = shown(rows, args.all)
    t = Table(title=f"A: {args.a} ({docs_a[0][1].get('command')})  vs  B: {args.b} ({docs_b[0][1].get('command')})")
    for col in ("metric", "A", "B", "change (B − A)", "B / A"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for r in picked:
        better = 1 if r.path.endswith(HIGHER_IS_BETTER) else -1 if r.path.endswith(LOWER_IS_BETTER) else 0
        style = "" if r.diff is None or not better or r.within_noise else (
            "green" if (r.diff > 0) == (better > 0) else "red")
        t.add_row(escape(r.path), escape(with_ci(r.path, r.a, r.ci_a)), escape(with_ci(r.path, r.b, r.ci_b)),
                  change(r) + ("" if r.ci_a is not None and r.ci_b is not None else " (no interval)"),
                  f"[{style}]{ratio_text(r)}[/]" if style else ratio_text(r))
    if picked:
        con.print(t)
    hidden = len(rows) - len(picked)
    if hidden:
        con.print(f"({hidden} metrics not shown: within the runs' intervals, unchanged, or without an interval "
                  f"and within {UNJUDGED_SHOWN:.0%}; --all shows them)", highlight=False)
    for c in failed:
        con.print(escape(check_line(c)), style="red")
    if checks:
        con.print(f"{len(checks) - len(failed)} of {len(checks)} checks passed")
    return 0 if not failed else 1
