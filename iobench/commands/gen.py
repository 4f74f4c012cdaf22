from __future__ import annotations

# flag -> GenSpec field; flags override the workload, --set gen.KEY=VALUE overrides both.
_FLAGS = {"format": "format", "modality": "modality", "num_samples": "num_samples", "shard_size": "shard_size",
          "compression": "compression", "seed": "seed", "workers": "workers", "seq_len": "seq_len",
          "vocab_size": "vocab_size", "token_dtype": "token_dtype", "distribution": "distribution",
          "checksum": "checksum", "scale": "scale"}


def register(sub) -> None:
    from .. import guard
    from ..cli import add_endpoint_flag, add_json_flag, add_set_flag

    p = sub.add_parser("gen", help="generate a sharded synthetic dataset (tokens or JPEG images)")
    p.add_argument("--workload", metavar="NAME|FILE",
                   help="named workload (llm-tokens, imagenet-like, unet3d, resnet50, cosmoflow) or YAML file")
    p.add_argument("--format", help="raw | parquet | tfrecord | tar | npz | npy | megatron | hdf5 | arrow | files "
                                    "(one file per sample: the small-file baseline)")
    p.add_argument("--modality", help="tokens | images | records (opaque samples of record_bytes ± stdev, MLPerf-style)")
    p.add_argument("--num-samples", metavar="N", help="number of samples")
    p.add_argument("--shard-size", metavar="SIZE", help="shard rotation: bytes (64MiB) or a count ('1000 samples')")
    p.add_argument("--compression", metavar="C", help="none | zstd:LEVEL")
    p.add_argument("--seed", metavar="N", help="random seed; same seed -> byte-identical dataset")
    p.add_argument("--workers", metavar="N", help="parallel writers (default 0: one per core, at most one per shard)")
    p.add_argument("--seq-len", metavar="N", help="tokens per sample")
    p.add_argument("--vocab-size", metavar="N", help="vocabulary size (ids < N)")
    p.add_argument("--token-dtype", metavar="T", help="auto | uint16 | uint32")
    p.add_argument("--distribution", metavar="D", help="token ids: uniform | zipf")
    p.add_argument("--checksum", metavar="ALGO", help="per-shard checksum: xxh64 | crc32c")
    p.add_argument("--scale", type=float, metavar="F",
                   help="records: shrink sample sizes by F (0 < F <= 1), e.g. --workload unet3d --scale 0.001")
    p.add_argument("--out", required=True, metavar="URL", help="dataset root: local path, s3://bucket/prefix, memory://name")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_endpoint_flag(p)
    add_set_flag(p)
    add_json_flag(p)
    guard.declare(p, guard.in_file("workload", "--workload"), guard.out_dir("out", "--out", owner="dataset"))
    p.set_defaults(func=run)


def spec_from_args(args):
    from ..config import command_section
    from ..generate import GenSpec

    flags = {field: getattr(args, flag, None) for flag, field in _FLAGS.items()}
    section = command_section(args.workload, "gen", flags, args.set, "iobench gen")
    return GenSpec.from_mapping(section, "gen")


def run(args) -> int:
    import sys

    from ..dist import detect_world
    from ..generate import gen_metrics, generate
    from ..results import Results
    from ..units import format_bytes, format_rate

    spec = spec_from_args(args)
    world = detect_world()
    if world.is_mpi:
        world.agree("gen config", {"gen": spec.resolved(), "out": args.out, "endpoint_url": args.endpoint_url})
    stats: dict = {}
    manifest = generate(spec, args.out, endpoint_url=args.endpoint_url,
                        progress=not args.no_progress and sys.stderr.isatty() and world.size == 1, stats=stats,
                        world=world, force=args.force)
    if manifest is None:        # another rank than 0: its shards are in rank 0's manifest and results
        return 0
    secs = max(stats["seconds"], 1e-9)
    import resource

    # ru_maxrss is in KiB on Linux; RUSAGE_CHILDREN reports the largest finished writer process.
    peak_parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    metrics = gen_metrics(manifest, stats, world.hosts if world.size > 1 else None)
    metrics["peak_rss_bytes"] = {"parent": peak_parent, "largest_writer": peak_child or None}
    print(f"wrote {manifest.total_samples} {spec.modality} samples in {len(manifest.shards)} {spec.format} shards "
          f"({format_bytes(manifest.total_bytes)}) to {args.out} in {secs:.2f} s "
          f"({format_rate(manifest.total_bytes / secs)}) with {stats['workers']} "
          f"writer{'s' if stats['workers'] != 1 else ''}" + (f" per rank, {world.size} ranks" if world.size > 1 else ""))
    if world.size > 1:
        print(f"world: {metrics['world']['straggler']['line']}")
    if args.json:
        from ..dist.aggregate import tag_ranks

        res = Results(command="gen", config={"gen": manifest.spec, "out": args.out}, world=world.describe(),
                      environment={"storage": {"url": args.out, "endpoint_url": args.endpoint_url}}, metrics=metrics,
                      per_rank=tag_ranks(stats["per_rank"], world.hosts) if world.size > 1 else None)
        res.write(args.json)
    return 0
