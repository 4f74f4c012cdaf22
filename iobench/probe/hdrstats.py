"""HDR summary and CDF of a ``LatencyHistogram`` in one vectorised pass.

The pure-Python ``hdrh`` package scans its whole counts array (tens of thousands of
buckets) for every percentile and for the mean, which costs about a second per summary
on a busy machine; a probe summarises hundreds of points.  These give exactly the values
``LatencyHistogram.summary()``/``cdf()`` give (a test compares them), from one cumulative
sum over the same counts.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..metrics import LatencyHistogram


def _counts(raw) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint64 * raw.counts_len).from_buffer(raw.counts)) \
        if ctypes.sizeof(raw.counts._type_) == 8 else np.array(raw.counts[:], dtype=np.int64)


def _at(raw, cum: np.ndarray, percentile: float) -> int:
    target = raw.get_target_count_at_percentile(percentile)
    index = int(np.searchsorted(cum, target, side="left"))
    if index >= len(cum):
        return 0
    value = raw.get_value_from_index(index)
    return raw.get_highest_equivalent_value(value) if percentile else raw.get_lowest_equivalent_value(value)


def summary_and_cdf(h: LatencyHistogram, cdf_points: int = 50) -> tuple[dict, list[list[float]]]:
    n = h.count
    if n == 0:
        return h.summary(), []
    raw = h._h
    counts = _counts(raw)
    cum = np.cumsum(counts)
    nz = np.nonzero(counts)[0]
    total = 0
    for i in nz.tolist():
        total += int(counts[i]) * raw._hdr_median_equiv_value(raw.get_value_from_index(i))
    summary = {"count": n, "min": raw.get_min_value() / 1e9, "mean": float(total) / raw.total_count / 1e9,
               "p50": _at(raw, cum, 50) / 1e9, "p90": _at(raw, cum, 90) / 1e9, "p99": _at(raw, cum, 99) / 1e9,
               "p999": _at(raw, cum, 99.9) / 1e9, "max": raw.get_max_value() / 1e9}
    cdf = []
    for k in range(cdf_points + 1 if cdf_points > 0 else 0):
        p = 100.0 * k / cdf_points
        cdf.append([_at(raw, cum, p) / 1e9, p / 100.0])
    return summary, cdf


def summary(h: LatencyHistogram) -> dict:
    return summary_and_cdf(h, 0)[0]
