"""``--find-max``: the largest number of simulated accelerators per node whose every AU stays
at or above the workload's threshold -- MLPerf Storage's headline -- and why one more fails.

Grow 1, 2, 4, ... until a count fails, then bisect between the last pass and the first
failure.  Each probe is one run, at least ``min_steps`` steps per accelerator (the AU carries
its batch-means 95% interval; a probe whose interval straddles the threshold is marked
marginal).  The loader's run-until-stable rule is not used here: accelerators must run the
same steps together -- one stopping early would free storage for the others.  The
failing count is run once more with no I/O (batches of the same size from memory): if that
passes, storage was the limit (fetch-bound); if it fails too, the host could not prepare the
batches (prep-bound: CPU for N accelerators x read threads, copies, the harness).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .run import MlperfConfig, run_mlperf

DEFAULT_MIN_STEPS = 30


def _summary(r: dict) -> dict:
    return {"accelerators": r["accelerators_per_node"], "passed": r["passed"], "au_min": r["au_min"],
            "au_ci95_worst": r["au_ci95_worst"], "worst_accelerator": r["worst_accelerator"],
            "samples_per_s": r["samples_per_s"], "throughput_bytes_per_s": r["throughput_bytes_per_s"],
            "steps_per_accelerator": r["steps_per_accelerator"],
            "marginal": bool(r["au_ci95_worst"] and r["au_ci95_worst"][0] < r["au_threshold"]
                             <= r["au_ci95_worst"][1])}


def find_max(cfg: MlperfConfig, max_accelerators: int = 64, world=None,
             say: Callable[[str], None] = lambda s: None) -> dict:
    base = dataclasses.replace(cfg, runs=1, min_steps=cfg.min_steps or DEFAULT_MIN_STEPS)
    probes: dict[int, dict] = {}

    def probe(n: int) -> bool:
        r = run_mlperf(dataclasses.replace(base, accelerators=n), world)
        probes[n] = r
        say(f"  {n} accelerator(s): min AU {r['au_min']:.1%} ({'pass' if r['passed'] else 'FAIL'}), "
            f"{r['MB_per_s']:.1f} MB/s")
        return r["passed"]

    last_pass, first_fail, n = 0, None, 1
    while True:
        if not probe(n):
            first_fail = n
            break
        last_pass = n
        if n >= max_accelerators:
            break
        n = min(2 * n, max_accelerators)
    if first_fail is not None:
        lo, hi = last_pass, first_fail
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if probe(mid):
                lo = mid
            else:
                hi = mid
        last_pass, first_fail = lo, hi
    best = probes.get(last_pass)
    fail = probes.get(first_fail) if first_fail is not None else None
    why = None
    if fail is not None:
        say(f"  {first_fail} accelerator(s) again without I/O, to tell fetch from prep ...")
        synthetic = run_mlperf(dataclasses.replace(base, accelerators=first_fail, synthetic=True), world)
        worst = fail["worst_accelerator"]
        bound = "fetch-bound" if synthetic["passed"] else "prep-bound"
        worst_rank = next(r for r in fail["per_rank"] if r["rank"] == worst)
        model = worst_rank.get("au_model")
        why = {"accelerators": first_fail, "au_min": fail["au_min"], "worst_accelerator": worst,
               "bound": bound, "au_min_without_io": synthetic["au_min"], "au_model_worst": model,
               "worst_wait_s": worst_rank["wait_s"], "worst_batch_io_p99_s": worst_rank["batch_io_p99_s"],
               "explanation": (f"without I/O the same {first_fail} accelerators reach min AU "
                               f"{synthetic['au_min']:.1%}: " +
                               ("the storage path (fetch) is the limit" if synthetic["passed"] else
                                "the host cannot prepare batches fast enough (prep), storage aside")
                               + (f"; the loader model replaying its workers' times gives AU {model:.1%}: the rest "
                                  "of the gap is hand-off, the consumer late to take ready batches while the "
                                  "workers read (a loaded host)"
                                  if model is not None and model >= fail["au_threshold"] else ""))}
    ref = best or fail
    return {
        "workload": ref["workload"], "accelerator": ref["accelerator"], "au_threshold": ref["au_threshold"],
        "max_accelerators_per_node": last_pass, "search_limit": max_accelerators,
        "limit_reached": first_fail is None,
        "at_max": _summary(best) if best else None,
        "next_step": why,
        "probes": [_summary(probes[k]) for k in sorted(probes)],
        "headline": headline(ref["workload"], ref["accelerator"], ref["au_threshold"], last_pass, why,
                             first_fail is None, max_accelerators),
        "result_at_max": best,
    }


def headline(workload: str, accelerator: str, threshold: float, n: int, why: dict | None, limit: bool,
             max_n: int) -> str:
    acc = accelerator.upper()
    if n == 0:
        s = f"this storage cannot keep even 1 simulated {acc} at AU >= {threshold:.0%} on {workload}"
    else:
        s = f"this storage keeps {n} simulated {acc}{'s' if n != 1 else ''} per node at AU >= {threshold:.0%} on {workload}"
    if why:
        s += f"; the {_ordinal(why['accelerators'])} stalls at {why['au_min']:.0%}: {why['bound']}"
    elif limit:
        s += f" (the search stopped at its limit of {max_n}; raise --max-accelerators)"
    return s


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
