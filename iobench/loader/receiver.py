"""Takes worker messages off the queue in a thread of the consumer's process.

Workers send on a ``SimpleQueue`` (a pipe written synchronously by the worker's own
thread): an ``mp.Queue`` hands messages to a feeder thread that can wait a whole GIL
switch interval (5 ms) behind the worker's busy main thread.

A batch that is already there then costs the consumer a dict lookup, not a pipe read
and an unpickle on its critical path (the thread runs while the step computes, as
PyTorch's pin-memory thread does).  Worker errors are re-raised in the consumer.
"""

from __future__ import annotations

import threading

from ..errors import IobenchError, StorageError
from ..metrics import LatencyHistogram


class Receiver:
    def __init__(self, results_q, procs: list) -> None:
        self.q = results_q
        self.procs = procs
        self.cond = threading.Condition()
        self.batches: dict[int, dict] = {}
        self.done: dict[int, dict] = {}
        self.error: BaseException | None = None
        self.io_hist = LatencyHistogram()   # per-batch I/O time, each worker's first batch excluded
        self.first_io: list[float] = []
        self.overflow = 0
        self._thread = threading.Thread(target=self._run, name="iobench-receiver", daemon=True)

    def start(self) -> "Receiver":
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                msg = self.q.get()
            except (EOFError, OSError, ValueError):  # queue closed under us at shutdown
                return
            if msg[0] == "stop":
                return
            with self.cond:
                self._handle(msg)
                self.cond.notify_all()

    def _handle(self, msg) -> None:
        kind = msg[0]
        if kind == "batch":
            meta = msg[1]
            self.batches[meta["k"]] = meta
            if meta["worker_batch"] == 0:  # includes the worker's start-up (connections, imports)
                self.first_io.append(meta["io_s"])
            else:
                self.io_hist.record_s(meta["io_s"])
            self.overflow += meta.get("inline") is not None
        elif kind == "done":
            self.done[msg[1]] = msg[2]
        elif self.error is None:
            _, wid, exc, _tb = msg
            if isinstance(exc, IobenchError):
                self.error = exc
            else:
                err = StorageError(f"loader worker {wid} failed: {type(exc).__name__}: {exc}")
                err.__cause__ = exc
                self.error = err

    def _check_workers(self, k: int) -> None:
        dead = [p for p in self.procs if not p.is_alive() and p.exitcode not in (0, None)]
        if dead:
            raise StorageError(f"loader worker {dead[0].name} died (exit code {dead[0].exitcode})")
        if all(not p.is_alive() for p in self.procs) and self.q.empty():
            raise StorageError(f"loader workers exited before batch {k} arrived")

    def wait_batch(self, k: int) -> dict:
        with self.cond:
            while k not in self.batches:
                if self.error is not None:
                    raise self.error
                if not self.cond.wait(0.5):
                    self._check_workers(k)
            return self.batches.pop(k)

    def ready(self) -> int:
        return len(self.batches)

    def wait_done(self, n: int, timeout_s: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: len(self.done) >= n or self.error is not None
                               or all(not p.is_alive() for p in self.procs) and self.q.empty(), timeout_s)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.q.put(("stop",))
            self._thread.join(timeout=5)
