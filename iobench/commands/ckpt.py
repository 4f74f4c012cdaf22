from __future__ import annotations

HELP = """checkpoint benchmark: snapshot, local write, async commit, restore

  iobench ckpt --preset llama3-8b --scale 0.001 --local /nvme/ckpt --durable s3://b/ckpt --json r.json
  iobench ckpt restore --durable s3://b/ckpt [--local DIR] [--ranks M] --verify --json r.json
"""


def register(sub) -> None:
    import argparse

    from ..cli import add_endpoint_flag, add_json_flag, add_progress_flag, add_set_flag

    p = sub.add_parser("ckpt", help="checkpoint save/restore benchmark (blocking pause, commit latency, exposure)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=["save", "restore"], default="save",
                   help="save (default): run the save benchmark; restore: restore the newest committed checkpoint")
    g = p.add_argument_group("state")
    g.add_argument("--preset", metavar="NAME", help="llama3-8b, llama3-70b, llama3-405b, llama3-1t, qwen3-8b, gpt-175b")
    g.add_argument("--params", type=float, metavar="N", help="parameter count instead of a preset (e.g. 8e9)")
    g.add_argument("--recipe", metavar="NAME", help="precision recipe (default: the preset's; bf16-mixed-adam = 14 B/param)")
    g.add_argument("--tp", type=int, metavar="N")
    g.add_argument("--pp", type=int, metavar="N")
    g.add_argument("--dp", type=int, metavar="N")
    g.add_argument("--zero", type=int, dest="zero_stage", metavar="STAGE", help="ZeRO stage 0-3")
    g.add_argument("--ranks", type=int, metavar="M",
                   help="save: must equal TP×PP×DP; restore: reshard to M ranks")
    g.add_argument("--scale", type=float, default=1.0, metavar="F", help="shrink every tensor by F, keeping the layout")
    g = p.add_argument_group("saves")
    g.add_argument("--count", type=int, default=3, metavar="N", help="number of saves")
    g.add_argument("--interval-ms", type=float, default=0.0, metavar="T", help="emulated step time between saves")
    g.add_argument("--mode", default="async", help="sync | async")
    g.add_argument("--policy", default="block", help="when a save finds the commit queue full: block | skip | coalesce")
    g.add_argument("--queue-depth", type=int, default=1, metavar="N")
    g.add_argument("--keep-local", type=int, default=2, metavar="K")
    g.add_argument("--keep-durable", type=int, default=3, metavar="K")
    g.add_argument("--durable-bw", metavar="RATE", help="emulate a slower durable tier: a rate, e.g. 200MB or bw:200MB/s")
    g.add_argument("--local-bw", metavar="RATE", help="emulate a slower local tier")
    g.add_argument("--no-fsync", action="store_true", help="skip fsync (results say so)")
    g.add_argument("--fail-at", type=float, action="append", default=[], metavar="S",
                   help="recovery exposure for a failure S seconds after the first save (repeatable)")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("tiers")
    g.add_argument("--local", metavar="DIR", help="local tier (NVMe) directory")
    g.add_argument("--durable", metavar="URL", help="durable tier: a PFS path or s3://bucket/prefix")
    add_endpoint_flag(p)
    g.add_argument("--verify", action="store_true", default=True, help="restore: verify checksums (default)")
    g.add_argument("--no-verify", dest="verify", action="store_false")
    g.add_argument("--read-path", default="plain", metavar="PATH",
                   help="restore: plain (default) or a host-memory iobench.gds reader: cpu")
    add_json_flag(p)
    add_progress_flag(p)
    add_set_flag(p)   # --set ckpt.KEY=VALUE: any CkptConfig field (e.g. ckpt.keep_every=10), after the flags
    from .. import guard

    guard.declare(p, guard.root("local", "--local"), guard.root("durable", "--durable"),
                  guard.not_a_path("read_path", "--read-path"))
    p.set_defaults(func=run)


def _rate(v, field):
    from ..io.ratelimit import parse_rate

    return parse_rate(v, field)


