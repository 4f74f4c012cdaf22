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
# One generation of these takes ~0.1-0.5 s: a single one is no throughput (two identical runs
# differed by more than 10% on 18 of them).  Each dataset is generated again into scratch
# directories (removed at once) until there are at least REPEATS_MIN timings and REPEATS_MIN_S
# seconds of them (at most REPEATS_MAX); the throughput is bytes / geometric-mean time, with the
# Student t 95% interval of the mean log time (``bytes_per_s_ci95``), which `iobench compare` reads.
REPEATS_MIN, REPEATS_MAX, REPEATS_MIN_S = 3, 20, 0.5


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
                seconds = [stats["seconds"]] + _repeat(spec, f"{root.rstrip('/')}/.repeats/{name}", stats["seconds"],
                                                       endpoint, opts)
                rep = verify_dataset(url, endpoint_url=endpoint, storage_options=opts)
                total += 1
                ok_count += rep.ok
                nbytes += m.total_bytes
                secs += stats["seconds"] + rep.seconds
                per_dataset[f"{location}/{name}"] = {
                    **gen_metrics(m, stats), "throughput": _throughput(m.total_bytes, m.total_samples, seconds),
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


def _repeat(spec, scratch: str, first_s: float, endpoint, opts) -> list[float]:
    """More timed generations of ``spec``, each into a fresh directory under ``scratch`` (removed after)."""
    from ..generate import generate
    from ..storage import open_backend

    seconds: list[float] = []
    try:
        while len(seconds) + 1 < REPEATS_MAX and (len(seconds) + 1 < REPEATS_MIN
                                                   or first_s + sum(seconds) < REPEATS_MIN_S):
            stats: dict = {}
            generate(spec, f"{scratch}/{len(seconds)}", endpoint_url=endpoint, storage_options=opts,
                     progress=False, stats=stats)
            seconds.append(stats["seconds"])
    finally:  # the suite's own scratch copies: nothing else lives under .repeats
        backend = open_backend(scratch, endpoint_url=endpoint, storage_options=opts, field_name="work_dir")
        if backend.fs.exists(backend.root):
            backend.fs.rm(backend.root, recursive=True)
    return seconds


def _throughput(nbytes: int, samples: int, seconds: list[float]) -> dict:
    """Bytes and samples per second over the repeats, each with its 95% interval (see REPEATS_MIN)."""
    from iobench.loader.stability import mean_interval, rate_interval

    out: dict = {"repeats": len(seconds), "seconds": mean_interval(seconds),
                 "method": "bytes / geometric-mean time of the repeats; interval: Student t on the log times, 95%"}
    for key, amount in (("bytes_per_s", nbytes), ("samples_per_s", samples)):
        r = rate_interval(amount, seconds)
        out[key] = r["value"]
        if r["low"] is not None and r["high"] is not None:
            out[f"{key}_ci95"] = [r["low"], r["high"]]
    return out
