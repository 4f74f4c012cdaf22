"""Intervals for the rates `iobench run` writes, so that two identical runs can be compared on them.

`iobench compare --max-regression` judges every number whose path ends with a rate suffix
(``report.compare.HIGHER_IS_BETTER``): where both runs carry a 95% interval for it
(``<key>_ci95``) and the intervals overlap, the runs agree; otherwise a drop of more than the
threshold fails.  A rate measured once in 0.1 s has no interval, and two identical runs then
"regress" on noise.  Two ways to give one:

- ``merge_repeats``: the same measurement done R times (probe, checkpoint, gds stages); every
  rate becomes the mean of the R values with its Student-t interval
  (``loader.stability.mean_interval``); every other number is the first repeat's.
- ``add_load_rate_intervals``: one load's rates, from the batch-means interval of its steady
  batches per second (``loader.stability.ratio_interval`` over the per-step times): the wall-clock
  rates carry that relative width too (their warm-up is one event and adds no interval of its own).
"""

from __future__ import annotations

from ..schema import STALL_RATIO
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..report.compare import HIGHER_IS_BETTER
from ..report.data import is_number

REPEATS = 3            # the probe, stage, checkpoint and gds stages: each measurement done this many times
# what a merged result says about itself (``metrics.repeats``)
REPEATS_NOTE = {"n": REPEATS, "rule": "rates: mean of the repeats, Student t 95% (…_ci95); other numbers: the "
                                      "first repeat's"}


@dataclass
class SpreadRepeats:
    """One stage's REPEATS repeats, spread over the run instead of back to back.

    Back to back, the repeats of a 0.1 s measurement span a few seconds and their interval sees only
    that: a disk or memory bandwidth that drifts over the run (2x between two `make run`s 12 minutes
    apart, reports/reference/repeat.md) falls outside it.  Spread (one at the stage's place in the run,
    one between load passes, one after the load and checkpoint stages: ``SuiteContext.spread_point``),
    the interval covers what drifts within the run.  ``measure()`` is one repeat; ``finish(runs)`` merges
    them into the stage's metrics.
    """

    name: str
    measure: Callable[[], Any]
    finish: Callable[[list], dict]
    repeats: int = REPEATS
    # the load passes (0-based) before which one more repeat runs (``SuiteContext.spread_point``); the
    # rest run after the checkpoint stage.  Default: the middle of the load stage (before pass 4 of 5).
    points: tuple[int, ...] = (3,)
    runs: list = field(default_factory=list)
    at_s: list = field(default_factory=list)        # each repeat's start, seconds since ``t0``
    took_s: float = 0.0                             # the repeats' own time, summed
    t0: float = field(default_factory=time.perf_counter)

    @property
    def owed(self) -> bool:
        return len(self.runs) < self.repeats

    def more(self) -> None:
        """One more repeat, if any is still owed."""
        if not self.owed:
            return
        t = time.perf_counter()
        self.at_s.append(round(t - self.t0, 1))
        self.runs.append(self.measure())
        self.took_s += time.perf_counter() - t

    def done(self) -> dict:
        """The rest of the repeats (back to back: nothing was left to spread them over), then the merge."""
        while self.owed:
            self.more()
        return self.finish(self.runs)


def is_rate(key: Any) -> bool:
    return isinstance(key, str) and key.endswith(HIGHER_IS_BETTER)


def repeat(measure: Callable[[int], Any], repeats: int = REPEATS) -> tuple[Any, list]:
    """``measure(i)`` for i < repeats; returns (merged, the repeats' raw results)."""
    runs = [measure(i) for i in range(repeats)]
    return merge_repeats(runs), runs


def merge_repeats(runs: list) -> Any:
    """One result shaped like ``runs[0]``: rates → mean of the repeats + ``<key>_ci95``; every other
    number, and a part whose shape differs between repeats, is the first repeat's."""
    from iobench.loader.stability import mean_interval

    first = runs[0]
    if isinstance(first, dict) and all(isinstance(r, dict) for r in runs):
        out: dict = {}
        for k, v in first.items():
            vals = [r.get(k) for r in runs]
            if is_rate(k) and is_number(v) and all(is_number(x) for x in vals):
                iv = mean_interval(vals)
                out[k] = iv["value"]
                if iv["low"] is not None:
                    out[f"{k}_ci95"] = [max(0.0, iv["low"]), iv["high"]]
            else:
                out[k] = merge_repeats(vals)
        return out
    if isinstance(first, list) and all(isinstance(r, list) and len(r) == len(first) for r in runs):
        return [merge_repeats([r[i] for r in runs]) for i in range(len(first))]
    return first


def add_load_rate_intervals(metrics: dict) -> dict | None:
    """Give a load's rates (``throughput.*``, ``per_worker[*].*``) their 95% intervals, in place;
    returns the batches-per-second interval used (None when the run is too short for one)."""
    from iobench.loader.stability import ratio_interval

    steps = ((metrics.get("series") or {}).get("step_s") or [])[1:]      # step 0 holds the start-up
    iv = ratio_interval([1.0] * len(steps), steps)
    if iv["half_width"] is None or not iv["value"]:
        return None
    rel = iv["half_width"] / iv["value"]

    def tag(d: dict) -> None:
        for k, v in list(d.items()):
            if is_rate(k) and is_number(v):
                d[f"{k}_ci95"] = [max(0.0, v * (1 - rel)), v * (1 + rel)]

    tag(metrics.get("throughput") or {})
    for w in metrics.get("per_worker") or []:
        if isinstance(w, dict):
            tag(w)
    (metrics.get("throughput") or {})["interval"] = {
        "relative_half_width": rel, "steps": iv["n"], "groups": iv["groups"],
        "method": "batch means of the steady steps' batches per second, 95%; wall-clock rates carry the "
                  "same relative width"}
    return iv


