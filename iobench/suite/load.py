"""`iobench run` stage "load": every generated dataset read cold and warm, with a prefetch recommendation."""

from __future__ import annotations

import time
from dataclasses import replace

# Each load runs until its stall and P99 intervals are within the loader's widths (``--until-stable``:
# ±2 pp, P99 ±25%, checked every 10 steps from 60) or until STEP_CAP batches: a cap on batches, not
# seconds, so two runs of the suite measure the same amount where a load does not settle, and the
# P99 has the ≥ 383 batches its upper bound needs.  TIME_GUARD_S stops a store too slow for that
# (the embedded S3 with map access: one GET per sample, ~20 batches/s); the results then say
# "time cap" and the summary row says why the load is not stable.  Images are read one per batch:
# at four per batch a decode-bound load managed ~100 batches in 3 s, too few for either interval.
STEP_CAP, TIME_GUARD_S = 800, 10.0
_STABLE = dict(until_stable=True, min_steps=60, steps=STEP_CAP, max_time_s=TIME_GUARD_S)
_TOKENS = dict(workers=2, prefetch=2, batch_size=32, compute="5ms", shuffle_buffer=128, **_STABLE)
_IMAGES = dict(workers=2, prefetch=2, batch_size=1, compute="5ms", shuffle_buffer=4, decode=True, **_STABLE)
_BUDGET_S = 240.0      # a guard only: the loads above take ~2 min on 2 cores; past it the rest are skipped
# The embedded S3 server keeps its files in this host's page cache (written seconds before) and the
# client has no cache to drop, so cold and warm are one measurement there: only cold is run.
_EMBEDDED_S3_WARM = "skipped: the embedded S3 server's files are in this host's page cache either way, so warm = cold"


def suite_stage(ctx) -> dict:
    from ..config import to_dict
    from ..results import Results
    from iobench.loader.analysis import recommend
    from iobench.loader.core import LoadConfig, run_load

    from .intervals import add_load_rate_intervals

    out_dir = ctx.out_dir / "load"
    out_dir.mkdir(parents=True, exist_ok=True)
    datasets = ctx.state.datasets
    if not datasets:
        ctx.warnings.append("load: no datasets from the generate stage; nothing loaded")
        ctx.row("load", "datasets", "none (generate stage not run)")
        return {"datasets": 0}
    t_start = time.perf_counter()
    summary: dict = {}
    skipped = []
    for d in datasets:
        if time.perf_counter() - t_start > _BUDGET_S:
            skipped.append(f"{d.location}/{d.name}")
            continue
        base = LoadConfig(dataset=d.url, endpoint_url=d.endpoint_url,
                          **(_IMAGES if d.modality == "images" else _TOKENS), monitor_interval_s=2.0)
        key = f"{d.location}/{d.name}"
        entry: dict = {}
        for cache in ("cold", "warm"):
            if cache == "warm" and d.location == "s3" and ctx.quick:
                entry[cache] = {"skipped": _EMBEDDED_S3_WARM}
                continue
            cfg = replace(base, cache=cache)
            run = run_load(cfg, storage_options=d.storage_options)
            m = run.metrics
            add_load_rate_intervals(m)
            if cache == "cold":
                m["prefetch_recommendation"] = recommend(m, cfg.compute_model().nominal_s)
            res = Results(command="load", config=to_dict(cfg), environment=run.environment, metrics=m)
            for w in run.warnings:
                res.warn(w)
            path = out_dir / f"{d.location}-{d.name}-{cache}.json"
            res.write(path)
            ctx.results_files.append(path)
            ci = m["intervals"]["stall_ratio"]
            entry[cache] = {"stall_ratio": m["stall_ratio"],
                            # read by `iobench compare`: runs whose intervals overlap agree
                            "intervals": {"stall_ratio": {"low": ci["low"], "high": ci["high"]}},
                            "stable": m["stable"], "steps": m["steps"],
                            "not_stable_because": m["stability"]["not_stable_because"],
                            "stopped": m["stability"]["stopped"],
                            **{k: m["throughput"][k] for k in ("steady_samples_per_s", "steady_samples_per_s_ci95",
                                                                "bytes_per_s", "bytes_per_s_ci95")
                               if k in m["throughput"]},
                            "batch_io_p99_s": m["batch_io_s"]["p99"],
                            "residency": run.environment["cache"].get("measured_residency")}
            if cache == "cold":
                rec = m["prefetch_recommendation"]
                entry["prefetch"] = {"depth_min": rec["depth_min"], "depth_recommended": rec["depth_recommended"],
                                     "host_bytes_total": rec.get("host_bytes_total")}
        summary[key] = entry
        ctx.row("load", key, " | ".join(_cell(cache, entry[cache]) for cache in ("cold", "warm"))
                + f" | prefetch depth {entry['prefetch']['depth_recommended']}")
    if skipped:
        ctx.warnings.append(f"load: time budget ({_BUDGET_S:.0f} s) spent; skipped {', '.join(skipped)}")
    tiered = _tiered_load(ctx, datasets, out_dir) if ctx.state.tiers_file else None
    return {"datasets": len(summary), "skipped": skipped, "per_dataset": summary, "tiered": tiered}


