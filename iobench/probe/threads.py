"""Worker threads that start their timed work together: the probes' one thread harness."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Released:
    """``n`` threads, each running ``work(w)``; ``work`` calls ``go(w)`` once its set-up is done.

    ``go`` waits on one barrier so that no thread's clock starts while another is still opening
    files or connections, then stamps ``starts[w]``; ``ends[w]`` is stamped when ``work`` returns.
    The first error aborts the barrier (no thread waits forever) and is raised by ``run``.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.starts = [0] * n
        self.ends = [0] * n
        self._barrier = threading.Barrier(n)
        self._errors: list[BaseException] = []

    def go(self, w: int) -> None:
        self._barrier.wait()
        self.starts[w] = time.perf_counter_ns()

    def run(self, work: Callable[[int], None]) -> None:
        def body(w: int) -> None:
            try:
                work(w)
                self.ends[w] = time.perf_counter_ns()
            except BaseException as e:
                self._errors.append(e)
                self._barrier.abort()

        threads = [threading.Thread(target=body, args=(w,), daemon=True) for w in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._errors:
            raise self._errors[0]

    @property
    def seconds(self) -> float:
        """Wall time from the first start to the last end."""
        return (max(self.ends) - min(self.starts)) / 1e9
