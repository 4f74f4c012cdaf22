"""Latency histograms (HDR) and byte counters, in the results schema's units.

Durations are recorded in integer nanoseconds from ``time.perf_counter_ns`` and
summarised in seconds as ``{count, min, mean, p50, p90, p99, p999, max}``.  Histograms
from several processes or ranks are merged (``merge``/``encode``/``decode``), never
averaged.
"""

from __future__ import annotations

import ctypes
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np
from hdrh.histogram import HdrHistogram

if TYPE_CHECKING:
    from .schema import HdrSummary

_LOWEST_NS = 1
_HIGHEST_NS = 3_600 * 10**9  # one hour
_SIGFIGS = 3

now_ns = time.perf_counter_ns


class LatencyHistogram:
    """HDR histogram of durations in nanoseconds."""

    __slots__ = ("_h",)

    def __init__(self) -> None:
        self._h = HdrHistogram(_LOWEST_NS, _HIGHEST_NS, _SIGFIGS)

    def record_ns(self, ns: int) -> None:
        self._h.record_value(min(max(int(ns), _LOWEST_NS), _HIGHEST_NS))

    def record_s(self, seconds: float) -> None:
        self.record_ns(int(seconds * 1e9))

    def record_many_ns(self, values) -> None:
        """Many durations at once (a hot path's log): one hdrh call per distinct value, after
        rounding to 3 significant digits — within the histogram's own resolution."""
        a = np.clip(np.asarray(values, dtype=np.int64), _LOWEST_NS, _HIGHEST_NS)
        if not len(a):
            return
        mag = 10 ** np.maximum(0, np.floor(np.log10(a)).astype(np.int64) - (_SIGFIGS - 1))
        vals, counts = np.unique(a // mag * mag, return_counts=True)
        for v, c in zip(vals.tolist(), counts.tolist()):
            self._h.record_value(v, c)

    @contextmanager
    def time(self) -> Iterator[None]:
        t0 = now_ns()
        try:
            yield
        finally:
            self.record_ns(now_ns() - t0)

    @property
    def count(self) -> int:
        return self._h.get_total_count()

    def merge(self, other: "LatencyHistogram") -> "LatencyHistogram":
        self._h.add(other._h)
        return self

    def encode(self) -> str:
        """Compressed form, to send across processes or keep in results."""
        return self._h.encode().decode("ascii")

    @classmethod
    def decode(cls, data: str | bytes) -> "LatencyHistogram":
        h = cls()
        h._h = HdrHistogram.decode(data.encode("ascii") if isinstance(data, str) else data)
        return h

    # The pure-Python hdrh package scans its whole counts array (tens of thousands of
    # buckets) for every percentile and for the mean: about a second per summary on a busy
    # machine.  One cumulative sum over the same counts gives exactly hdrh's values.
    def _cumulative(self) -> np.ndarray:
        raw = self._h
        if ctypes.sizeof(raw.counts._type_) == 8:
            counts = np.ctypeslib.as_array((ctypes.c_uint64 * raw.counts_len).from_buffer(raw.counts))
        else:
            counts = np.array(raw.counts[:], dtype=np.int64)
        return counts

    def _value_at(self, cum: np.ndarray, percentile: float) -> int:
        raw = self._h
        index = int(np.searchsorted(cum, raw.get_target_count_at_percentile(percentile), side="left"))
        if index >= len(cum):
            return 0
        value = raw.get_value_from_index(index)
        return raw.get_highest_equivalent_value(value) if percentile else raw.get_lowest_equivalent_value(value)

    def summary(self) -> HdrSummary:
        """The results schema's HDR summary, in seconds."""
        n = self.count
        if n == 0:
            return {"count": 0, "min": None, "mean": None, "p50": None, "p90": None, "p99": None,
                    "p999": None, "max": None}
        raw = self._h
        counts = self._cumulative()
        cum = np.cumsum(counts)
        total = 0
        for i in np.nonzero(counts)[0].tolist():
            total += int(counts[i]) * raw._hdr_median_equiv_value(raw.get_value_from_index(i))
        return {
            "count": n,
            "min": raw.get_min_value() / 1e9,
            "mean": float(total) / raw.total_count / 1e9,
            "p50": self._value_at(cum, 50) / 1e9,
            "p90": self._value_at(cum, 90) / 1e9,
            "p99": self._value_at(cum, 99) / 1e9,
            "p999": self._value_at(cum, 99.9) / 1e9,
            "max": raw.get_max_value() / 1e9,
        }

    def cdf(self, points: int = 200) -> list[tuple[float, float]]:
        """(seconds, fraction ≤) pairs for plotting a latency CDF."""
        if self.count == 0 or points <= 0:
            return []
        cum = np.cumsum(self._cumulative())
        return [(self._value_at(cum, 100.0 * i / points) / 1e9, i / points) for i in range(points + 1)]


def merged(hists: Iterable[LatencyHistogram]) -> LatencyHistogram:
    out = LatencyHistogram()
    for h in hists:
        out.merge(h)
    return out


def summarize_seconds(values: Iterable[float]) -> HdrSummary:
    """The HDR summary of ``values`` (seconds).  A summary is always of one population: to
    summarise several runs, pool their values (or merge their histograms) and summarise once —
    never replace one quantile of a run's summary (a pooled P99 above that run's max)."""
    h = LatencyHistogram()
    for v in values:
        h.record_s(v)
    return h.summary()


def encoded_seconds(values: Iterable[float]) -> str | None:
    """An encoded HDR histogram of ``values`` (seconds), None when there are none: the full
    distribution beside ``summarize_seconds``'s summary of the same values."""
    h = LatencyHistogram()
    for v in values:
        h.record_s(v)
    return h.encode() if h.count else None


SUMMARY_ORDER = ("min", "p50", "p90", "p99", "p999", "max")


def is_ordered(summary: dict) -> bool:
    """min <= p50 <= p90 <= p99 <= p999 <= max, and min <= mean <= max (what every summary obeys)."""
    vals = [summary.get(k) for k in SUMMARY_ORDER]
    if not summary.get("count"):
        return True
    if any(v is None for v in vals):
        return False
    mean = summary.get("mean")
    return all(a <= b for a, b in zip(vals, vals[1:])) and (mean is None or vals[0] <= mean <= vals[-1])