def _overrides(args) -> dict:
    """``--set ckpt.KEY=VALUE``; any other section is refused (exit 2), as for every command."""
    from ..config import set_overrides

    section = dict(set_overrides(args.set, ("ckpt",), f"iobench ckpt {args.action}").get("ckpt", {}))
    for k in ("durable_bw", "local_bw"):
        if k in section:
            section[k] = _rate(section[k], f"ckpt.{k}")
    return section


def run(args) -> int:
    overrides = _overrides(args)
    if args.action == "restore":
        if overrides:
            from ..errors import ConfigError

            raise ConfigError(f"ckpt.{next(iter(overrides))}", "is a save setting: `ckpt restore` reads flags only",
                              "drop --set, or give the restore flags (--durable, --local, --ranks, ...)")
        return run_restore(args)
    import os
    from dataclasses import replace

    from rich.console import Console

    from ..checkpointing.runner import CkptConfig, open_tiers, run_saves
    from ..config import to_dict
    from ..results import Results
    from ..units import format_bytes, format_rate, format_seconds
    from ..dist import detect_world
    from ..dist.launch import collect, start
    from ..checkpointing.world import merge_save_ranks

    from ..config import build

    flags = dict(preset=args.preset, params=args.params, recipe=args.recipe, tp=args.tp, pp=args.pp, dp=args.dp,
                 zero_stage=args.zero_stage, ranks=args.ranks, scale=args.scale, count=args.count,
                 interval_ms=args.interval_ms, mode=args.mode, policy=args.policy, queue_depth=args.queue_depth,
                 local=args.local, durable=args.durable, endpoint_url=args.endpoint_url,
                 keep_local=args.keep_local, keep_durable=args.keep_durable,
                 durable_bw=_rate(args.durable_bw, "--durable-bw"), local_bw=_rate(args.local_bw, "--local-bw"),
                 fsync=not args.no_fsync, seed=args.seed, fail_at=tuple(args.fail_at))
    cfg = build(CkptConfig, {**flags, **overrides}, "ckpt")
    cfg.spec()   # validate the layout before touching storage
    world = detect_world()
    from ..checkpointing.runner import check_fits_memory
    from ..checkpointing.snapshot import local_ranks

    if world.size <= cfg.spec().ranks:   # (fewer ranks than processes is run_saves' own error)
        check_fits_memory(cfg.spec(), local_ranks(cfg.spec(), world.rank, world.size))   # before any directory
    if world.size > 1 and cfg.local:
        # node-local tier: each process keeps its own copy; the commit point is on --durable
        cfg = replace(cfg, local=os.path.join(cfg.local, f"proc-{world.rank:05d}"))
    start(world, "ckpt", to_dict(replace(cfg, local=args.local)),
          check=lambda: open_tiers(cfg.local, cfg.durable, cfg.endpoint_url))
    local, durable = open_tiers(cfg.local, cfg.durable, cfg.endpoint_url, check=False)
    res = Results(command="ckpt", config=to_dict(cfg))
    from ..cli import want_progress

    m = run_saves(cfg, local, durable, progress=want_progress(args) and world.rank == 0, world=world)
    if not collect(world, res, {"checkpoint": m}, lambda per_rank, hosts: {"checkpoint": {
            **m, **merge_save_ranks([p["checkpoint"] for p in per_rank], hosts)}}):
        return 1 if m["saves"]["failed"] else 0
    c = Console()
    if world.size > 1:
        w = res.metrics["checkpoint"]
        failed = w["saves"]["total"] - w["saves"]["committed"]
        c.print(f"{m['state']['name']}: {format_bytes(w['bytes_per_save'])} per save from {world.size} processes "
                f"({m['state']['ranks']} checkpoint ranks); {w['saves']['committed']} of {w['saves']['total']} "
                "saves committed")
        c.print(f"per save, max across ranks: local write p50 {format_seconds(w['local_write_s']['p50'] or 0)} "
                f"({format_rate(w['local_write_bytes_per_s'] or 0)}), blocking p50 "
                f"{format_seconds(w['blocking_s']['p50'] or 0)}, commit latency p50 "
                f"{format_seconds(w['commit_latency_s']['p50'] or 0)}; committed "
                f"{format_seconds(w['commit_after_slowest_rank_s']['p50'] or 0)} after the slowest rank was durable")
        c.print(w["world"]["straggler"]["line"])
    else:
        failed = m["saves"]["failed"]
    res.environment["staging"] = m["staging_kind"]
    res.environment["fsync"] = cfg.fsync
    if cfg.durable_bw or cfg.local_bw:
        res.environment["emulation"] = {"durable_bw_bytes_per_s": cfg.durable_bw, "local_bw_bytes_per_s": cfg.local_bw}
    if not cfg.fsync:
        res.warn("fsync disabled: local write times do not include making the data durable")
    if m["staging_kind"] == "host":
        res.warn("staging buffers are pageable host memory (pinned memory needs torch or cupy)")
    if world.size == 1:
        c.print(f"{m['state']['name']}: {format_bytes(m['state']['bytes_per_save'])} per save over "
                f"{m['state']['local_ranks']} rank(s); saves {m['saves']}")
        c.print(f"blocking p50 {format_seconds(m['blocking_s']['p50'] or 0)}, "
                f"local write {format_rate(m['local_write_bytes_per_s'] or 0)}, "
                f"commit latency p50 {format_seconds(m['commit_latency_s']['p50'] or 0)}, "
                f"backlog max {m['backlog_max']}")
    if args.json:
        res.write(args.json)
    return 1 if failed else 0


