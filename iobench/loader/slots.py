"""Prefetch slots in shared memory, and the Batch the consumer receives (a view, not a copy).

Batch ``k`` always goes to slot ``k % n``; a worker may fill it once the consumer has
released batch ``k - n``.  Fixed assignment keeps batches in order without a free list
and cannot deadlock: the batch a worker waits for is always older than its own.  Only
small metadata (sample ids, offsets, labels) crosses the queue; payloads never do.
"""

from __future__ import annotations

import os
import select
import time
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any, Protocol

import numpy as np


class SlotPool:
    def __init__(self, ctx, n_slots: int, slot_bytes: int, workers: int = 1, spin_s: float = 0.0) -> None:
        self.n = n_slots
        self._u8: dict[int, np.ndarray] = {}   # slot -> its uint8 array, per process (``u8``; never pickled)
        # How long a worker polls for its slot (yielding the core between looks) before it sleeps on
        # its wake pipe; 0 where no core is left over for it.  The consumer's release writes a byte
        # down that pipe on every step, and when the worker sleeps there that write wakes it: an
        # inter-processor interrupt on a VM, 20-40 us of the consumer's step (measured, W=1, compute 0).
        self.spin_ns = int(spin_s * 1e9)
        self.slot_bytes = max(int(slot_bytes), 1)
        self.shms: list[shared_memory.SharedMemory] = []
        try:
            for _ in range(n_slots):
                self.shms.append(shared_memory.SharedMemory(create=True, size=self.slot_bytes))
        except BaseException:   # (a signal, ENOMEM) halfway: the segments made so far are unlinked, not leaked
            for shm in self.shms:
                shm.close()
                shm.unlink()
            raise
        # Batches of each slot released so far: written only by the consumer, read by workers.
        # A release is one store plus a byte down the wake pipe of the worker that fills the
        # slot next — no lock and no wake-up handshake on the consumer's critical path.
        self.released = ctx.Array("q", n_slots, lock=False)
        # Their sum, kept by the consumer too: a worker reads it on every batch (``queued``), and
        # summing the per-slot counters through ctypes cost ~1.5 us a batch.
        self.released_total = ctx.Value("q", 0, lock=False)
        # Batch messages each worker has written to its pipe so far: written only by that worker,
        # read by the consumer, which polls it briefly before it blocks on the pipes (a hint only:
        # the message itself still travels through the pipe).  A consumer that is polling is not
        # asleep, so the worker's pipe write wakes nobody (~0.1 ms per batch on a VM).
        self.sent = ctx.Array("q", max(1, workers), lock=False)
        # Batches the consumer has taken so far (map/stream: DataLoader hands a worker its next
        # index when a batch is returned to the training loop; see ``wait_taken``).
        self.taken = ctx.Value("q", 0, lock=False)
        # Set in a worker process (to its Sender's flush): called before the worker sleeps on a slot.
        self.before_wait = None
        # One wake pipe per worker, as multiprocessing Connections rather than bare fds: a
        # spawned or forkserver worker gets a Connection duplicated into it, while a bare fd
        # number means nothing there (EBADF) or, worse, names another of its files.
        self.wake = [ctx.Pipe(duplex=False) for _ in range(workers)]
        for r, w in self.wake:
            os.set_blocking(r.fileno(), False)
            os.set_blocking(w.fileno(), False)

    def _wait_until(self, ready, stop, wid: int) -> bool:
        """Sleep on worker ``wid``'s wake pipe until ``ready()``; False if the run is stopping.

        With a core to spare (``spin_ns``) the worker first polls ``ready()`` for up to that
        long, so that in a run where the consumer frees slots steadily it is awake when they
        come free and the consumer's wake byte wakes nobody.  Then it sleeps: the consumer
        writes a byte down the pipe after each release/take, so the worker wakes at once; the
        50 ms select timeout only bounds how late a stop is noticed.
        """
        r = self.wake[wid][0].fileno()
        if not ready() and self.before_wait is not None:
            self.before_wait()   # the worker's held batches go out before it sleeps (receiver.Sender)
        if self.spin_ns and not ready():
            end = time.perf_counter_ns() + self.spin_ns
            while not ready():
                if time.perf_counter_ns() > end or stop.is_set():
                    break
                os.sched_yield()   # as the consumer's poll (receiver.Receiver._spin)
        while not ready():
            if stop.is_set():
                return False
            if select.select([r], [], [], 0.05)[0]:
                try:
                    os.read(r, 4096)
                except BlockingIOError:
                    pass
        return True

    def acquire(self, k: int, stop, wid: int = 0) -> int | None:
        """Block until batch ``k`` may use its slot; None if the run is stopping."""
        need, s = divmod(k, self.n)
        released = self.released
        if released[s] >= need or self._wait_until(lambda: released[s] >= need, stop, wid):
            return s
        return None

    def wait_taken(self, n: int, stop, wid: int = 0) -> bool:
        """Block until the consumer has taken ``n`` batches; False if the run is stopping."""
        taken = self.taken
        return taken.value >= n or self._wait_until(lambda: taken.value >= n, stop, wid)

    def wait_sent(self, need, stop, wid: int = 0) -> bool:
        """Block until every worker ``i`` has sent ``need[i]`` batches (the lock step of
        ``LoadConfig.lockstep``); False if the run is stopping.  The senders wake the waiters
        (:meth:`notify_others`)."""
        def ready() -> bool:
            return all(self.sent[i] >= n for i, n in enumerate(need))

        return ready() or self._wait_until(ready, stop, wid)

    def _poke(self, wid: int | None) -> None:
        """Wake worker ``wid`` (if it sleeps on its pipe)."""
        if wid is not None and self.wake:
            try:
                os.write(self.wake[wid][1].fileno(), b"x")
            except BlockingIOError:  # its pipe is full of wake-ups already
                pass

    def notify_others(self, wid: int) -> None:
        """Worker ``wid`` has sent a batch: wake the workers that may wait for it (``wait_sent``)."""
        for i in range(len(self.wake)):
            if i != wid:
                self._poke(i)

    def take(self, k: int, next_worker: int | None = None) -> None:
        """The consumer has batch ``k``: wake the worker whose next batch waited for it."""
        self.taken.value = k + 1
        self._poke(next_worker)

    def release(self, k: int, next_worker: int | None = None) -> None:
        """Batch ``k`` is done with its slot; wake the worker that fills it next."""
        self.released[k % self.n] = k // self.n + 1
        self.released_total.value += 1
        self._poke(next_worker)

    def queued(self) -> int:
        """Batches sent to the consumer and not yet released by it (the one its step holds included)."""
        sent = self.sent
        return (sent[0] if len(sent) == 1 else sum(sent)) - self.released_total.value

    def buf(self, s: int) -> memoryview:
        return self.shms[s].buf  # type: ignore[return-value]  # None only after close

    def u8(self, s: int) -> np.ndarray:
        """The slot as a uint8 array (made once per slot and process)."""
        a = self._u8.get(s)
        if a is None:
            a = self._u8[s] = np.frombuffer(self.buf(s), dtype=np.uint8)
        return a

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_u8": {}}   # arrays over this process's mappings of the slots

    def close(self) -> None:
        self._u8 = {}
        for r, w in self.wake:
            r.close()
            w.close()
        self.wake = []
        for shm in self.shms:
            try:
                shm.close()
            except BufferError:
                # A batch view is still alive (e.g. held by a traceback). The mapping goes away
                # with the last view; detach it so SharedMemory.__del__ does not retry and warn.
                shm._buf, shm._mmap = None, None  # type: ignore[attr-defined]  # SharedMemory's own fields
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
        self.shms = []