def merge_passes(passes: list[dict], rule: dict, instances: list | None = None) -> dict:
    """One load measured in several passes (spread over the load stage; on the embedded S3, each on
    its own server instance) as one result whose intervals cover the spread BETWEEN passes.

    A single load's batch-means interval covers only the noise within its few seconds; two identical
    `make run`s differed by more than that (other work on the host, the S3 server instance).  Here:

    - rates (``throughput.*``, ``per_worker[*]``, AU) and the stall: mean of the passes, Student t 95%
      over the passes (``merge_repeats``; the stall's goes to ``intervals.stall_ratio``);
    - P99 batch service and wait times: order-statistic interval over the passes' batches pooled
      (step 0 of each pass excluded), which is what a P99's upper bound needs (≥ 383 batches);
    - ``steps``/``samples``: summed; every other number (series, histograms) is the first pass's;
    - ``stable``: the stall interval within ±``rule['stall_ci_half_width']`` and the pooled P99 within
      ±``rule['p99_ci_relative_half_width']`` (the loader's widths), else ``not_stable_because`` says which.
    """
    from iobench.loader.stability import mean_interval, quantile_interval
    from iobench.metrics import encoded_seconds, summarize_seconds

    m = merge_repeats(passes)
    n = len(passes)
    stalls = [p[STALL_RATIO] for p in passes]
    st = mean_interval(stalls)
    stall_iv = {"value": st["value"], "n": n, "method": f"mean of {n} passes, Student t 95% (between-pass spread)",
                "low": None if st["low"] is None else max(0.0, st["low"]),
                "high": None if st["high"] is None else min(1.0, st["high"]), "half_width": st["half_width"]}
    m[STALL_RATIO] = st["value"]
    m["accelerator_utilization"] = 1.0 - st["value"]     # the loader's AU is 1 − its steady stall
    m.pop("accelerator_utilization_ci95", None)          # compare bounds AU by the stall's interval
    ivs = dict(m.get("intervals") or {})
    ivs[STALL_RATIO] = stall_iv
    for name, block in (("batch_service_p99_s", "batch_service_s"), ("batch_wait_p99_s", "batch_wait_s")):
        pooled = [x for p in passes for x in _batch_times(p, block)]
        if pooled:
            q = quantile_interval(pooled, 0.99) | {"pooled_passes": n}
            ivs[name] = q
            # the whole summary of the pooled batches (a pooled P99 beside the first pass's max broke p99 <= max),
            # and their histogram beside it (the report plots one and marks the other's P99)
            m[block] = summarize_seconds(pooled)
            m[block.removesuffix("_s") + "_hist"] = encoded_seconds(pooled)
    m["intervals"] = ivs
    m["steps"] = sum(p["steps"] for p in passes)
    m["samples"] = sum(p.get("samples") or 0 for p in passes)
    thr = m.get("throughput") or {}
    val = thr.get("steady_samples_per_s")
    ci = thr.get("steady_samples_per_s_ci95")
    thr["interval"] = {"relative_half_width": (ci[1] - val) / val if ci and val else None, "passes": n,
                       "method": f"mean of {n} passes, Student t 95% over the passes (each rate its own)"}
    reasons = []
    if stall_iv["half_width"] is None or stall_iv["half_width"] > rule["stall_ci_half_width"]:
        reasons.append(f"stall ±{stall_iv['half_width'] * 100:.1f} pp over {n} passes > "
                       f"±{rule['stall_ci_half_width'] * 100:g} pp" if stall_iv["half_width"] is not None
                       else f"{n} pass(es): no interval")
    p99 = ivs.get("batch_service_p99_s") or {}
    if p99.get("high") is None:
        reasons.append(p99.get("note") or "no P99")
    elif p99["relative_half_width"] > rule["p99_ci_relative_half_width"]:
        reasons.append(f"P99 batch time ±{p99['relative_half_width']:.0%} > ±{rule['p99_ci_relative_half_width']:.0%}")
    m["stable"] = not reasons
    m["stability"] = {"rule": rule, "until_stable": False, "stopped": f"{n} passes done",
                      "not_stable_because": reasons}
    # each pass's own numbers, named so that `iobench compare` does not judge them one by one (they
    # carry no interval: the merged numbers above, with theirs, are what two runs are compared on)
    m["passes"] = [{"pass": i, "server_instance": None if instances is None else instances[i],
                    "steps": p["steps"], "stopped": (p.get("stability") or {}).get("stopped"),
                    "stall_of_pass": p[STALL_RATIO],
                    "steady_samples_per_s_of_pass": (p.get("throughput") or {}).get("steady_samples_per_s")}
                   for i, p in enumerate(passes)]
    return m


def _batch_times(p: dict, block: str) -> list[float]:
    """One pass's batch times from step 1, as its ``block`` summary counts them: service is storage +
    prep (a stream's buffer fill excluded, as iobench.loader.stability.service), wait is the step's wait."""
    s = p.get("series") or {}
    if block == "batch_wait_s":
        return list((s.get("wait_s") or [])[1:])
    return [a + b for a, b in zip(s.get("io_s") or [], s.get("prep_s") or [])][1:]
