"""Bandwidth caps in one place: the rate vocabulary and the limiter that enforces it.

One vocabulary everywhere: a rate is ``bw:RATE`` or plain ``RATE`` — ``200MB``,
``1GiB/s``, ``bw:500MB/s`` — in bytes per second.  ``--emulate bw:...``, a tier's
``emulation: bw:...``, and checkpoint ``--durable-bw``/``--local-bw`` all parse with
``parse_rate``.

``RateLimiter`` enforces a cap two ways, matching how the callers move bytes:

- ``consume(n)``: a running, shared cap (checkpoint writers and uploads report bytes
  as they move; the limiter sleeps so the total rate stays at or below the cap, across
  threads);
- ``hold(n, started_ns)``: a per-request floor (the emulation wrapper: one request of
  ``n`` bytes that started at ``started_ns`` lasts at least ``n / rate``; one wrapper per
  worker, like a per-stream limit).
"""

from __future__ import annotations

import threading
import time

from ..units import parse_rate as _parse_rate


def parse_rate(text: "str | float | int | None", field: str) -> float | None:
    """Bytes per second from ``bw:RATE`` / ``RATE`` (``iobench.units.parse_rate``); None passes through."""
    if text is None:
        return None
    return _parse_rate(text, field)


class RateLimiter:
    """Callers report bytes moved; the limiter sleeps so the rate stays at or below the cap."""

    def __init__(self, bytes_per_s: float | None):
        self.bytes_per_s = bytes_per_s
        self._lock = threading.Lock()
        self._t0 = 0.0
        self._moved = 0

    def start(self) -> None:
        with self._lock:
            self._t0 = time.perf_counter()
            self._moved = 0

    def consume(self, nbytes: int) -> None:
        if not self.bytes_per_s:
            return
        with self._lock:
            if not self._t0:
                self._t0 = time.perf_counter()
            self._moved += nbytes
            due = self._t0 + self._moved / self.bytes_per_s
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)

    def transfer_s(self, nbytes: int) -> float:
        """Least time ``nbytes`` may take under the cap."""
        return nbytes / self.bytes_per_s if self.bytes_per_s else 0.0

    def hold(self, nbytes: int, started_ns: int) -> None:
        """Sleep until a request of ``nbytes`` that started at ``started_ns`` has lasted ``transfer_s``."""
        rest = self.transfer_s(nbytes) - (time.perf_counter_ns() - started_ns) / 1e9
        if rest > 0:
            time.sleep(rest)


