"""Bandwidth caps in one place: the rate vocabulary and the limiter that enforces it.

One vocabulary everywhere: a rate is ``bw:RATE`` or plain ``RATE`` — ``200MB``,
``1GiB/s``, ``bw:500MB/s`` — in bytes per second.  ``--emulate bw:...``, a tier's
``emulation: bw:...``, and checkpoint ``--durable-bw``/``--local-bw`` all parse with
``parse_rate``.

``RateLimiter`` enforces a cap two ways, matching how the callers move bytes:

- ``consume(n)``: a running, shared cap (checkpoint writers and uploads report bytes
  as they move; the limiter sleeps so the total rate stays at or below the cap, across
  threads);
- ``hold(n, started_ns)``: a paced pipe (the emulation wrapper: one request of ``n`` bytes
  that started at ``started_ns`` lasts at least ``n / rate``, queued behind the requests
  before it, the previous sleep's late wake-up credited to it so that they do not add up;
  one wrapper per worker).
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


class Cancelled(Exception):
    """A transfer waited on a limiter that was cancelled (the run is being aborted: Ctrl-C, SIGTERM)."""


class RateLimiter:
    """Callers report bytes moved; the limiter sleeps so the rate stays at or below the cap.

    ``cancel()`` wakes every sleeper at once with ``Cancelled``: an aborted run stops its throttled
    transfers instead of waiting them out (a 14 MB checkpoint upload at ``--durable-bw 1MB`` held a
    SIGTERM for 28 s, about the grace Slurm gives before SIGKILL)."""

    def __init__(self, bytes_per_s: float | None):
        self.bytes_per_s = bytes_per_s
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._free_at = 0.0          # hold: when the last scheduled transfer ends (perf_counter seconds)
        self._late = 0.0             # hold: how late the last sleep woke (credited to the next request)
        self._t0 = 0.0
        self._moved = 0

    def cancel(self) -> None:
        self._cancelled.set()

    def _sleep(self, seconds: float) -> None:
        if self._cancelled.wait(seconds) or self._cancelled.is_set():
            raise Cancelled("the transfer was cancelled: the run is stopping")

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
            self._sleep(delay)

    def transfer_s(self, nbytes: int) -> float:
        """Least time ``nbytes`` may take under the cap."""
        return nbytes / self.bytes_per_s if self.bytes_per_s else 0.0

    # A request's transfer continues the previous one's when it queued behind it, and when the sleep
    # that ended the previous one woke late (a busy host wakes 0.1-1 ms late): the lateness is credited
    # to the next request, at most PACE_SLACK_S.  Timed from each piece's own start, a stream of 64 KiB
    # pieces at 50 MiB/s (1.25 ms each) lost ~45% of the cap to those late wake-ups.  The caller's own
    # idle time is never credited: after a pause a request starts afresh.
    PACE_SLACK_S = 0.020

    def schedule(self, nbytes: int, start_s: float, credit_s: float = 0.0, carry_s: float = 0.0) -> float:
        """When a request of ``nbytes`` that started at ``start_s`` (perf_counter seconds) may end: its
        transfer begins at its start less ``credit_s`` (the previous sleep's lateness), or when the
        previous transfer ends if that is later; the limiter is one pipe for every request through it.
        ``carry_s``: the next piece of a streamed transfer kept arriving while its caller was away
        (a receive buffer of that many seconds of the cap), so it may begin up to that long before
        its request -- never before the previous transfer's end."""
        with self._lock:
            begin = max(start_s - max(min(credit_s, self.PACE_SLACK_S), carry_s), self._free_at)
            self._free_at = begin + self.transfer_s(nbytes)
            return self._free_at

    def hold(self, nbytes: int, started_ns: int, carry_bytes: int = 0) -> None:
        """Sleep until a request of ``nbytes`` that started at ``started_ns`` has had its share of the cap
        (``carry_bytes``: what a streamed transfer may have buffered meanwhile, see ``schedule``)."""
        if not self.bytes_per_s:
            return
        credit, self._late = self._late, 0.0
        end = self.schedule(nbytes, started_ns / 1e9, credit, carry_bytes / self.bytes_per_s)
        rest = end - time.perf_counter()
        if rest > 0:
            self._sleep(rest)
            self._late = max(0.0, time.perf_counter() - end)


