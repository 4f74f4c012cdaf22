"""`iobench mlperf run|datasize|ckpt`: MLPerf Storage workloads, rules and the accelerators-per-node answer."""

from __future__ import annotations


def register(sub) -> None:
    from .. import guard
    from ..cli import add_endpoint_flag, add_json_flag

    p = sub.add_parser("mlperf", help="MLPerf Storage: simulated accelerators, AU, --find-max, datasize, checkpoints",
                       description="MLPerf Storage's training workloads (unet3d, resnet50, cosmoflow) and rules on "
                                   "iobench's loader.  See README: MLPerf Storage.")
    ms = p.add_subparsers(dest="mlperf_command", metavar="ACTION", parser_class=type(p))

    r = ms.add_parser("run", help="simulated accelerators reading a dataset: AU per accelerator, samples/s, MB/s")
    r.add_argument("dataset", metavar="DATASET_URL", help="made by `iobench gen --workload NAME`")
    r.add_argument("--workload", default="unet3d", help="unet3d | resnet50 | cosmoflow (default unet3d)")
    r.add_argument("--accelerator", default="h100", help="a100 | h100 (MLPerf's step times; others need --compute-s)")
    r.add_argument("--accelerators", type=int, default=1, metavar="N", help="simulated accelerators on this node")
    r.add_argument("--compute-s", type=float, metavar="SECONDS",
                   help="compute time per step (overrides the table: not rule-compliant)")
    r.add_argument("--epochs", type=int, default=0, help="epochs per run (default: the workload's, 5)")
    r.add_argument("--runs", type=int, default=5, help="measured runs (MLPerf: 5, their mean is the result)")
    r.add_argument("--no-warmup", action="store_true", help="skip the warm-up run (not rule-compliant)")
    r.add_argument("--min-steps", type=int, default=0, metavar="N",
                   help="at least N steps per epoch (not rule-compliant): with a cold cache, each epoch "
                        "becomes enough cold passes; otherwise its samples repeat inside it")
    r.add_argument("--no-checkpoint", action="store_true",
                   help="skip unet3d's checkpoint after epoch 5 (not rule-compliant)")
    r.add_argument("--checkpoint-folder", metavar="DIR",
                   help="where unet3d's checkpoint goes (default: a new directory beside the dataset, removed after)")
    r.add_argument("--checkpoint-scale", type=float, default=1.0, metavar="F",
                   help="write F x the checkpoint (0 < F <= 1; < 1 is not rule-compliant)")
    r.add_argument("--client-memory", metavar="SIZE", help="host memory per client node (default: this host's)")
    r.add_argument("--cache", choices=("auto", "cold", "as-is"), default="auto",
                   help="auto: cold every epoch when the dataset is under 5x client memory (default)")
    r.add_argument("--workers", type=int, default=0, help="loader workers per accelerator (default: read threads)")
    r.add_argument("--prefetch", type=int, default=0,
                   help="prefetch slots per loader worker (default 2; 4 for a TFRecord batch cut across read threads)")
    r.add_argument("--au-threshold", type=float, default=0.0, help="pass mark (default: the workload's)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--emulate", default="none", metavar="SPEC",
                   help="emulated storage (as `iobench load --emulate`), e.g. const:50ms or bw:200MB/s")
    r.add_argument("--find-max", action="store_true",
                   help="search the most accelerators per node with every AU >= threshold (grow, then bisect)")
    r.add_argument("--max-accelerators", type=int, default=64, help="--find-max search limit (default 64)")
    add_endpoint_flag(r)
    add_json_flag(r)
    guard.declare(r, guard.dataset("dataset", "DATASET_URL"), guard.not_a_path("workload", "--workload"),
                  guard.root("checkpoint_folder", "--checkpoint-folder"))
    r.set_defaults(func=run)

    d = ms.add_parser("datasize", help="files needed for a rule-compliant dataset (5x memory, 500 steps per epoch)")
    d.add_argument("--workload", default="unet3d", help="unet3d | resnet50 | cosmoflow")
    d.add_argument("--accelerators", type=int, default=1, metavar="N", help="accelerators per node")
    d.add_argument("--client-memory", required=True, metavar="SIZE", help="host memory per client node, e.g. 512GiB")
    d.add_argument("--nodes", type=int, default=1, help="client nodes (default 1)")
    add_json_flag(d)
    guard.declare(d, guard.not_a_path("workload", "--workload"))   # a workload name
    d.set_defaults(func=datasize)

    c = ms.add_parser("ckpt", help="MLPerf's llama3 checkpoint workloads: 10 writes, cache cleared, 10 reads, 5 runs")
    c.add_argument("--model", default="llama3-8b", help="llama3-8b | llama3-70b | llama3-405b | llama3-1t")
    c.add_argument("--out", required=True, metavar="DIR", help="a new or empty checkpoint directory (removed after)")
    c.add_argument("--mode", choices=("subset", "default"), default="subset",
                   help="subset: 8 processes writing their share (default); default: all TP x PP x DP ranks")
    c.add_argument("--processes", type=int, default=0, help="rank processes (default: 8, or TP x PP x DP)")
    c.add_argument("--scale", type=float, default=1.0, help="shrink the state (0 < F <= 1; < 1 not rule-compliant)")
    c.add_argument("--checkpoints", type=int, default=10, help="written, then read (MLPerf: 10)")
    c.add_argument("--interval-s", type=float, default=5.0, help="seconds between checkpoints (MLPerf: 5)")
    c.add_argument("--runs", type=int, default=5, help="runs, the result their mean (MLPerf: 5)")
    add_json_flag(c)
    guard.declare(c, guard.root("out", "--out"))
    c.set_defaults(func=ckpt)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _config(args):
    from ..mlperf.run import MlperfConfig
    from ..units import parse_size

    return MlperfConfig(dataset=args.dataset, workload=args.workload, accelerator=args.accelerator,
                        accelerators=args.accelerators, compute_s=args.compute_s, epochs=args.epochs,
                        min_steps=args.min_steps, runs=args.runs,
                        client_memory=parse_size(args.client_memory, "--client-memory") if args.client_memory else 0,
                        cache=args.cache, workers=args.workers, prefetch=args.prefetch,
                        au_threshold=args.au_threshold, seed=args.seed, endpoint_url=args.endpoint_url,
                        emulate=args.emulate, warmup=not args.no_warmup, checkpoint=not args.no_checkpoint,
                        checkpoint_folder=args.checkpoint_folder, checkpoint_scale=args.checkpoint_scale)


