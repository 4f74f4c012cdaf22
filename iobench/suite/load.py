"""`iobench run` stage "load": every generated dataset read cold and warm, with a prefetch recommendation."""

from __future__ import annotations

from ..schema import STALL_RATIO
import time
from dataclasses import replace

# Each load is measured in PASSES passes, round-robin over the loads (pass 1 of every load, then pass
# 2, ...), and on the embedded S3 each pass runs on its own server instance (restarted between passes,
# same data and endpoint).  One load's interval covers only the noise of its few seconds: two identical
# `make run`s differed by 10-16% on S3 rates whose within-load intervals were ±2-4%, and a locked
# experiment (reports/reference/repeat.md) showed the same load move 2x between minutes when other work
# ran on the host.  The merged result (``intervals.merge_passes``) states rates and the stall as the mean
# of the passes with a Student t interval over them, i.e. it covers the between-pass (time, server
# instance) spread; P99s pool the passes' batches.
# Five short passes, not three long ones: t(4)·sd/√5 = 1.24 sd against t(2)·sd/√3 = 2.48 sd for
# the same batches (with 3 × 200, intervals were up to ±60% on a busy host).
# A pass runs PASS_STEPS batches (PASS_GUARD_S stops a slow store: the embedded S3 with map access does
# ~20 batches/s): a cap on batches, not seconds, so two runs measure the same amount; the passes
# together give the ≥ 383 batches a P99's upper bound needs.  Images are read one per batch: at four
# per batch a decode-bound load managed ~100 batches in 3 s.
PASSES, PASS_STEPS, PASS_GUARD_S = 5, 120, 2.5
_PASS = dict(until_stable=True, min_steps=60, steps=PASS_STEPS, max_time_s=PASS_GUARD_S)  # the guard needs until_stable
_TOKENS = dict(workers=2, prefetch=2, batch_size=32, compute="5ms", shuffle_buffer=128, **_PASS)
_IMAGES = dict(workers=2, prefetch=2, batch_size=1, compute="5ms", shuffle_buffer=4, decode=True, **_PASS)
_BUDGET_S = 240.0      # a guard only: the loads take ~2 min on 2 cores; past it no further pass starts
# The embedded S3 server keeps its files in this host's page cache (written seconds before) and the
# client has no cache to drop, so cold and warm are one measurement there: only cold is run.
_EMBEDDED_S3_WARM = "skipped: the embedded S3 server's files are in this host's page cache either way, so warm = cold"
# The embedded run's local datasets are a few MiB, read faster than the 5 ms compute step: in two runs
# (reports/reference/repeat.md, pair 5) cold and warm agreed within their intervals on all 8 local datasets,
# rates and stall.  Only cold is run there (a third of the load stage's time); a --config run does both.
_EMBEDDED_LOCAL_WARM = ("skipped: on the embedded run's few-MiB local datasets warm = cold within the intervals "
                        "(reports/reference/repeat.md); a --config run measures warm")


