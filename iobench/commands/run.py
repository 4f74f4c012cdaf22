from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("run", help="run the default suite (what `make run` calls) and write a report")
    p.add_argument("--out", default="reports/latest", metavar="DIR", help="where results and the report go")
    p.add_argument("--config", metavar="FILE", help="cluster YAML (tiers, object store) instead of the embedded default")
    p.add_argument("--stages", metavar="LIST", help="comma-separated subset of stages to run")
    from ..cli import add_progress_flag

    add_progress_flag(p)
    p.add_argument("--keep-data", action="store_true", help="keep the generated data in the work directory")
    from .. import guard

    guard.declare(p, guard.out_dir("out", "--out", owner="report"), guard.in_file("config", "--config"))
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from ..errors import ConfigError
    from ..suite import STAGES, load_suite_config, run_suite

    config = load_suite_config(args.config).as_dict() if args.config else {}
    stages = None
    if args.stages:
        stages = [s.strip() for s in args.stages.split(",") if s.strip()]
        known = [n for n, _ in STAGES]
        for s in stages:
            if s not in known:
                from ..config import nearest

                raise ConfigError("--stages", f"unknown stage {s!r}", nearest(s, known))
    from ..dist import detect_world

    world = detect_world()
    if world.size > 1:
        from ..suite.world import WORLD_STAGES, run_world_suite

        missing = [s for s in stages or [] if s not in WORLD_STAGES]
        if missing:
            err = ConfigError("--stages", f"{', '.join(missing)} has no multi-rank form",
                              "under mpirun use: " + ", ".join(WORLD_STAGES))
            err.collective = True
            raise err
        path = run_world_suite(Path(args.out), config, stages, args.keep_data, world)
        if path is not None:
            print(f"results: {path}")
        return 0
    from ..cli import want_progress

    path = run_suite(Path(args.out), config=config, stages=stages, keep_data=args.keep_data,
                     progress=want_progress(args))
    print(f"results: {path}")
    return 0
