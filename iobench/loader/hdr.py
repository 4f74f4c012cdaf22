"""HDR summaries computed from the histogram's non-empty buckets.

``LatencyHistogram.summary()`` asks the pure-Python ``hdrh`` for the mean, which walks
every sub-bucket up to the maximum (~0.1–0.8 s per histogram on a busy machine); a load
summarises several histograms per run.  This gives the same numbers from the non-zero
counts only (checked against ``summary()`` in tests/test_loader_units.py).
"""

from __future__ import annotations

import numpy as np

from ..metrics import LatencyHistogram

_PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9))


def fast_summary(hist: LatencyHistogram) -> dict:
    h = hist._h
    n = h.get_total_count()
    if n == 0:
        return hist.summary()
    counts = np.ctypeslib.as_array(h.counts)[: min(h.counts_len, h.encoder.payload.counts_len)]
    idx = np.flatnonzero(counts)
    cnt = counts[idx].astype(np.float64)
    values = [h.get_value_from_index(int(i)) for i in idx]
    mids = np.array([h._hdr_median_equiv_value(v) for v in values], dtype=np.float64)
    out = {"count": n, "min": h.get_min_value() / 1e9, "mean": float((cnt * mids).sum() / n) / 1e9}
    cum = np.cumsum(counts[idx])
    for name, p in _PERCENTILES:
        target = h.get_target_count_at_percentile(p)
        j = int(np.searchsorted(cum, target, side="left"))
        out[name] = h.get_highest_equivalent_value(values[min(j, len(values) - 1)]) / 1e9
    out["max"] = h.get_max_value() / 1e9
    return {k: out[k] for k in ("count", "min", "mean", "p50", "p90", "p99", "p999", "max")}


def summarize(values_s) -> dict:
    h = LatencyHistogram()
    for v in values_s:
        h.record_s(v)
    return fast_summary(h)
