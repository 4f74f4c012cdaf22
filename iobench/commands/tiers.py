from __future__ import annotations

from .. import guard
from ..cli import add_endpoint_flag, add_json_flag


def register(sub) -> None:
    p = sub.add_parser("tiers", help="tier files, catalog state, eviction, lifecycle and policy simulation")
    tsub = p.add_subparsers(dest="tiers_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    q = tsub.add_parser("init", help="write a tiers file (nvme, optional pfs, optional object)")
    q.add_argument("--nvme", required=True, metavar="DIR", help="local directory of the hot tier")
    q.add_argument("--nvme-capacity", metavar="SIZE", help="e.g. 500GB (default: unbounded)")
    q.add_argument("--pfs", metavar="DIR", help="directory of the parallel file system tier (pfs emulation on)")
    q.add_argument("--pfs-capacity", metavar="SIZE")
    q.add_argument("--pfs-emulation", default="pfs", choices=("none", "nvme", "pfs", "object"))
    q.add_argument("--object", metavar="URL", help="s3://bucket/prefix of the object tier")
    q.add_argument("--policy", default="lru", choices=("lru", "fifo", "pin-once-full"))
    q.add_argument("--catalog", metavar="FILE", help="SQLite catalog path (default: <nvme>/.iobench/catalog.sqlite)")
    q.add_argument("--concurrency", type=int, default=4)
    q.add_argument("-o", "--out", required=True, metavar="FILE", help="where to write the tiers YAML")
    add_endpoint_flag(q)
    guard.declare(q, guard.root("nvme", "--nvme"), guard.root("pfs", "--pfs"), guard.root("object", "--object"),
                  guard.in_file("catalog", "--catalog", must_exist=False), guard.out_file("out", "--out", owner="tiers"))
    q.set_defaults(func=_init)

    q = tsub.add_parser("show", help="capacity, use, high-water mark, copies and evictions per tier")
    q.add_argument("--tiers", required=True, metavar="FILE")
    add_json_flag(q)
    guard.declare(q, guard.tiers_file())
    q.set_defaults(func=_show)

    q = tsub.add_parser("simulate", help="replay an access trace against each policy at several capacities")
    q.add_argument("trace", metavar="TRACE", help="JSON-lines trace written by a load or stage run")
    q.add_argument("--capacities", default="10%,25%,50%,75%,100%", metavar="LIST",
                   help="sizes or percentages of the distinct bytes read (default: %(default)s)")
    q.add_argument("--policies", default="lru,fifo,pin-once-full,belady", metavar="LIST")
    add_json_flag(q)
    guard.declare(q, guard.in_file("trace", "TRACE"))
    q.set_defaults(func=_simulate)

    q = tsub.add_parser("evict", help="drop cache copies from a tier (never pinned, in-use or last copies)")
    q.add_argument("--tiers", required=True, metavar="FILE")
    q.add_argument("--tier", required=True)
    q.add_argument("--dataset-id", metavar="ID", help="only this dataset's copies (ids: `iobench tiers show`)")
    guard.declare(q, guard.tiers_file())
    q.set_defaults(func=_evict)

    q = tsub.add_parser("reconcile", help="remove files on local tiers that the catalog does not know")
    q.add_argument("--tiers", required=True, metavar="FILE")
    guard.declare(q, guard.tiers_file())
    q.set_defaults(func=_reconcile)

    q = tsub.add_parser("lifecycle", help="keep the last K items on a hot tier, archive every N-th, expire the rest")
    q.add_argument("--tiers", required=True, metavar="FILE")
    q.add_argument("--hot", default="pfs", metavar="TIER")
    q.add_argument("--archive", default="object", metavar="TIER")
    q.add_argument("--prefix", default="", help="where the items (files or directories) are, on both tiers")
    q.add_argument("--keep-last", type=int, required=True, metavar="K")
    q.add_argument("--every-nth", type=int, default=0, metavar="N")
    q.add_argument("--dry-run", action="store_true", help="print the plan only")
    add_json_flag(q)
    guard.declare(q, guard.tiers_file())
    q.set_defaults(func=_lifecycle)


def _init(args) -> int:
    from ..preflight import output_dir, output_file
    from ..tiers.config import TierSpec, TiersConfig, write_tiers_file

    output_dir(args.nvme, "--nvme")
    if args.pfs:
        output_dir(args.pfs, "--pfs")
    if args.catalog:
        output_file(args.catalog, "--catalog")
        from ..tiers.catalog import check_catalog_file

        check_catalog_file(args.catalog, "--catalog")   # a file that is no iobench catalog: refused now, not at
        # the first stage (the tiers file would name a catalog no command can open)

    tiers = [TierSpec(name="nvme", url=args.nvme, capacity=args.nvme_capacity, policy=args.policy)]
    if args.pfs:
        tiers.append(TierSpec(name="pfs", url=args.pfs, capacity=args.pfs_capacity, policy=args.policy,
                              emulation=args.pfs_emulation))
    if args.object:
        tiers.append(TierSpec(name="object", url=args.object, endpoint_url=args.endpoint_url))
    cfg = TiersConfig(tiers=tuple(tiers), catalog=args.catalog or "", concurrency=args.concurrency)
    write_tiers_file(cfg, args.out)
    print(f"tiers file: {args.out}")
    return 0


def _show(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..results import Results
    from ..tiers.config import load_tiers
    from ..tiers.manager import TierManager
    from ..units import format_bytes

    cfg = load_tiers(args.tiers)
    mgr = TierManager(cfg).open()
    try:
        usage = mgr.usage()
        datasets = mgr.catalog.datasets()
    finally:
        mgr.close()
    t = Table(title=f"tiers ({cfg.catalog})")
    for col in ("tier", "policy", "capacity", "used", "high-water mark", "copies", "pinned", "evictions"):
        t.add_column(col)
    for spec in cfg.tiers:
        u = usage[spec.name]
        t.add_row(spec.name, spec.policy, format_bytes(u["capacity_bytes"]) if u["capacity_bytes"] else "unbounded",
                  format_bytes(u["used_bytes"]), format_bytes(u["high_water_mark_bytes"]), str(u["copies"]),
                  str(u["pinned_copies"]), str(u["evictions"]))
    Console().print(t)
    for d in datasets:
        print(f"dataset {d['id']}: {d['shards']} shards, {format_bytes(d['bytes'])}, origin {d['origin_tier']} "
              f"({d['source_url']})")
    if args.json:
        r = Results(command="tiers show", config={"tiers": cfg.describe()})
        r.metrics = {"tiers": usage, "datasets": datasets}
        r.write(args.json)
    return 0


def _simulate(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..results import Results
    from ..tiers.simulate import compare, distinct_bytes, parse_capacities, read_trace
    from ..units import format_bytes

    headers, reads = read_trace(args.trace)
    accesses = [(r["shard"], int(r["bytes"])) for r in reads]
    total = distinct_bytes(accesses)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    caps = parse_capacities(args.capacities.split(","), total)
    results = compare(accesses, policies, caps)
    observed = sum(r["result"] == "hit" for r in reads) / len(reads)
    t = Table(title=f"policy replay of {len(reads)} reads over {format_bytes(total)} distinct")
    for col in ("capacity", "of data", *policies):
        t.add_column(col)
    for i, c in enumerate(caps):
        row = results[i * len(policies):(i + 1) * len(policies)]
        t.add_row(format_bytes(c), f"{c / total:.0%}", *(f"{r.hit_ratio:.3f}" for r in row))
    Console().print(t)
    print(f"observed hit ratio in the trace: {observed:.3f}")
    if args.json:
        r = Results(command="tiers simulate", config={"trace": args.trace, "policies": policies,
                                                      "capacities_bytes": caps})
        r.metrics = {"distinct_bytes": total, "reads": len(reads), "observed_hit_ratio": observed,
                     "trace_header": headers[0] if headers else None,
                     "simulation": [x.to_dict() for x in results]}
        r.write(args.json)
    return 0


def _evict(args) -> int:
    from ..tiers.config import load_tiers
    from ..tiers.manager import DatasetRef, TierManager

    cfg = load_tiers(args.tiers)
    cfg.tier(args.tier, "--tier")
    mgr = TierManager(cfg).open()
    try:
        ds = None
        if args.dataset_id:
            ids = [d["id"] for d in mgr.catalog.datasets()]
            if args.dataset_id not in ids:   # nothing to evict is not success: the id was mistyped
                from ..config import nearest
                from ..errors import ConfigError

                raise ConfigError("--dataset-id", f"no dataset {args.dataset_id!r} in the catalog",
                                  nearest(args.dataset_id, ids) + " (`iobench tiers show` lists them)" if ids
                                  else "the catalog holds no dataset yet")
            ds = DatasetRef(id=args.dataset_id, url="", origin_tier="", manifest=None)  # type: ignore[arg-type]
        out = mgr.evict(args.tier, ds)
    finally:
        mgr.close()
    print(", ".join(f"{k}: {v}" for k, v in sorted(out.items())) or "nothing to evict")
    return 0


def _reconcile(args) -> int:
    from ..tiers.config import load_tiers
    from ..tiers.manager import TierManager

    cfg = load_tiers(args.tiers)
    mgr = TierManager(cfg).open()
    try:
        for t in cfg.tiers:   # every tier: a killed stager's temp files are left on unbounded ones too
            print(f"{t.name}: {mgr.reconcile(t.name)}")
    finally:
        mgr.close()
    return 0


def _lifecycle(args) -> int:
    import json
    import re

    from ..errors import ConfigError
    from ..results import Results
    from ..tiers.config import load_tiers
    from ..tiers.lifecycle import apply_lifecycle, plan_lifecycle
    from ..tiers.manager import TierManager

    from ..paths import contained_rel
    from ..tiers.lifecycle import check_lifecycle_tiers, lifecycle_items

    cfg = load_tiers(args.tiers)
    cfg.tier(args.hot, "--hot")
    cfg.tier(args.archive, "--archive")
    prefix = contained_rel(args.prefix, "--prefix", allow_empty=True)
    if args.keep_last < 1:
        raise ConfigError("--keep-last", f"must be at least 1, got {args.keep_last}", "keep at least the newest item")
    check_lifecycle_tiers(cfg, args.hot, args.archive)
    mgr = TierManager(cfg).open()
    try:
        hot = mgr.backend(args.hot)
        names = sorted((p.rstrip("/").rsplit("/", 1)[-1] for p in hot.ls(prefix)),
                       key=lambda s: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", s)])
        listed = [n for n in names if not n.startswith(".")]
        names = lifecycle_items(mgr, args.hot, prefix, listed)
        plan = plan_lifecycle(names, args.keep_last, args.every_nth)
        # what is there but no checkpoint iobench committed: the user's, never moved or expired
        out = {"plan": plan.to_dict() | {"left_alone": sorted(set(listed) - set(names))}}
        if not args.dry_run:
            out["applied"] = apply_lifecycle(mgr, plan, args.hot, args.archive, prefix).to_dict()
    finally:
        mgr.close()
    print(json.dumps({k: {kk: (len(v) if isinstance(v, list) else v) for kk, v in d.items()} for k, d in out.items()}))
    if args.json:
        r = Results(command="tiers lifecycle", config=vars(args) | {"func": None})
        r.metrics = out
        r.write(args.json)
    return 1 if out.get("applied", {}).get("errors") else 0