def suite_stage(ctx) -> dict:
    from ..config import to_dict
    from ..results import Results
    from iobench.driver import Dataset, DriveConfig, default_host_ceiling, measure
    from iobench.loader.analysis import recommend
    from iobench.loader.core import LoadConfig
    from iobench.manifest import read_manifest
    from iobench.storage import open_backend

    from iobench.report.format import prefetch_advice

    from .intervals import merge_passes

    out_dir = ctx.out_dir / "load"
    out_dir.mkdir(parents=True, exist_ok=True)
    datasets = ctx.state.datasets
    if not datasets:
        ctx.warnings.append("load: no datasets from the generate stage; nothing loaded")
        ctx.row("load", "datasets", "none (generate stage not run)")
        return {"datasets": 0}
    t_start = time.perf_counter()
    plan, summary = [], {}
    for d in datasets:
        base = LoadConfig(dataset=d.url, endpoint_url=d.endpoint_url,
                          **(_IMAGES if d.modality == "images" else _TOKENS), monitor_interval_s=2.0)
        summary[d.key] = {}
        for cache in ("cold", "warm"):
            if cache == "warm" and ctx.quick:
                summary[d.key][cache] = {"skipped": _EMBEDDED_S3_WARM if d.location == "s3" else _EMBEDDED_LOCAL_WARM}
            else:
                plan.append((d, replace(base, cache=cache)))
    manifests = {d.key: read_manifest(open_backend(d.url, endpoint_url=d.endpoint_url,
                                                   storage_options=d.storage_options)) for d in datasets}
    mode = default_host_ceiling()
    outcomes: dict = {}        # (dataset key, cache) -> [driver outcome, ...]
    passes: dict = {}          # (dataset key, cache) -> [run, ...]
    instances: list = []       # per pass: the embedded S3 server instance it ran on (None: not embedded)
    skipped = []
    for p in range(PASSES):
        if p and time.perf_counter() - t_start > _BUDGET_S:
            skipped.append(f"passes {p + 1}-{PASSES}")
            break
        if p and ctx.restart_object_store is not None:
            ctx.restart_object_store()
        if p:
            ctx.spread_point(p)  # the spread stages' repeats between passes (SuiteContext.repeated)
        instances.append(p if ctx.restart_object_store is not None else None)
        for d, cfg in plan:
            # the one measurement driver: residency before/after, the host's ceiling (calibrated on the first
            # pass, cached), what storage delivered counting fills, and the bound
            # a cold pass stops at the end of one epoch (a second would read the page cache the first filled):
            # the embedded datasets hold PASS_STEPS batches in one (iobench.suite.generate.SUITE_SPECS)
            o = measure(DriveConfig(load=cfg, host_ceiling=mode if p == 0 else "cached" if mode != "off" else "off",
                                    ceiling_time_s=1.0),
                        Dataset(url=d.url, format=manifests[d.key].format), manifests[d.key], d.storage_options)
            outcomes.setdefault((d.key, cfg.cache), []).append(o)
            passes.setdefault((d.key, cfg.cache), []).append(o.run)
    for d, cfg in plan:
        runs = passes[(d.key, cfg.cache)]
        m = merge_passes([r.metrics for r in runs], runs[0].metrics["stability"]["rule"],
                         instances if d.location == "s3" else None)
        if cfg.cache == "cold":
            m["prefetch_recommendation"] = recommend(m, cfg.compute_model().nominal_s)
        run = runs[0]
        m["drive"] = _drive_summary(outcomes[(d.key, cfg.cache)])
        res = Results(command="load", config=to_dict(cfg) | {"passes": len(runs)}, environment=run.environment,
                      metrics=m)
        for w in sorted({w for r in runs for w in r.warnings}):
            res.warn(w)
        path = out_dir / f"{d.location}-{d.name}-{cfg.cache}.json"
        res.write(path)
        ctx.results_files.append(path)
        ci = m["intervals"][STALL_RATIO]
        entry = summary[d.key]
        entry[cfg.cache] = {STALL_RATIO: m[STALL_RATIO],
                            # read by `iobench compare`: runs whose intervals overlap agree
                            "intervals": {STALL_RATIO: {"low": ci["low"], "high": ci["high"]}},
                            "stable": m["stable"], "steps": m["steps"], "passes": len(runs),
                            "not_stable_because": m["stability"]["not_stable_because"],
                            "stopped": m["stability"]["stopped"],
                            **{k: m["throughput"][k] for k in ("steady_samples_per_s", "steady_samples_per_s_ci95",
                                                                "bytes_per_s", "bytes_per_s_ci95")
                               if k in m["throughput"]},
                            "batch_io_p99_s": m["batch_io_s"]["p99"],
                            "residency": run.environment["cache"].get("measured_residency"),
                            "residency_after": run.environment["cache"].get("residency_after"),
                            "bound": m["drive"]["bound"], "cause": m["drive"]["cause"],
                            "capacity_bytes_per_s": m["drive"]["capacity_bytes_per_s"],
                            "host_ceiling_bytes_per_s": m["drive"]["host_ceiling_bytes_per_s"]}
        if cfg.cache == "cold":
            rec = m["prefetch_recommendation"]
            entry["prefetch"] = {k: rec.get(k) for k in ("depth_min", "depth_recommended", "host_bytes_total",
                                                         "workers_recommended", "prefetch_factor_recommended",
                                                         "depth_total")}
    for key, entry in summary.items():
        cells = [_cell(cache, entry[cache]) for cache in ("cold", "warm")]
        advice = prefetch_advice(entry.get("prefetch") or {})
        ctx.row("load", key, "; ".join([t for t, _ in cells if t] + ([advice] if advice else [])),
                notes=tuple(n for _, ns in cells for n in ns))
    if skipped:
        ctx.warnings.append(f"load: time budget ({_BUDGET_S:.0f} s) spent; skipped {', '.join(skipped)}")
    tiered = _tiered_load(ctx, datasets, out_dir) if ctx.state.tiers_file else None
    return {"datasets": len(summary), "skipped": skipped, "passes": len(instances),
            "server_instances": len([i for i in instances if i is not None]) or None,
            "per_dataset": summary, "tiered": tiered}


