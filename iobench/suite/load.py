"""`iobench run` stage "load": every generated dataset read cold and warm, with a prefetch recommendation."""

from __future__ import annotations

import time
from dataclasses import replace

# Each load runs until its stall and P99 intervals are narrow (``--until-stable``) or for at most
# max_time_s seconds; the results carry the intervals and say when a load was not stable, so two
# identical runs can be compared on them (``iobench compare``).
_STABLE = dict(until_stable=True, min_steps=60, max_time_s=3.0)
_TOKENS = dict(workers=2, prefetch=2, batch_size=32, compute="5ms", shuffle_buffer=128, **_STABLE)
_IMAGES = dict(workers=2, prefetch=2, batch_size=4, compute="5ms", shuffle_buffer=4, decode=True, **_STABLE)
_BUDGET_S = 90.0


def suite_stage(ctx) -> dict:
    from ..config import to_dict
    from ..results import Results
    from iobench.loader.analysis import recommend
    from iobench.loader.core import LoadConfig, run_load

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
            cfg = replace(base, cache=cache)
            run = run_load(cfg, storage_options=d.storage_options)
            m = run.metrics
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
                            "steady_samples_per_s": m["throughput"]["steady_samples_per_s"],
                            "bytes_per_s": m["throughput"]["bytes_per_s"], "batch_io_p99_s": m["batch_io_s"]["p99"],
                            "residency": run.environment["cache"].get("measured_residency")}
            if cache == "cold":
                rec = m["prefetch_recommendation"]
                entry["prefetch"] = {"depth_min": rec["depth_min"], "depth_recommended": rec["depth_recommended"],
                                     "host_bytes_total": rec.get("host_bytes_total")}
        summary[key] = entry
        c, w = entry["cold"], entry["warm"]
        ctx.row("load", key, f"cold {c['steady_samples_per_s'] or 0:,.0f} samples/s stall {_ci(c)} | "
                             f"warm {w['steady_samples_per_s'] or 0:,.0f} samples/s stall {_ci(w)} | "
                             f"prefetch depth {entry['prefetch']['depth_recommended']}")
    if skipped:
        ctx.warnings.append(f"load: time budget ({_BUDGET_S:.0f} s) spent; skipped {', '.join(skipped)}")
    tiered = _tiered_load(ctx, datasets, out_dir) if ctx.state.tiers_file else None
    return {"datasets": len(summary), "skipped": skipped, "per_dataset": summary, "tiered": tiered}


def _ci(e: dict) -> str:
    ci = (e.get("intervals") or {}).get("stall_ratio") or {}
    lo, hi = ci.get("low"), ci.get("high")
    txt = f"{e['stall_ratio']:.0%}" + (f" [{lo:.0%}, {hi:.0%}]" if lo is not None and hi is not None else "")
    return txt + ("" if e.get("stable", True) else " (not stable)")


def _tiered_load(ctx, datasets: list, out_dir) -> dict | None:
    """Two epochs of the staged dataset through the tiers (on-demand into nvme): the hot tier's hit ratio."""
    from ..config import to_dict
    from ..manifest import read_manifest
    from ..results import Results
    from ..storage import open_backend
    from ..tiers import loader_source
    from iobench.loader.core import LoadConfig, run_load

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
