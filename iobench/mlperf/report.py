"""MLPerf results: the answer line, the console table and the results file.

The results file carries MLPerf Storage's vocabulary under ``metrics.mlperf`` (AU in percent,
samples/s, MB/s in decimal megabytes as MLPerf prints them, accelerators, per-rank) next to
iobench's own SI names (``accelerator_utilization`` ratio, ``throughput.bytes_per_s``).
"""

from __future__ import annotations

from ..schema import STALL_RATIO
from ..units import format_rate


def run_headline(r: dict) -> str:
    verdict = "PASS" if r["passed"] else "FAIL"
    return (f"{verdict}: {r['accelerators']} simulated {r['accelerator'].upper()}(s) on {r['workload']}: "
            f"AU {r['au']:.1%} (mean over ranks and epochs; threshold {r['au_threshold']:.0%}), "
            f"{r['samples_per_s']:.1f} samples/s, {r['MB_per_s_read']:.1f} MB/s read; {r['rule_verdict']}")


def print_run(r: dict) -> None:
    print(run_headline(r))
    ci = r.get("au_ci95_worst")
    print("  AU per run: " + ", ".join(f"{a:.1%}" for a in r["au_per_run"]) +
          f"; worst accelerator: rank {r['worst_accelerator']} at {r['au_min']:.1%}" +
          (f" (95% interval {ci[0]:.1%}..{ci[1]:.1%})" if ci else ""))
    print(f"  MB/s: {r['MB_per_s_read']:.1f} MB/s read (10^6 B/s of bytes read), {r['MiB_per_s_dlio']:.1f} MiB/s as "
          f"DLIO prints it (samples/s x record length {r['record_length_bytes']:.0f} B / 2^20)")
    print(f"  {'1 warm-up run + ' if r['warmup_run'] else ''}{r['runs']} run(s) x {r['epochs']} epoch(s) x "
          f"{r['steps_per_epoch']} steps, first step of every epoch excluded; cache: {r['cache']['mode']}")
    if r.get("checkpoint"):
        c = r["checkpoint"]
        print(f"  checkpoint: {c['bytes']} B after epoch {c['after_epoch']}, {c['seconds_mean']:.2f} s "
              f"({c['GB_per_s_mean']:.2f} GB/s, fsync), outside the AU")
    print_compliance(r["compliance"])
    for w in r["warnings"]:
        print(f"  warning: {w}")


def print_compliance(c: dict) -> None:
    print(f"  compliance: {c['verdict']}")
    for x in c["rules"]:
        print(f"    [{'ok' if x['ok'] else 'NOT MET'}] {x['rule']}: {x['used']} (MLPerf: {x['required']}; "
              f"{x['source']})")


def print_find_max(out: dict) -> None:
    print(out["headline"] + (f"; {out['rule_verdict']}" if out.get("rule_verdict") else ""))
    for p in out["probes"] + out.get("full_results", []):
        kind = "full result" if p["full_result"] else "probe"
        print(f"  {kind:>11} {p['accelerators']:>3} accelerator(s): AU {p['au']:.1%} (worst {p['au_min']:.1%})"
              f"{' (marginal: interval spans the threshold)' if p['marginal'] else ''}  "
              f"{p['samples_per_s']:.1f} samples/s  {format_rate(p['throughput_bytes_per_s'])}"
              f"  {'pass' if p['passed'] else 'FAIL'}")
    if out["at_max"]:
        print(f"  at {out['max_accelerators_per_node']}: {format_rate(out['at_max']['throughput_bytes_per_s'])} "
              f"delivered per node" + ("" if out.get("confirmed") else " (not confirmed by a failing full result "
                                                                       "above it)"))
    if out["next_step"]:
        n = out["next_step"]
        print(f"  at {n['accelerators']}: AU {n['au']:.1%} ({n['bound']}); {n['explanation']}")
    if out.get("result_at_max"):
        print_compliance(out["result_at_max"]["compliance"])


def mlperf_vocabulary(r: dict) -> dict:
    """A run in MLPerf Storage's words."""
    return {
        "workload": r["workload"], "accelerator_type": r["accelerator"], "accelerators": r["accelerators"],
        "accelerators_per_node": r["accelerators_per_node"], "nodes": r["nodes"],
        "AU_percent": 100 * r["au"], "AU_percent_per_run": [100 * a for a in r["au_per_run"]],
        "AU_percent_min": 100 * r["au_min"], "AU_threshold_percent": 100 * r["au_threshold"],
        "AU_meets_expectation": r["passed"],
        "AU_percent_per_rank": [100 * a for a in r["au_per_accelerator"]],
        "samples_per_s": r["samples_per_s"], "MB_per_s": r["MB_per_s_read"],
        "MB_per_s_read": r["MB_per_s_read"], "MiB_per_s_dlio": r["MiB_per_s_dlio"],
        "per_rank": [{"rank": p["rank"], "AU_percent": 100 * p["au"], "samples_per_s": p["samples_per_s"],
                      "MB_per_s": (p["bytes_per_s"] or 0.0) / 1e6} for p in r["per_rank"]],
        "epochs": r["epochs"], "steps_per_epoch": r["steps_per_epoch"], "runs": r["runs"],
        "warmup_run": r["warmup_run"], "checkpoint": r.get("checkpoint"),
        "rule_compliant": r["rule_compliant"], "rule_verdict": r["rule_verdict"], "compliance": r["compliance"],
    }


def results_for(cfg, out: dict, find_max: bool = False):
    from ..config import to_dict
    from ..results import Results

    run = out["result_at_max"] if find_max else out
    metrics: dict = {}
    if run is not None:
        metrics = {"accelerator_utilization": run["au"], STALL_RATIO: 1 - run["au"],
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
               "compliance": run["compliance"],
               "rule_notes": run["rule_notes"], "storage": "synthetic" if run["synthetic"] else "real"}
    res = Results(command="mlperf", config=to_dict(cfg), environment=env, metrics=metrics,
                  per_rank=run["per_rank"] if run is not None else None,
                  warnings=list(run["warnings"]) if run is not None else [])
    return res
