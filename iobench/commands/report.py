from __future__ import annotations


def add_threshold_flags(p) -> None:
    p.add_argument("--min-au", type=float, metavar="R", help="fail (exit 1) if accelerator utilization < R "
                                                             "(MLPerf Storage: 0.9)")
    p.add_argument("--max-stall", type=float, metavar="R", help="fail if a data-stall ratio exceeds R")
    p.add_argument("--min-throughput", metavar="RATE", help="fail if throughput is below RATE (e.g. 500MB/s)")
    p.add_argument("--max-wait-p99", metavar="DURATION", help="fail if the P99 batch wait exceeds DURATION")


def threshold_limits(args) -> dict:
    from ..errors import ConfigError
    from ..planner.models import parse_rate
    from ..units import parse_duration

    for flag in ("min_au", "max_stall"):
        v = getattr(args, flag)
        if v is not None and not 0 <= v <= 1:
            raise ConfigError("--" + flag.replace("_", "-"), f"must be between 0 and 1, got {v}", "give e.g. 0.9")
    return {"min_au": args.min_au, "max_stall": args.max_stall,
            "min_throughput": parse_rate(args.min_throughput, "--min-throughput") if args.min_throughput else None,
            "max_wait_p99": parse_duration(args.max_wait_p99, "--max-wait-p99") if args.max_wait_p99 else None}


def register(sub) -> None:
    from .. import guard

    p = sub.add_parser("report", help="render results files as one self-contained HTML page and a Markdown summary")
    p.add_argument("results", nargs="+", metavar="RESULTS.json", help="results files (any iobench command)")
    p.add_argument("-o", "--out", default="reports/latest", metavar="DIR", help="output directory")
    p.add_argument("--title", default="iobench report")
    p.add_argument("--text", action="store_true",
                   help="also print the Markdown summary to the terminal (the report without a browser)")
    p.add_argument("--no-plots", dest="plots", action="store_const", const=False, default=None,
                   help="no plots (the default without matplotlib: pip install 'iobench[report]' adds them)")
    add_threshold_flags(p)
    guard.declare(p, guard.in_file("results", "RESULTS.json"), guard.out_dir("out", "--out", owner="report"))
    p.set_defaults(func=run)


def run(args) -> int:
    from ..report.build import build_report

    rep = build_report(args.results, args.out, args.title, threshold_limits(args), plots=args.plots)
    print(rep.verdict)
    print(f"report: {rep.html}" + ("" if rep.plots else " (no plots: pip install 'iobench[report]' adds them)"))
    print(f"summary: {rep.markdown}")
    from ..report.format import check_line

    for c in rep.checks:
        print(check_line(c))
    if args.text:
        print()
        print(rep.markdown.read_text(), end="")
    return 0 if rep.ok else 1
