"""`iobench probe`: what each storage tier can physically do (see README: Storage probe)."""

from __future__ import annotations

_COMMON_HELP = {
    "file": "sequential/random read and write bandwidth, IOPS and latency of a local directory (fio or built-in)",
    "metadata": "create/stat/open+read/unlink rate of small files (mdtest pattern); PUT/HEAD/GET/LIST/DELETE on S3",
    "smallfiles": "the same samples as one file each vs tar/raw shards, read back cold: the small-file penalty",
    "s3": "object store GET/PUT throughput and time to first byte vs object size and concurrency",
}

# (flag, config key, help) per probe; values are parsed and checked by the probe's config class.
_FLAGS = {
    "file": [("--rw", "rw", "patterns: read,write,randread,randwrite"),
             ("--bs", "bs", "request sizes, e.g. 4KiB,64KiB,1MiB,16MiB"),
             ("--qd", "qd", "queue depths, e.g. 1,4,32"),
             ("--io", "io", "buffered,direct (O_DIRECT)"),
             ("--cache", "cache", "declared cache state of buffered reads: cold,warm (verified with mincore)"),
             ("--runtime", "runtime", "seconds per point, e.g. 1s"),
             ("--file-size", "file_size", "size of the test file (capped by --size)"),
             ("--engine", "engine", "auto (fio when installed), fio or python"),
             ("--qd-model", "qd_model", "async (fio libaio iodepth) or threads (psync numjobs, like the built-in)"),
             ("--layout", "layout", "under mpirun: n-n (file per rank), n-1 (one shared file, strided), or both")],
    "metadata": [("--files", "files", "small files (objects) in all"),
                 ("--workers", "workers", "parallel workers (requests in flight on S3)"),
                 ("--dirs", "dirs", "directories (prefixes) per worker"),
                 ("--file-size", "file_size", "bytes per file, e.g. 4KiB or 0")],
    "smallfiles": [("--samples", "samples", "samples in each dataset"),
                   ("--modality", "modality", "images or tokens"),
                   ("--formats", "shard_formats", "shard formats to compare with one file per sample, e.g. tar,raw"),
                   ("--shard-size", "shard_size", "shard size of the shard formats"),
                   ("--workers", "workers", "reader threads"),
                   ("--cache", "cache", "cold or warm (local directories)")],
    "s3": [("--sizes", "sizes", "object sizes, e.g. 4KiB,64KiB,1MiB,16MiB,256MiB"),
           ("--concurrency", "concurrency", "requests in flight, e.g. 1,4,16,64"),
           ("--runtime", "runtime", "seconds per point"),
           ("--ops", "ops", "put,get,range,multipart"),
           ("--range-size", "range_size", "size of ranged GETs inside the largest objects"),
           ("--part-sizes", "part_sizes", "multipart part sizes, e.g. 5MiB,16MiB,64MiB"),
           ("--multipart-size", "multipart_size", "object size for the multipart sweep")],
}


def _common(p, many: bool = False) -> None:
    from .. import guard
    from ..cli import add_endpoint_flag, add_json_flag, add_set_flag

    if many:
        p.add_argument("urls", nargs="+", metavar="[TIER=]URL", help="directories or s3://bucket/prefix to probe")
    else:
        p.add_argument("url", metavar="URL", help="a directory (created if missing) or s3://bucket/prefix")
        p.add_argument("--tier", metavar="NAME", help="tier name in the results (default: local / object)")
    p.add_argument("--size", default="1GiB", metavar="BYTES", help="cap on the probe's footprint (default 1GiB)")
    p.add_argument("--force", action="store_true",
                   help="probe a non-empty target (the probe still writes only its own subfolder)")
    p.add_argument("--quick", action="store_true", help="a few seconds per probe (the `iobench run` presets)")
    add_endpoint_flag(p)
    add_json_flag(p)
    add_set_flag(p)
    # `probe all` takes TIER=URL pairs: each probe it runs checks its own directory
    guard.declare(p, guard.not_a_path("urls", "[TIER=]URL") if many else guard.work("url", "URL"))


