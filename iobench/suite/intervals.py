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

from typing import Any, Callable

from ..report.compare import HIGHER_IS_BETTER
from ..report.data import is_number

REPEATS = 3            # the probe, stage, checkpoint and gds stages: each measurement done this many times
# what a merged result says about itself (``metrics.repeats``)
REPEATS_NOTE = {"n": REPEATS, "rule": "rates: mean of the repeats, Student t 95% (…_ci95); other numbers: the "
                                      "first repeat's"}


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