def _cell(cache: str, e: dict) -> str:
    if "skipped" in e:
        return f"{cache}: {e['skipped']}"
    return f"{cache} {e['steady_samples_per_s'] or 0:,.0f} samples/s stall {_ci(e)}"


def _ci(e: dict) -> str:
    ci = (e.get("intervals") or {}).get("stall_ratio") or {}
    lo, hi = ci.get("low"), ci.get("high")
    txt = f"{e['stall_ratio']:.0%}" + (f" [{lo:.0%}, {hi:.0%}]" if lo is not None and hi is not None else "")
    if e.get("stable", True):
        return txt
    return txt + f" (not stable after {e['steps']} steps, {e['stopped']}: {'; '.join(e['not_stable_because'])})"


def _tiered_load(ctx, datasets: list, out_dir) -> dict | None:
    """Two epochs of the staged dataset through the tiers (on-demand into nvme): the hot tier's hit ratio."""
    from ..config import to_dict
    from ..manifest import read_manifest
    from ..results import Results
    from ..storage import open_backend
    from ..tiers import loader_source
    from iobench.loader.core import LoadConfig, run_load

    from .intervals import add_load_rate_intervals

    d = next((x for x in datasets if x.url == ctx.state.tiers_dataset), None)
    if d is None:
        return None
    backend = open_backend(d.url, endpoint_url=d.endpoint_url, storage_options=d.storage_options)
    source = loader_source(ctx.state.tiers_file, "ondemand", read_manifest(backend), backend)
    cfg = LoadConfig(dataset=d.url, endpoint_url=d.endpoint_url, epochs=2,
                     **{k: v for k, v in (_IMAGES if d.modality == "images" else _TOKENS).items()
                        if k not in _STABLE})
    run = run_load(cfg, storage_options=d.storage_options, source=source)
    m = dict(run.metrics)
    add_load_rate_intervals(m)
    m["tiers"] = source.metrics()
    res = Results(command="load", config=to_dict(cfg) | {"staging": "ondemand"}, environment=run.environment,
                  metrics=m)
    path = out_dir / f"tiered-{d.name}.json"
    res.write(path)
    ctx.results_files.append(path)
    hit = m["tiers"].get("hit_ratio", 0.0)
    ctx.row("load", f"tiered/{d.name} (ondemand after prestage, 2 epochs)",
            f"stall {m['stall_ratio']:.0%}, hot-tier hit ratio {hit:.0%}")
    return {"dataset": d.url, "stall_ratio": m["stall_ratio"], "hit_ratio": hit}