def _progress(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)   # stdout starts with the answer


def run(args) -> int:
    from ..errors import ConfigError
    from ..mlperf.report import print_find_max, print_run, results_for
    from ..dist.world import detect_world

    cfg = _config(args)
    cfg.resolve()   # bad workload / accelerator refused before any work
    if args.max_accelerators < 1:
        raise ConfigError("--max-accelerators", f"must be at least 1, got {args.max_accelerators}", "give e.g. 16")
    world = detect_world()
    if world.is_mpi:
        from ..config import to_dict

        world.agree("mlperf config", to_dict(cfg))   # every node runs the same workload and counts
    if args.find_max:
        from ..mlperf.findmax import find_max

        out = find_max(cfg, args.max_accelerators, world if world.size > 1 else None,
                       say=_progress if world.rank == 0 else (lambda s: None))
        if world.rank == 0:
            print_find_max(out)
    else:
        from ..mlperf.run import run_mlperf

        out = run_mlperf(cfg, world if world.size > 1 else None)
        if world.rank == 0:
            print_run(out)
    if args.json and world.rank == 0:
        res = results_for(cfg, out, find_max=args.find_max)
        res.world = world.describe()
        res.write(args.json)
    if args.find_max:
        return 0
    return 0 if out["passed"] else 1


def datasize(args) -> int:
    from ..errors import ConfigError
    from ..mlperf.rules import STEPS_PER_EPOCH
    from ..mlperf.rules import datasize as compute
    from ..mlperf.workloads import load_mlperf_workload
    from ..results import Results
    from ..units import format_bytes, parse_size

    if args.accelerators < 1 or args.nodes < 1:
        raise ConfigError("--accelerators/--nodes", "must be at least 1", "give positive counts")
    wl, gen = load_mlperf_workload(args.workload)
    mem = parse_size(args.client_memory, "--client-memory")
    per_file = int(str(gen.get("shard_size", "1 samples")).split()[0])
    ds = compute(mem, args.nodes, args.accelerators, per_file, wl.record_bytes or float(gen["record_bytes"]),
                 wl.batch_size)
    why = (f"5x the {format_bytes(mem * args.nodes)} of client memory ({format_bytes(ds.required_bytes)})"
           if ds.bound_by == "memory" else
           f"{STEPS_PER_EPOCH} steps per epoch x batch {wl.batch_size} x {args.accelerators * args.nodes} "
           "accelerator(s)")
    print(f"{ds.files} files ({ds.samples} samples, {format_bytes(ds.bytes)}) for {wl.name}: set by {why} "
          f"[{ds.source}]")
    print(f"  by memory: {ds.files_by_memory} files; by {STEPS_PER_EPOCH} steps: {ds.files_by_steps} files")
    print(f"generate: iobench gen --workload {wl.name} --num-samples {ds.samples} --out DATASET_URL")
    if args.json:
        Results(command="mlperf datasize", config={"workload": wl.name, "client_memory_bytes": mem,
                                                   "nodes": args.nodes, "accelerators": args.accelerators},
                metrics={"mlperf": {"files": ds.files, "samples": ds.samples, "bytes": ds.bytes,
                                    "required_bytes": ds.required_bytes, "samples_per_file": ds.samples_per_file,
                                    "files_by_memory": ds.files_by_memory, "files_by_steps": ds.files_by_steps,
                                    "bound_by": ds.bound_by, "source": ds.source,
                                    "sample_bytes": ds.sample_bytes}}).write(args.json)
    return 0


def ckpt(args) -> int:
    from ..dist.world import detect_world
    from ..errors import ConfigError
    from ..mlperf.checkpoint import CkptWorkload, print_ckpt, run_ckpt_workload

    if detect_world().size > 1:
        raise ConfigError("mlperf ckpt", "each checkpoint rank is a process of this command already",
                          "run it without mpirun (--mode default for every rank, --processes N)")
    w = CkptWorkload(model=args.model, out=args.out, mode=args.mode, processes=args.processes, scale=args.scale,
                     checkpoints=args.checkpoints, interval_s=args.interval_s, runs=args.runs)
    w.ranks()   # refused before any work
    out = run_ckpt_workload(w, json_path=args.json, say=_progress)
    print_ckpt(out)
    return 0
