"""`iobench gds probe|bench`: which GPU read paths this node has, and what each delivers."""

from __future__ import annotations


def register(sub) -> None:
    from .. import guard
    from ..cli import add_json_flag, add_set_flag

    p = sub.add_parser("gds", help="GPU-direct reads: probe the paths this node has, benchmark them")
    gsub = p.add_subparsers(dest="gds_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: _no_sub(p))

    pp = gsub.add_parser("probe", help="detect cufile / kvikio-compat / bounce / cpu, with the reasons")
    pp.add_argument("file", nargs="?", help="a file whose file system and block device to check")
    pp.add_argument("--timeout", default="20s", metavar="DURATION",
                    help="how long the CUDA/cuFile probe subprocess may take before it is killed (default 20s)")
    add_json_flag(pp)
    guard.declare(pp, guard.in_file("file", "FILE", must_exist=False))   # a file or directory, only stat'ed
    pp.set_defaults(func=run_probe)

    pb = gsub.add_parser("bench", help="gdsio-style table: path × IO size × threads, cold and warm")
    pb.add_argument("target", metavar="FILE|DATASET_DIR", help="a file, or a local dataset directory (manifest.json)")
    pb.add_argument("--paths", default="cpu,bounce,kvikio-compat,cufile", metavar="LIST",
                    help="read paths to measure (default: all four; unavailable ones fall back unless --strict)")
    pb.add_argument("--io-size", default="64KiB,1MiB,16MiB", metavar="LIST", help="IO sizes (default 64KiB,1MiB,16MiB)")
    pb.add_argument("--threads", default="1,4", metavar="LIST", help="IOs in flight per call (default 1,4)")
    pb.add_argument("--cache", default="cold,warm", metavar="LIST", help="cache states: cold, warm (default both)")
    pb.add_argument("--odirect", action="store_true", help="cpu path: O_DIRECT (falls back where refused)")
    pb.add_argument("--strict", action="store_true", help="an unavailable path is an error (exit 2), not a fallback")
    pb.add_argument("--max-bytes", metavar="SIZE", help="read at most this much of each file per cell")
    pb.add_argument("--max-seconds", metavar="DURATION", help="stop each cell's steady loop after this long")
    pb.add_argument("--qd1-samples", type=int, default=200, metavar="N", help="queue-depth-1 reads per cell (0: skip)")
    pb.add_argument("--no-verify", action="store_true", help="skip the checksum of the delivered bytes")
    pb.add_argument("--create", metavar="SIZE", help="create FILE with this many random bytes if it does not exist")
    pb.add_argument("--timeout", default="20s", metavar="DURATION", help="probe subprocess timeout (default 20s)")
    add_set_flag(pb)
    add_json_flag(pb)
    guard.declare(pb, guard.dataset("target", "FILE|DATASET_DIR"), guard.not_a_path("paths", "--paths"))
    pb.set_defaults(func=run_bench)


def _no_sub(p) -> int:
    p.print_help()
    return 2


def run_probe(args) -> int:
    import os

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..gds import detect
    from ..results import Results
    from ..units import parse_duration

    timeout = parse_duration(args.timeout, "--timeout", allow_zero=False)
    if args.file and not os.path.exists(args.file):
        from ..errors import ConfigError

        raise ConfigError("file", f"{args.file} does not exist", "give an existing file on the storage to check")
    pr = detect.probe(args.file, timeout_s=timeout)
    d = pr.to_dict()
    table = Table(title="GPU read paths on this node")
    for col in ("path", "available", "reason / detail"):
        table.add_column(col)
    for name, cap in pr.capabilities.items():
        table.add_row(name, "yes" if cap.available else "no", escape(cap.reason or _detail(cap.detail)))
    Console().print(table)
    f = d["facts"].get("file") or {}
    if f:
        Console().print(f"file: {f.get('path')} on {f.get('fs_type')} ({f.get('block_device') or '-'}, "
                        f"driver {f.get('driver') or '-'})")
    if args.json:
        res = Results(command="gds probe", config={"file": args.file, "timeout_s": timeout})
        res.environment["gds"] = d
        res.environment["effective_gds_path"] = {"best": d["best_path"]}
        res.metrics["paths_available"] = [n for n, c in pr.capabilities.items() if c.available]
        res.metrics["probe_s"] = d["facts"]["runtime"].get("elapsed_s")
        if d["facts"]["runtime"].get("timed_out"):
            res.warn(f"the CUDA/cuFile probe timed out after {timeout} s in stage "
                     f"{d['facts']['runtime'].get('last_stage')!r} and was killed")
        res.write(args.json)
        print(f"results: {args.json}")
    return 0


def _detail(detail: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in detail.items()) if detail else ""


def run_bench(args) -> int:
    import warnings

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..config import build, command_section, to_dict
    from ..gds import GdsFallbackWarning
    from ..gds.bench import TABLE_COLUMNS, GdsBenchConfig, table_rows
    from ..gds.bench import run_bench as bench
    from ..results import Results
    from ..units import parse_duration

    flags = {"target": args.target, "paths": args.paths, "io_sizes": args.io_size, "threads": args.threads,
             "cache": args.cache, "odirect": args.odirect, "strict": args.strict, "max_bytes": args.max_bytes,
             "qd1_samples": args.qd1_samples, "verify": not args.no_verify, "create": args.create,
             "probe_timeout_s": parse_duration(args.timeout, "--timeout", allow_zero=False)}
    if args.max_seconds:
        flags["max_seconds"] = parse_duration(args.max_seconds, "--max-seconds", allow_zero=False)
    cfg = build(GdsBenchConfig, command_section(None, "gds", flags, args.set, "iobench gds bench"), "gds")
    results = Results(command="gds bench", config=to_dict(cfg))
    console = Console(stderr=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GdsFallbackWarning)
        with console.status("probing and measuring") as status:
            out = bench(cfg, results=results, progress=lambda msg: status.update(msg))
    for w in caught:
        if issubclass(w.category, GdsFallbackWarning):
            console.print(f"[yellow]warning:[/] {escape(str(w.message))}")
    table = Table(title=f"iobench gds bench — {cfg.target}")
    for col in TABLE_COLUMNS:
        table.add_column(col)
    for row in table_rows(out["metrics"]["cells"]):
        table.add_row(*row)
    Console().print(table)
    stand_ins = {c["path_effective"]: [r for r in c["requested"] if r != c["path_effective"]]
                 for c in out["metrics"]["cells"]}
    for eff, asked in stand_ins.items():
        if asked:
            Console().print(f"{eff}*: also stands for {', '.join(asked)} (unavailable here; reason in the warnings)")
    if args.json:
        results.write(args.json)
        print(f"results: {args.json}")
    if not out["metrics"]["all_verified"]:
        console.print("[red]checksum mismatch: a path delivered bytes that differ from the file[/]")
        return 1
    return 0
