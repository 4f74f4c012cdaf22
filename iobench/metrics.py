"""Latency histograms (HDR) and byte counters, in the results schema's units.

Durations are recorded in integer nanoseconds from ``time.perf_counter_ns`` and
summarised in seconds as ``{count, min, mean, p50, p90, p99, p999, max}``.  Histograms
from several processes or ranks are merged (``merge``/``encode``/``decode``), never
averaged.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterable, Iterator

from hdrh.histogram import HdrHistogram

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

    def percentile_s(self, p: float) -> float:
        return self._h.get_value_at_percentile(p) / 1e9

    def summary(self) -> dict:
        """The results schema's HDR summary, in seconds."""
        n = self.count
        if n == 0:
            return {"count": 0, "min": None, "mean": None, "p50": None, "p90": None, "p99": None,
                    "p999": None, "max": None}
        h = self._h
        return {
            "count": n,
            "min": h.get_min_value() / 1e9,
            "mean": h.get_mean_value() / 1e9,
            "p50": h.get_value_at_percentile(50) / 1e9,
            "p90": h.get_value_at_percentile(90) / 1e9,
            "p99": h.get_value_at_percentile(99) / 1e9,
            "p999": h.get_value_at_percentile(99.9) / 1e9,
            "max": h.get_max_value() / 1e9,
        }

    def cdf(self, points: int = 200) -> list[tuple[float, float]]:
        """(seconds, fraction ≤) pairs for plotting a latency CDF."""
        if self.count == 0:
            return []
        out = []
        for i in range(points + 1):
            p = 100.0 * i / points
            out.append((self._h.get_value_at_percentile(p) / 1e9, p / 100.0))
        return out


def merged(hists: Iterable[LatencyHistogram]) -> LatencyHistogram:
    out = LatencyHistogram()
    for h in hists:
        out.merge(h)
    return out


def summarize_seconds(values: Iterable[float]) -> dict:
    h = LatencyHistogram()
    for v in values:
        h.record_s(v)
    return h.summary()
