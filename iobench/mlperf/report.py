"""MLPerf results: the answer line, the console table and the results file.

The results file carries MLPerf Storage's vocabulary under ``metrics.mlperf`` (AU in percent,
samples/s, MB/s in decimal megabytes as MLPerf prints them, accelerators, per-rank) next to
iobench's own SI names (``accelerator_utilization`` ratio, ``throughput.bytes_per_s``).
"""

from __future__ import annotations

from ..units import format_rate


def run_headline(r: dict) -> str:
    verdict = "PASS" if r["passed"] else "FAIL"
    return (f"{verdict}: {r['accelerators']} simulated {r['accelerator'].upper()}(s) on {r['workload']}: "
            f"min AU {r['au_min']:.1%} (threshold {r['au_threshold']:.0%}), {r['samples_per_s']:.1f} samples/s, "
            f"{r['MB_per_s']:.1f} MB/s" + ("" if r["rule_compliant"] else "  [not rule-compliant]"))


def print_run(r: dict) -> None:
    print(run_headline(r))
    ci = r.get("au_ci95_worst")
    print(f"  worst accelerator: rank {r['worst_accelerator']} (95% interval {ci[0]:.1%}..{ci[1]:.1%})" if ci else
          f"  worst accelerator: rank {r['worst_accelerator']} (too few steps for an interval)")
    print("  AU per accelerator: " + ", ".join(f"{a:.1%}" for a in r["au_per_accelerator"]))
    sp = r["spread"]["au_min"]
    print(f"  {r['runs']} run(s) x {r['epochs']} epoch(s), first step excluded; min AU over runs "
          f"{sp['min']:.1%}..{sp['max']:.1%}; throughput {format_rate(r['spread']['bytes_per_s']['min'])}.."
          f"{format_rate(r['spread']['bytes_per_s']['max'])}")
    print(f"  cache: {r['cache']['mode']}; dataset {r['dataset']['files']} files, fsync at generation: "
          f"{r['dataset']['fsync_at_generation']}")
    for note in r["rule_notes"]:
        print(f"  rule: {note}")
    for w in r["warnings"]:
        print(f"  warning: {w}")


def print_find_max(out: dict) -> None:
    print(out["headline"])
    for p in out["probes"]:
        print(f"  {p['accelerators']:>3} accelerator(s): min AU {p['au_min']:.1%}"
              f"{' (marginal: interval spans the threshold)' if p['marginal'] else ''}  "
              f"{p['samples_per_s']:.1f} samples/s  {format_rate(p['throughput_bytes_per_s'])}"
              f"  {'pass' if p['passed'] else 'FAIL'}")
    if out["at_max"]:
        print(f"  at {out['max_accelerators_per_node']}: {format_rate(out['at_max']['throughput_bytes_per_s'])} "
              f"delivered per node")
    if out["next_step"]:
        n = out["next_step"]
        print(f"  at {n['accelerators']}: accelerator {n['worst_accelerator']} stalls (AU {n['au_min']:.1%}); "
              f"{n['explanation']}")


def mlperf_vocabulary(r: dict) -> dict:
    """A run in MLPerf Storage's words."""
    return {
        "workload": r["workload"], "accelerator_type": r["accelerator"], "accelerators": r["accelerators"],
        "accelerators_per_node": r["accelerators_per_node"], "nodes": r["nodes"],
        "AU_percent_min": 100 * r["au_min"], "AU_threshold_percent": 100 * r["au_threshold"],
        "AU_meets_expectation": r["passed"],
        "AU_percent_per_rank": [100 * a for a in r["au_per_accelerator"]],
        "samples_per_s": r["samples_per_s"], "MB_per_s": r["MB_per_s"],
        "per_rank": [{"rank": p["rank"], "AU_percent": 100 * p["au"], "samples_per_s": p["samples_per_s"],
                      "MB_per_s": (p["bytes_per_s"] or 0.0) / 1e6} for p in r["per_rank"]],
        "epochs": r["epochs"], "runs": r["runs"], "rule_compliant": r["rule_compliant"],
    }


def results_for(cfg, out: dict, find_max: bool = False):
    from ..config import to_dict
    from ..results import Results

    run = out["result_at_max"] if find_max else out
    metrics: dict = {}
    if run is not None:
        metrics = {"accelerator_utilization": run["au_min"], "stall_ratio": 1 - run["au_min"],
                   "first_step_excluded": True,
                   "throughput": {"samples_per_s": run["samples_per_s"], "bytes_per_s": run["throughput_bytes_per_s"]},
                   "mlperf_run": {k: v for k, v in run.items() if k not in ("per_rank", "warnings")}}
        metrics["mlperf"] = mlperf_vocabulary(run)
    if find_max:
        metrics["find_max"] = {k: v for k, v in out.items() if k != "result_at_max"}
        metrics.setdefault("mlperf", {})["max_accelerators_per_node"] = out["max_accelerators_per_node"]
        metrics["mlperf"]["headline"] = out["headline"]
    else:
        metrics["mlperf"]["headline"] = run_headline(out)
    # The report lists every metric named *recommendation (iobench.report's recommendations section).
    metrics["mlperf"]["recommendation"] = metrics["mlperf"]["headline"]
    env = {}
    if run is not None:
        env = {"cache": run["cache"], "dataset": run["dataset"], "rule_compliant": run["rule_compliant"],
               "rule_notes": run["rule_notes"], "storage": "synthetic" if run["synthetic"] else "real"}
    res = Results(command="mlperf", config=to_dict(cfg), environment=env, metrics=metrics,
                  per_rank=run["per_rank"] if run is not None else None,
                  warnings=list(run["warnings"]) if run is not None else [])
    return res
