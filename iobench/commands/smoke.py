from __future__ import annotations


def register(sub) -> None:
    from .. import guard
    from ..cli import add_endpoint_flag, add_json_flag

    p = sub.add_parser("smoke", help="short end-to-end pass/fail check against an S3-compatible store (for CI)")
    add_endpoint_flag(p)
    p.add_argument("--bucket", required=True, metavar="NAME", help="an existing bucket the credentials can write")
    p.add_argument("--prefix", metavar="KEY", help="where to write (default: iobench-smoke/<time>-<random>); "
                                                   "removed at the end")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML (one test case per check)")
    p.add_argument("--timeout", default="120s", metavar="DURATION", help="deadline per check (120s)")
    p.add_argument("--max-stall", type=float, default=0.5, metavar="R",
                   help="fail if the read's data stall exceeds R (0.5; 1 turns the gate off)")
    p.add_argument("--steps", type=int, default=40, metavar="N", help="steps of the read (40)")
    p.add_argument("--step-time", default="50ms", metavar="DURATION",
                   help="the read's emulated training step (50ms): the gate asks whether the store keeps up with it")
    add_json_flag(p)
    guard.declare(p, guard.out_file("junit", "--junit", owner="junit"))
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console

    from ..io.atomic import atomic_write_bytes
    from ..errors import ConfigError
    from ..results import Results
    from ..smoke import junit_xml, run_smoke

    if args.max_stall is not None and not 0 <= args.max_stall <= 1:
        raise ConfigError("--max-stall", f"must be between 0 and 1, got {args.max_stall}", "give e.g. 0.2")
    con = Console(stderr=True)
    mark = {"passed": "[green]PASS[/]", "failed": "[red]FAIL[/]", "skipped": "[yellow]SKIP[/]"}

    def show(c):
        con.print(f"{mark[c.status]} {c.name} ({c.seconds:.1f} s){': ' + c.message if c.message else ''}",
                  highlight=False)

    from ..units import parse_duration

    timeout_s = parse_duration(args.timeout, "--timeout", allow_zero=False)
    step_s = parse_duration(args.step_time, "--step-time")
    report = run_smoke(args.endpoint_url, args.bucket, args.prefix, timeout_s=timeout_s,
                       max_stall=args.max_stall, on_check=show, steps=args.steps, step_s=step_s)
    if args.junit:
        atomic_write_bytes(args.junit, junit_xml(report), fsync=False)
    if args.json:
        Results(command="smoke", config={"endpoint_url": args.endpoint_url, "bucket": args.bucket,
                                         "prefix": report.prefix, "timeout_s": timeout_s,
                                         "max_stall": args.max_stall, "steps": args.steps,
                                         "step_time": args.step_time},
                metrics=report.metrics()).write(args.json)
    n_ok = sum(c.status == "passed" for c in report.checks)
    print(f"smoke: {'passed' if report.passed else 'FAILED'} ({n_ok}/{len(report.checks)} checks, "
          f"{report.seconds:.1f} s)")
    return 0 if report.passed else 1
