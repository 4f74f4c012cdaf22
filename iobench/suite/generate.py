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
# directories (removed at the end), round-robin over the datasets, until each has at least
# REPEATS_MIN timings and REPEATS_MIN_S seconds of them (at most REPEATS_MAX); the throughput is bytes / geometric-mean time, with the
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
    timings: dict[str, tuple] = {}     # key -> (spec, location root, endpoint, options, [seconds])
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
                timings[f"{location}/{name}"] = (spec, root, endpoint, opts, [stats["seconds"]])
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
    _repeat_round_robin(timings)
    for key, (_, _, _, _, seconds) in timings.items():
        d = per_dataset[key]
        d["throughput"] = _throughput(d["bytes"], d["samples"], seconds)
    res.metrics = {"datasets": per_dataset, "verified": sum(d["verify"]["ok"] for d in per_dataset.values()),
                   "total": len(per_dataset)}
    path = ctx.out_dir / "generate.json"
    res.write(path)
    ctx.results_files.append(path)
    return {"datasets": len(per_dataset), "verified": res.metrics["verified"],
            "bytes": sum(d["bytes"] for d in per_dataset.values())}


def _repeat_round_robin(timings: dict) -> None:
    """More timed generations of each dataset, into scratch directories (``<root>/.repeats``, removed
    after), appended to its seconds.  Round-robin over the datasets, not one dataset's repeats in a
    row: a burst of other work on the machine then lands in one repeat of many datasets (and widens
    their intervals) instead of in every repeat of one (and shifts it, interval and all)."""
    from ..generate import generate
    from ..storage import open_backend

    def wanted(seconds: list[float]) -> bool:
        return len(seconds) < REPEATS_MAX and (len(seconds) < REPEATS_MIN or sum(seconds) < REPEATS_MIN_S)

    scratch = {(root, endpoint): opts for _, root, endpoint, opts, _ in timings.values()}
    try:
        k = 0
        while any(wanted(t[4]) for t in timings.values()):
            for key, (spec, root, endpoint, opts, seconds) in timings.items():
                if wanted(seconds):
                    stats: dict = {}
                    generate(spec, f"{root.rstrip('/')}/.repeats/{k}/{key.split('/', 1)[1]}", endpoint_url=endpoint,
                             storage_options=opts, progress=False, stats=stats)
                    seconds.append(stats["seconds"])
            k += 1
    finally:  # the suite's own scratch copies: nothing else lives under .repeats
        for (root, endpoint), opts in scratch.items():
            backend = open_backend(f"{root.rstrip('/')}/.repeats", endpoint_url=endpoint, storage_options=opts,
                                   field_name="work_dir")
            if backend.fs.exists(backend.root):
                backend.fs.rm(backend.root, recursive=True)


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