def run_restore(args) -> int:
    import os

    from rich.console import Console

    import sys

    from ..checkpointing.runner import merge_restore_ranks, open_tiers
    from ..checkpointing.runner import run_restore as restore_run
    from ..dist import detect_world
    from ..dist.launch import collect, start
    from ..errors import ConfigError
    from ..results import Results
    from ..units import format_bytes, format_rate, format_seconds

    if not args.durable and not args.local:
        raise ConfigError("--durable", "restore needs a tier", "give --durable URL and/or --local DIR")
    local, durable = open_tiers(args.local, args.durable, args.endpoint_url)
    res = Results(command="ckpt restore", config={"local": args.local, "durable": args.durable, "ranks": args.ranks,
                                                  "tp": args.tp, "pp": args.pp, "dp": args.dp, "verify": args.verify,
                                                  "read_path": args.read_path,
                                                  "endpoint_url": args.endpoint_url})
    read_fn = None
    if args.read_path != "plain":
        from ..checkpointing.restore import reader_read_fn
        from ..config import check_choice

        check_choice("--read-path", args.read_path, ("plain", "cpu"))
        from ..gds import make_reader

        read_fn = reader_read_fn(lambda path: make_reader(args.read_path, path))
        res.environment["read_path"] = args.read_path
    world = detect_world()
    if world.size > 1 and args.local:   # the same per-process directory as the save
        local, _ = open_tiers(os.path.join(args.local, f"proc-{world.rank:05d}"), None)
    start(world, "ckpt restore", res.config)
    got, m = restore_run(local, durable, args.ranks, args.tp, args.pp, args.dp, verify=args.verify, read_fn=read_fn,
                         world=world)
    res.environment["cache"] = got.cache   # declared and measured (mincore), never just declared
    for s in got.skipped:
        res.warn(f"skipped {s}")
    if not collect(world, res, {"checkpoint": m}, lambda per_rank, hosts: {"checkpoint": {
            **m, **merge_restore_ranks([p["checkpoint"] for p in per_rank], hosts)}}):
        return 0
    w = res.metrics["checkpoint"]
    Console().print(f"restored step {got.step} from {got.tier} ({got.url}): {format_bytes(w['restore_bytes'])} in "
                    f"{format_seconds(w['restore_s'])} ({format_rate(w['restore_bytes_per_s'])}), "
                    f"{'verified' if w['verified'] else 'NOT verified'}, "
                    f"{w['ranks']} rank(s)" + (f" on {world.size} processes" if world.size > 1 else "") + ", "
                    + (f"page cache {got.resident_ratio:.0%} resident before the reads (measured)"
                       if got.resident_ratio is not None else "page-cache residency not measurable"))
    if world.size > 1:
        Console().print(w["world"]["straggler"]["line"])
    for s in got.skipped:
        # a newer step that failed verification (or is unreadable) is not silently passed over: the restore
        # is older than the newest commit, and the user should know why
        print(f"warning: skipped {s}", file=sys.stderr)
    if args.json:
        res.write(args.json)
    return 0
