from __future__ import annotations

from .. import guard
from ..cli import add_endpoint_flag, add_json_flag


def register(sub) -> None:
    p = sub.add_parser("stage", help="stage a dataset into a tier (prestage, ondemand, stream) and measure it",
                       description="Copy a dataset into a hotter tier the way a training job would, and report "
                                   "staging time, bandwidth, bytes moved per tier pair, evictions and hit ratios. "
                                   "With --epochs, read the dataset that many times (shard order shuffled per "
                                   "epoch) and report per-epoch times.")
    p.add_argument("dataset", metavar="DATASET_URL", help="dataset root (holds manifest.json)")
    p.add_argument("--tiers", required=True, metavar="FILE", help="tiers YAML (create one with `iobench tiers init`)")
    p.add_argument("--to", metavar="TIER", help="the tier to stage into (default: the first, hottest)")
    p.add_argument("--mode", default="prestage", choices=("prestage", "ondemand", "stream"))
    p.add_argument("--epochs", type=int, default=None, metavar="N",
                   help="read the dataset N times after staging (default: 0 for prestage, 1 otherwise)")
    p.add_argument("--readers", type=int, default=4, metavar="N", help="parallel shard readers during epochs")
    p.add_argument("--concurrency", type=int, metavar="N", help="parallel copies (default: the tiers file's, else one per core)")
    p.add_argument("--seed", type=int, default=0, help="seed of the per-epoch shard order")
    p.add_argument("--trace", metavar="PATH", help="write the access trace here (JSON lines)")
    p.add_argument("--evict-first", action="store_true", help="drop this dataset's copies from the tier first")
    add_endpoint_flag(p)
    add_json_flag(p)
    guard.declare(p, guard.dataset("dataset", "DATASET_URL"), guard.tiers_file(),
                  guard.out_file("trace", "--trace", owner="trace"))
    p.set_defaults(func=run)


def run(args) -> int:
    from dataclasses import replace

    from rich.console import Console

    from ..errors import ConfigError
    from ..results import Results
    from ..tiers.config import load_tiers
    from ..tiers.run import run_stage
    from ..units import format_bytes, format_rate, format_seconds
    from ..dist import detect_world
    from ..dist.launch import collect, start
    from ..tiers.run import merge_stage_ranks, open_dataset

    cfg = load_tiers(args.tiers)
    if args.concurrency is not None:
        if args.concurrency < 1:
            raise ConfigError("--concurrency", f"must be at least 1, got {args.concurrency}", "use e.g. 8")
        cfg = replace(cfg, concurrency=args.concurrency)
    epochs = args.epochs if args.epochs is not None else (0 if args.mode == "prestage" else 1)
    if epochs < 0 or args.readers < 1:
        raise ConfigError("--epochs" if epochs < 0 else "--readers", "must not be negative" if epochs < 0
                          else "must be at least 1", "give a whole number")
    world = detect_world()
    res = Results(command="stage", config={"dataset": args.dataset, "tiers_file": args.tiers, "to": args.to,
                                           "mode": args.mode, "epochs": epochs, "readers": args.readers,
                                           "seed": args.seed, "tiers": cfg.describe()})
    start(world, "stage", res.config | {"endpoint_url": args.endpoint_url, "evict_first": args.evict_first},
          check=(lambda: open_dataset(cfg, args.dataset, args.endpoint_url)) if world.is_mpi else None)
    # one trace per rank: ranks must not interleave lines in one file
    trace = f"{args.trace}.rank-{world.rank}" if args.trace and world.size > 1 else args.trace
    m = run_stage(cfg, args.dataset, mode=args.mode, to=args.to, epochs=epochs, readers=args.readers, seed=args.seed,
                  endpoint_url=args.endpoint_url, trace_path=trace, evict_first=args.evict_first,
                  tiers_file=args.tiers, progress=world.rank == 0, results=res, rank=world.rank, world=world.size)
    if not collect(world, res, dict(res.metrics), merge_stage_ranks):
        return 0
    m = res.metrics
    if world.size > 1:
        con_line = f"world: {world.size} ranks; {m['world']['straggler']['line']}"
    else:
        con_line = None
    con = Console()
    st = m.get("staging")
    if st:
        con.print(f"staged {st['staged_shards']} shards ({format_bytes(st['bytes'])}) into {m['to']} in "
                  f"{format_seconds(st['seconds'])}: {format_rate(st['bytes_per_s'])} with {st['concurrency']} "
                  f"parallel cop{'ies' if st['concurrency'] != 1 else 'y'}; "
                  f"{st['already_present_shards']} already there, {st['evictions']} evicted, "
                  f"{st['refetches']} re-fetched")
    for e in m.get("epochs", []):
        con.print(f"epoch {e['epoch']}: {format_seconds(e['seconds'])}, {format_rate(e['bytes_per_s'])}, "
                  f"hit ratio {e['hit_ratio']:.2f}")
    if con_line:
        con.print(con_line)
    if args.json:
        res.write(args.json)
    return 0