def _drive_summary(outcomes: list) -> dict:
    """The driver's judgement over a load's passes: the median capacity, the host's ceiling, the
    bound most passes found (host-bound when storage delivered within 20% of what the host reads)."""
    import statistics

    caps = [o.rates.capacity_bytes_per_s for o in outcomes if o.rates.capacity_bytes_per_s]
    bounds = [o.judgement.bound for o in outcomes]
    bound = max(set(bounds), key=bounds.count)
    pick = next(o for o in outcomes if o.judgement.bound == bound)
    ceiling = next((o.ceiling for o in outcomes if o.ceiling is not None), None)
    return {"capacity_bytes_per_s": statistics.median(caps) if caps else None,
            "host_ceiling_bytes_per_s": ceiling.bytes_per_s if ceiling else None,
            "bound": bound, "bounds": bounds, "cause": pick.judgement.cause, "advice": pick.judgement.advice,
            "warmup_share": statistics.median(o.warmup.share for o in outcomes),
            "passes": [o.to_dict() for o in outcomes]}


# Caveats the run's table prints once each as a footnote (iobench.suite.report.print_summary).
_NOT_STABLE = (f"not stable: after the {PASSES} passes the stall's interval is wider than ±2 pp or the P99's than "
               "±25%; each load's reasons are its results' stability.not_stable_because")
_HOST_BOUND = "host-bound: storage delivered within 20% of what this host's read path reaches: a lower bound"


def _cell(cache: str, e: dict) -> tuple[str, list[str]]:
    """A load's part of its table row, and the caveats it needs."""
    if "skipped" in e:
        return "", [f"{cache} not measured: {e['skipped']}"]
    ci = (e.get("intervals") or {}).get(STALL_RATIO) or {}
    lo, hi = ci.get("low"), ci.get("high")
    text = f"{cache} {e['steady_samples_per_s'] or 0:,.0f} samples/s, stall {e[STALL_RATIO]:.0%}" + \
        (f" [{lo:.0%}–{hi:.0%}]" if lo is not None and hi is not None else "")
    notes = []
    if not e.get("stable", True):
        notes.append(_NOT_STABLE)
    if e.get("bound") == "host":
        notes.append(_HOST_BOUND)
    return text, notes


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
                        if k not in _PASS})
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
            f"stall {m[STALL_RATIO]:.0%}, hot-tier hit ratio {hit:.0%}")
    return {"dataset": d.url, STALL_RATIO: m[STALL_RATIO], "hit_ratio": hit}
