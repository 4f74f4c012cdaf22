"""`iobench run` stage "generate": tokens and images in every format, locally and on S3, each verified.

Fills ``ctx.state.datasets`` for the stage and load stages.
"""

from __future__ import annotations

from .state import GeneratedDataset

SUITE_FORMATS = ("raw", "parquet", "tfrecord", "tar")
# Small enough for the embedded suite, large enough that one cold pass of the load stage
# (iobench.suite.load: PASS_STEPS batches of 32 tokens samples or 1 image, 2 workers' shuffle
# buffers of 128 / 4 samples left out) reads each sample once: a second pass in the same run would
# read the page cache the first filled.  Tokens: 4096 x 256 (2 MiB raw), images: 128 (~17 MiB).
SUITE_SPECS = {
    "tokens": {"modality": "tokens", "num_samples": 4096, "seq_len": 256, "vocab_size": 50257,
               "shard_size": "1024 samples", "distribution": "zipf"},
    "images": {"modality": "images", "num_samples": 128, "shard_size": "32 samples"},
}
# One generation of these takes ~0.1-0.5 s: a single one is no throughput (two identical runs
# differed by more than 10% on 18 of them).  Each dataset is generated again into scratch directories
# in ROUNDS rounds spread over the run like the probe's repeats (``SuiteContext.repeated``: one round at
# the stage's place, one before each of load passes 3-5 (ROUND_POINTS), one after the checkpoint
# stage); five, not three, because the interval is over the rounds: t(4)/sqrt(5) = 1.24 sd against
# t(2)/sqrt(3) = 2.48 sd (three rounds gave rates whose intervals spanned 5-80x).  A round times each
# dataset, round-robin over the datasets, until it has ROUND_MIN_S seconds of timings (at most
# ROUND_MAX) and removes its scratch copies.  The throughput is bytes / geometric-mean time over the
# rounds, with the Student t 95% interval over the rounds' mean log times (``bytes_per_s_ci95``), which
# `iobench compare` reads.  All rounds back to back at the stage's place (before) covered only its
# ~20 s: other work on the host for those seconds (load average 4.9 in one run, 1.0 in the next: pair 6
# in reports/reference/repeat.md) made every generation 1.2-2.6x slower and fell outside the interval.
# The first generation of each dataset (the one the later stages use) is not a timing: it also pays
# for one-time imports and connections (the run's very first one took 3-8x its repeats).
ROUNDS, ROUND_POINTS, ROUND_MAX, ROUND_MIN_S = 5, (2, 3, 4), 7, 0.2


def suite_stage(ctx) -> dict | None:
    """`iobench run` stage: tokens and images in every format, locally and on S3, each verified."""
    from ..generate import GenSpec, gen_metrics, generate
    from ..results import Results
    from ..units import format_bytes
    from ..verify import verify_dataset

    locations = [("local", str(ctx.local_dir("datasets")), None, None)]
    if ctx.s3_url:
        locations.append(("s3", ctx.s3_url.rstrip("/") + "/datasets", ctx.endpoint_url, ctx.s3_storage_options))
    datasets, per_dataset = [], {}
    timings: dict[str, tuple] = {}     # key -> (spec, location root, endpoint, options)
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
                timings[f"{location}/{name}"] = (spec, root, endpoint, opts)
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
    return ctx.repeated("generate", lambda: _timing_round(timings), lambda rounds: _finish(ctx, res, per_dataset, rounds),
                        repeats=ROUNDS, points=ROUND_POINTS)


def _finish(ctx, res, per_dataset: dict, rounds: list[dict]) -> dict:
    """The rounds' timings (``_timing_round``) into each dataset's throughput; writes generate.json."""
    for key, d in per_dataset.items():
        d["throughput"] = _throughput(d["bytes"], d["samples"], [r[key] for r in rounds])
    res.metrics = {"datasets": per_dataset, "verified": sum(d["verify"]["ok"] for d in per_dataset.values()),
                   "total": len(per_dataset)}
    path = ctx.out_dir / "generate.json"
    res.write(path)
    ctx.results_files.append(path)
    return {"datasets": len(per_dataset), "verified": res.metrics["verified"],
            "bytes": sum(d["bytes"] for d in per_dataset.values())}


def _timing_round(timings: dict) -> dict[str, list[float]]:
    """One round: timed generations of each dataset into scratch directories (``<root>/.repeats``,
    removed at the end of the round), until each has ROUND_MIN_S seconds of them (at most ROUND_MAX).
    Round-robin over the datasets, not one dataset's generations in a row: a burst of other work on the
    machine then lands in one timing of many datasets instead of in every timing of one."""
    from ..generate import generate
    from ..storage import open_backend

    seconds: dict[str, list[float]] = {key: [] for key in timings}

    def wanted(t: list[float]) -> bool:
        return len(t) < ROUND_MAX and sum(t) < ROUND_MIN_S

    scratch = {(root, endpoint): opts for _, root, endpoint, opts in timings.values()}
    try:
        k = 0
        while any(wanted(t) for t in seconds.values()):
            for key, (spec, root, endpoint, opts) in timings.items():
                if wanted(seconds[key]):
                    stats: dict = {}
                    generate(spec, f"{root.rstrip('/')}/.repeats/{k}/{key.split('/', 1)[1]}", endpoint_url=endpoint,
                             storage_options=opts, progress=False, stats=stats)
                    seconds[key].append(stats["seconds"])
            k += 1
    finally:  # the suite's own scratch copies: nothing else lives under .repeats
        for (root, endpoint), opts in scratch.items():
            backend = open_backend(f"{root.rstrip('/')}/.repeats", endpoint_url=endpoint, storage_options=opts,
                                   field_name="work_dir")
            if backend.fs.exists(backend.root):
                backend.fs.rm(backend.root, recursive=True)
    return seconds


def _throughput(nbytes: int, samples: int, rounds: list[list[float]]) -> dict:
    """Bytes and samples per second over the rounds' timings, each with its 95% interval over the
    rounds (a round's geometric-mean time is one value: its timings lie seconds apart, the rounds
    minutes apart, and what differs between runs is what the rounds see)."""
    from statistics import geometric_mean

    from iobench.loader.stability import mean_interval, rate_interval

    per_round = [geometric_mean(r) for r in rounds]
    out: dict = {"repeats": sum(len(r) for r in rounds), "rounds": len(rounds),
                 "seconds": mean_interval([t for r in rounds for t in r]),
                 "round_seconds": per_round,
                 "method": "bytes / geometric-mean time of the rounds' geometric-mean times; interval: Student t "
                           "over the rounds' mean log times, 95%"}
    for key, amount in (("bytes_per_s", nbytes), ("samples_per_s", samples)):
        r = rate_interval(amount, per_round)
        out[key] = r["value"]
        if r["low"] is not None and r["high"] is not None:
            out[f"{key}_ci95"] = [r["low"], r["high"]]
    return out
