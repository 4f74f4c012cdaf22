"""The `gds` stage of `iobench run`: probe the paths, then measure the cpu path on a small file."""

from __future__ import annotations

import warnings


def suite_stage(ctx) -> dict | None:
    from iobench.config import build, to_dict
    from iobench.results import Results

    from iobench.gds import GdsFallbackWarning, detect
    from iobench.gds.bench import GdsBenchConfig, run_bench

    work = ctx.local_dir("gds")
    target = str(work / "gds-cpu.bin")
    size = "32MiB" if ctx.quick else "256MiB"
    cfg = build(GdsBenchConfig, {"target": target, "create": size, "paths": ["cpu"], "io_sizes": ["128KiB", "4MiB"],
                                 "threads": [1, 4], "cache": ["cold", "warm"], "qd1_samples": 100,
                                 "qd1_max_seconds": 0.5, "probe_timeout_s": 15}, "gds")
    pr = detect.probe(str(work), timeout_s=cfg.probe_timeout_s)
    # Each cell reads 32 MiB in a fraction of a second: the bench runs REPEATS times and every rate
    # is the mean with its 95% interval (suite.intervals), so two runs compare on intervals.  The
    # repeats are spread over the run (ctx.repeated): back to back they missed the memory/disk drift.
    def measure():
        res = Results(command="gds bench", config=to_dict(cfg))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GdsFallbackWarning)
            run_bench(cfg, results=res, probe=pr)
        return res

    return ctx.repeated("gds", measure, lambda runs: _finish(ctx, cfg, pr, runs))


def _finish(ctx, cfg, pr, runs: list) -> dict:
    from iobench.units import format_rate, format_seconds

    from .intervals import REPEATS_NOTE, merge_repeats

    results = runs[0]
    results.metrics = merge_repeats([r.metrics for r in runs])
    results.metrics["repeats"] = dict(REPEATS_NOTE)
    for r in runs[1:]:
        for w in r.warnings:
            results.warn(w)
    out = {"metrics": results.metrics}
    path = results.write(ctx.out_dir / "gds.json")
    ctx.results_files.append(path)
    caps = pr.capabilities
    for name, cap in caps.items():
        ctx.row("gds", f"path {name}", "available" if cap.available else "unavailable",
                notes=() if cap.available else (f"unavailable: {cap.reasons[0]}",))   # one footnote for many paths
    cells = out["metrics"]["cells"]
    metrics: dict = {"paths_available": [n for n, c in caps.items() if c.available], "best_path": pr.best(),
                     "all_verified": out["metrics"]["all_verified"], "cpu": {}}
    for state in cfg.cache:
        mine = [c for c in cells if c["cache"]["declared"] == state]
        if not mine:
            continue
        best = max(mine, key=lambda c: c["throughput"]["bytes_per_s"])
        lat = next((c["latency_qd1_s"] for c in mine if c["io_size_bytes"] == min(x["io_size_bytes"] for x in mine)),
                   {})
        metrics["cpu"][state] = {"bytes_per_s": best["throughput"]["bytes_per_s"],
                                 "bytes_per_s_ci95": best["throughput"].get("bytes_per_s_ci95"),
                                 "io_size_bytes": best["io_size_bytes"],
                                 "threads": best["threads"], "cpu_s_per_gb": best["cpu_s_per_gb"],
                                 "resident_ratio": best["cache"]["resident_ratio"], "qd1_p99_s": lat.get("p99")}
        note = "" if best["cache"]["verified"] else " (cache state not verified)"
        ctx.row("gds", f"cpu path, {state} cache{note}",
                f"{format_rate(best['throughput']['bytes_per_s'])} at {best['io_size_bytes'] // 1024} KiB × "
                f"{best['threads']}; QD1 p99 {format_seconds(lat['p99']) if lat.get('p99') else '-'}")
    for w in results.warnings:
        ctx.warnings.append(f"gds: {w}")
    return metrics