def register(sub) -> None:
    p = sub.add_parser("probe", help="characterize storage: bandwidth, IOPS, latency, metadata, small files, S3")
    psub = p.add_subparsers(dest="probe", metavar="PROBE", parser_class=type(p))
    for name, flags in _FLAGS.items():
        q = psub.add_parser(name, help=_COMMON_HELP[name])
        _common(q)
        for flag, key, text in flags:
            q.add_argument(flag, dest=f"cfg_{key}", metavar="VALUE", help=text)
        q.set_defaults(func=run)
    q = psub.add_parser("all", help="every probe that applies, on one or more tiers (NAME=URL ...)")
    _common(q, many=True)
    q.set_defaults(func=run)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..config import set_overrides
    from ..errors import ConfigError
    from ..results import Results
    from ..units import parse_size
    from ..probe.runner import PROBES, Target, build_config, check_target, default_probes, parse_target, run_tier
    from ..probe.summary import table

    size_cap = parse_size(args.size, "--size")
    read = PROBES if args.probe == "all" else (args.probe,)
    overrides = set_overrides(args.set, read, f"iobench probe {args.probe}")
    if args.probe == "all":
        targets = [parse_target(u, i) for i, u in enumerate(args.urls)]
        names = [t.tier for t in targets]
        if len(set(names)) != len(names):
            raise ConfigError("URL", "two targets have the same tier name", "name them: nvme=/a object=s3://b/p")
    else:
        t = parse_target(args.url)
        targets = [Target(args.tier or t.tier, t.url)]
    results = Results(command="probe", config={"probe": args.probe, "size_cap_bytes": size_cap, "force": args.force,
                                               "quick": args.quick, "endpoint_url": args.endpoint_url})
    plans = []
    for t in targets:
        protocol = "s3" if t.url.startswith("s3://") else "file"
        probes = default_probes(protocol) if args.probe == "all" else [args.probe]
        check_target(t, probes)
        configs = {}
        for probe in probes:
            mapping = dict(overrides.get(probe, {}))
            if args.probe == probe:
                for _, key, _ in _FLAGS[probe]:
                    v = getattr(args, f"cfg_{key}", None)
                    if v is not None:
                        mapping[key] = v
            configs[probe] = build_config(probe, mapping, quick=args.quick, protocol=protocol)
        plans.append((t, probes, configs))
    from ..dist import detect_world

    world = detect_world()
    if world.size > 1:
        return _run_world(args, world, results, plans, size_cap)
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as progress:
        for t, probes, configs in plans:
            run_tier(results, t, probes, configs, size_cap, args.force, endpoint_url=args.endpoint_url,
                     progress=progress)
    Console().print(table(results.metrics["summary"]))
    for w in results.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    if args.json:
        results.write(args.json)
        print(f"results: {args.json}")
    return 0


def _run_world(args, world, results, plans, size_cap) -> int:
    """Under MPI: the aggregate (IOR/mdtest-style) probes of iobench.probe.world_probe."""

    from ..config import to_dict
    from ..dist.launch import collect, start
    from ..errors import ConfigError
    from ..units import parse_size
    from ..probe import world_probe as wp

    if args.probe not in ("file", "metadata", "s3", "smallfiles"):
        raise ConfigError("probe", f"`probe {args.probe}` has no multi-rank form",
                          "under mpirun name one probe: file, metadata, smallfiles or s3")
    t, _, configs = plans[0]
    cfg = configs[args.probe]
    start(world, "probe", results.config | {"url": t.url, "cfg": to_dict(cfg) if hasattr(cfg, "__dataclass_fields__")
                                            else str(cfg)})
    area = wp.open_world_area(world, t.url, size_cap, args.force, args.endpoint_url)
    try:
        if args.probe == "file":
            transfer = wp.parse_one(cfg.bs, "1MiB", "probe.bs")
            per_rank = min(int(parse_size(cfg.file_size, "probe.file_size")), area.size_cap)
            layouts = tuple(getattr(cfg, "layout", None) or ("n-n", "n-1"))
            body = wp.file_probe(world, area, transfer, per_rank, layouts)
        elif args.probe == "smallfiles":
            body = wp.smallfiles_probe(world, area, cfg, endpoint_url=args.endpoint_url)
        elif args.probe == "metadata":
            body = wp.metadata_probe(world, area, max(1, cfg.files // world.size), cfg.file_bytes)
        else:
            size = wp.parse_one(cfg.sizes, "1MiB", "probe.sizes")
            conc = cfg.concurrency[0] if len(cfg.concurrency) == 1 else 4
            objects = max(1, min(64, area.size_cap // max(1, size)))
            body = wp.s3_probe(world, area, size, objects, conc)
    finally:
        wp.close_world_area(world, area)
    results.environment["probe"] = {"mode": "aggregate (MPI)", "engine": "python", "area": area.describe()}
    if not collect(world, results, {"aggregate": {args.probe: body}}, wp.merge_probe_ranks):
        return 0
    for line in wp.summary_lines(results.metrics["aggregate"]):
        print(line)
    if args.json:
        results.write(args.json)
        print(f"results: {args.json}")
    return 0