@dataclass
class Batch:
    """One batch as the consumer sees it.

    ``data`` is a NumPy array over the slot (layout ``array``: shape ``(n, ...)``) or a
    flat ``uint8`` array with ``offsets`` (layout ``ragged``: encoded images or arrays of
    differing shapes, with ``shapes``/``dtype`` when they are arrays).  It is valid until
    the consumer asks for the next batch; copy what must outlive the step.
    """

    index: int
    epoch: int
    indices: np.ndarray
    labels: np.ndarray | None
    data: np.ndarray
    layout: str
    nbytes: int
    offsets: np.ndarray | None = None
    shapes: list | None = None
    dtype: str | None = None

    def __len__(self) -> int:
        return int(len(self.indices))

    def sample(self, i: int) -> Any:
        if self.layout == "array":
            return self.data[i]
        assert self.offsets is not None   # layout "ragged"
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        flat = self.data[a:b]
        if self.shapes is not None and self.dtype is not None:
            return flat.view(self.dtype).reshape(self.shapes[i])
        return flat


_DTYPES: dict[str, np.dtype] = {}


class _Slots(Protocol):
    def u8(self, s: int) -> np.ndarray: ...


def batch_from_meta(meta: dict, pool: _Slots) -> Batch:
    """The consumer's view of a batch; on the critical path of every step, so views are cached."""
    if meta.get("inline") is not None:
        raw = np.frombuffer(meta["inline"], dtype=np.uint8)
    else:
        raw = pool.u8(meta["slot"])[: meta["nbytes"]]
    data = raw
    if meta["layout"] == "array":
        dt = _DTYPES.get(meta["dtype"])
        if dt is None:
            dt = _DTYPES[meta["dtype"]] = np.dtype(meta["dtype"])
        data = raw.view(dt).reshape(meta["shape"])
    return Batch(index=meta["k"], epoch=meta["epoch"], indices=np.frombuffer(meta["indices"], dtype=_I8), labels=_i8(meta.get("labels")),
                 data=data, layout=meta["layout"], nbytes=meta["nbytes"], offsets=_i8(meta.get("offsets")),
                 shapes=meta.get("shapes"), dtype=meta.get("dtype"))


_I8 = np.dtype("<i8")   # a dtype object: frombuffer parses a dtype string on every call (~1.5 us)


def _i8(raw: bytes | None) -> np.ndarray | None:
    return None if raw is None else np.frombuffer(raw, dtype=_I8)
