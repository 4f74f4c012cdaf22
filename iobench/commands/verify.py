from __future__ import annotations


def register(sub) -> None:
    from .. import guard
    from ..cli import add_endpoint_flag, add_json_flag, add_storage_option_flag

    p = sub.add_parser("verify", help="check a dataset's shards against its manifest (exit 1 on corruption)")
    p.add_argument("url", metavar="DATASET_URL", help="dataset root: local path, s3://bucket/prefix, memory://name")
    p.add_argument("--no-samples", action="store_true", help="skip counting samples (size and checksum only)")
    p.add_argument("--no-checksums", action="store_true",
                   help="skip checksums (size and sample count only; what a manifest from `iobench index` allows)")
    add_endpoint_flag(p)
    add_storage_option_flag(p)
    add_json_flag(p)
    guard.declare(p, guard.dataset("url", "DATASET_URL"))
    p.set_defaults(func=run)


def run(args) -> int:
    from ..results import Results
    from ..units import format_bytes
    from ..verify import verify_dataset

    import sys

    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn("[bold]verify"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  disable=not sys.stderr.isatty(), transient=True, console=Console(stderr=True)) as prog:
        task = prog.add_task("verify", total=None)

        def on_shard(shard, nbytes):
            prog.update(task, advance=nbytes)

        from ..storage import parse_storage_options

        report = verify_dataset(args.url, endpoint_url=args.endpoint_url,
                                storage_options=parse_storage_options(args.storage_option) or None, count_samples=not args.no_samples,
                                checksums=not args.no_checksums, on_shard=on_shard)
    if report.ok:
        print(f"OK: {report.shards_checked} shards, {report.samples_checked} samples, "
              f"{format_bytes(report.bytes_checked)} match the manifest ({report.seconds:.2f} s)")
    elif report.shards == 0:
        print(f"NOT A DATASET: {report.first_bad}")
    else:
        print(f"CORRUPT: first bad shard {report.first_bad}; {len(report.problems)} of {report.shards} shards bad")
    if args.json:
        res = Results(command="verify", config={"url": args.url},
                      environment={"storage": {"url": args.url, "endpoint_url": args.endpoint_url}},
                      metrics={"ok": report.ok, "shards": report.shards, "shards_bad": len(report.problems),
                               "bytes": report.bytes_checked, "samples": report.samples_checked,
                               "seconds": report.seconds,
                               "throughput": {"bytes_per_s": report.bytes_checked / max(report.seconds, 1e-9)},
                               "first_bad": report.to_dict()["first_bad"],
                               "problems": [str(p) for p in report.problems],
                               "stray_files": list(report.stray_files)})
        for w in report.warnings:
            res.warn(w)
        if not report.ok:
            res.warn(f"dataset is corrupt: {report.first_bad}")
        res.write(args.json)
    return 0 if report.ok else 1
