"""A bandwidth cap for emulating slower tiers (the seed's 7 vs 20 GB/s example, scaled down)."""

from __future__ import annotations

import threading
import time


class Throttle:
    """Callers report bytes moved; ``consume`` sleeps so the running rate stays at or below the cap."""

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
