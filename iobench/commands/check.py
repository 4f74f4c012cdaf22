"""`iobench check TARGET --step-time 180ms --batch-size 256 --workers 8`: will this storage stall training?"""

from __future__ import annotations

from ..schema import STALL_RATIO


def register(sub) -> None:
    from .. import guard
    from ..cli import add_endpoint_flag, add_json_flag, add_progress_flag, add_storage_option_flag

    p = sub.add_parser("check", help="will this storage stall training? one verdict from your step time, "
                                     "batch and workers (exit 1 over --max-stall)",
                       description="Generate a synthetic dataset under TARGET (or use --dataset DIR|URL: one without "
                                   "a manifest is indexed into the cache directory), load it from cold storage with "
                                   "your step time, batch and workers until the stall and P99 intervals are narrow "
                                   "(or --max-time), and measure this host's read ceiling beside it.  The first line "
                                   "is the verdict: stall with its interval, bandwidth delivered (every byte read, "
                                   "buffer fills included) vs needed, the limit and its remedy, host-bound when the "
                                   "host is the limit, the cache state.  Generated data is removed at the end.")
    p.add_argument("target", nargs="?", metavar="TARGET", help="directory or URL to test (a fresh "
                                                                "iobench-check-XXXX prefix is created and removed)")
    p.add_argument("--dataset", metavar="DIR|URL", help="your dataset instead (no manifest? it is indexed "
                                                        "into the cache directory; your data is never written)")
    p.add_argument("--step-time", required=True, metavar="DURATION", help="your training step time, e.g. 180ms")
    p.add_argument("--batch-size", "-B", type=int, default=32, help="samples per batch (32)")
    p.add_argument("--workers", "-W", type=int, default=2, help="loader worker processes (2)")
    p.add_argument("--prefetch", "-Q", type=int, default=2, help="prefetch slots per worker (2)")
    p.add_argument("--steps", type=int, help="run exactly this many steps (default: until stable, within --max-time)")
    p.add_argument("--until-stable", action="store_true",
                   help="with --steps: stop early once the stall and P99 intervals are narrow (the default without)")
    p.add_argument("--min-steps", type=int, default=50, metavar="N", help="never stop before N steps (50)")
    p.add_argument("--max-time", default="60s", metavar="DURATION", help="time cap of the load (60s)")
    p.add_argument("--sample-size", default="128KiB", metavar="SIZE", help="synthetic sample size (128KiB)")
    p.add_argument("--samples", type=int, metavar="N", help="synthetic dataset size in samples "
                                                             "(default: enough for --max-time, within 2 GiB)")
    p.add_argument("--format", default="raw", help="synthetic dataset format: raw | tar | parquet | tfrecord | files")
    p.add_argument("--cache", default="cold", choices=("cold", "warm", "as-is"),
                   help="page cache before loading: cold (default: storage numbers; pages dropped, residency "
                        "verified), warm (page-cache numbers, said so in the verdict), as-is")
    p.add_argument("--emulate", default="none", metavar="SPEC",
                   help="emulated storage (as `iobench load --emulate`), e.g. bw:400MiB/s: the tier's aggregate "
                        "bandwidth, shared by all workers, and per-request latency such as const:20ms")
    from ..driver import default_host_ceiling

    p.add_argument("--host-ceiling", default=default_host_ceiling(), choices=("cached", "measure", "off"),
                   help="this host's read ceiling for the batch shape: cached (calibrated once per host and shape), "
                        "measure (again now) or off (default: $IOBENCH_HOST_CEILING, else cached)")
    p.add_argument("--max-stall", type=float, metavar="R", help="exit 1 when the stall exceeds R (e.g. 0.05)")
    add_endpoint_flag(p)
    add_storage_option_flag(p)
    add_progress_flag(p)
    add_json_flag(p)
    guard.declare(p, guard.work("target", "TARGET"), guard.dataset("dataset", "--dataset"))
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from ..check import CheckConfig, run_check
    from ..cli import want_progress
    from ..results import Results
    from ..storage import parse_storage_options
    from ..units import parse_duration, parse_size

    cfg = CheckConfig(step_s=parse_duration(args.step_time, "--step-time"), batch_size=args.batch_size,
                      workers=args.workers, prefetch=args.prefetch, steps=args.steps,
                      until_stable=True if args.until_stable else None, min_steps=args.min_steps,
                      max_time_s=parse_duration(args.max_time, "--max-time"), target=args.target,
                      dataset=args.dataset, sample_bytes=parse_size(args.sample_size, "--sample-size"),
                      samples=args.samples, format=args.format, cache=args.cache, max_stall=args.max_stall,
                      emulate=args.emulate, host_ceiling=args.host_ceiling)
    so = parse_storage_options(args.storage_option) or None

    def say(msg: str) -> None:
        sys.stderr.write(msg + "\n")

    m, environment = run_check(cfg, endpoint_url=args.endpoint_url, storage_options=so,
                               progress=want_progress(args), say=say)
    warnings = m.pop("warnings")
    res = Results(command="check", config={k: v for k, v in vars(cfg).items()}, metrics=m, environment=environment)
    for w in warnings:
        res.warn(w)
    if args.json:
        res.write(args.json)
    print(m["verdict"])
    if m["passed"] is not None:
        print(f"{'pass' if m['passed'] else 'FAIL'}: data stall ≤ {cfg.max_stall:.2%} — stall_ratio = "
              f"{m[STALL_RATIO]:.2%}")
    for w in warnings:
        say(f"warning: {w}")
    if args.json and args.json != "-":
        print(f"results: {args.json}")
    return 0 if m["passed"] in (None, True) else 1
