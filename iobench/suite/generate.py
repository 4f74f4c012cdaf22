"""`iobench run` stage "generate": tokens and images in every format, locally and on S3, each verified.

Fills ``ctx.state.datasets`` for the stage and load stages.
"""

from __future__ import annotations

from .state import GeneratedDataset



SUITE_FORMATS = ("raw", "parquet", "tfrecord", "tar")
# Small enough for the embedded suite (< ~20 s for all 16 datasets on a laptop).
SUITE_SPECS = {
    "tokens": {"modality": "tokens", "num_samples": 512, "seq_len": 256, "vocab_size": 50257,
               "shard_size": "128 samples", "distribution": "zipf"},
    "images": {"modality": "images", "num_samples": 16, "shard_size": "4 samples"},
}


def suite_stage(ctx) -> dict:
    """`iobench run` stage: tokens and images in every format, locally and on S3, each verified."""
    from ..generate import GenSpec, gen_metrics, generate
    from ..results import Results
    from ..units import format_bytes
    from ..verify import verify_dataset

    locations = [("local", str(ctx.local_dir("datasets")), None, None)]
    if ctx.s3_url:
        locations.append(("s3", ctx.s3_url.rstrip("/") + "/datasets", ctx.endpoint_url, ctx.s3_storage_options))
    datasets, per_dataset = [], {}
    res = Results(command="gen", config={"suite_specs": SUITE_SPECS})
    for fmt in SUITE_FORMATS:
        ok_count, total, nbytes, secs = 0, 0, 0, 0.0
        for location, root, endpoint, opts in locations:
            for modality, base in SUITE_SPECS.items():
                name = f"{fmt}-{modality}"
                url = f"{root.rstrip('/')}/{name}"
                spec = GenSpec.from_mapping({**base, "format": fmt, "seed": 0})
                stats: dict = {}
                m = generate(spec, url, endpoint_url=endpoint, storage_options=opts, progress=False, stats=stats)
                rep = verify_dataset(url, endpoint_url=endpoint, storage_options=opts)
                total += 1
                ok_count += rep.ok
                nbytes += m.total_bytes
                secs += stats["seconds"] + rep.seconds
                per_dataset[f"{location}/{name}"] = {
                    **gen_metrics(m, stats),
                    "verify": {"ok": rep.ok, "seconds": rep.seconds,
                               "first_bad": str(rep.first_bad) if rep.first_bad else None}}
                if not rep.ok:
                    ctx.warnings.append(f"generate: {location}/{name} failed verification: {rep.first_bad}")
                datasets.append(GeneratedDataset(name=name, format=fmt, modality=modality, url=url, location=location,
                                                 storage_options=opts if location == "s3" else None,
                                                 endpoint_url=endpoint))
        ctx.row("generate", f"{fmt}: tokens+images, {'/'.join(loc for loc, *_ in locations)}",
                f"{ok_count}/{total} verified; {format_bytes(nbytes)} written and checked in {secs:.1f} s")
    ctx.state.datasets = datasets
    res.metrics = {"datasets": per_dataset, "verified": sum(d["verify"]["ok"] for d in per_dataset.values()),
                   "total": len(per_dataset)}
    path = ctx.out_dir / "generate.json"
    res.write(path)
    ctx.results_files.append(path)
    return {"datasets": len(per_dataset), "verified": res.metrics["verified"],
            "bytes": sum(d["bytes"] for d in per_dataset.values())}
