"""``--workers 0``: the batches are made in the consumer process itself, as torch's
``DataLoader(num_workers=0)`` does, a nanoGPT ``get_batch`` loop, or any training loop that
reads its own data.

There is no worker process, no prefetch slot and no hand-off: the consumer builds batch
``k`` (the same readers, the same access patterns and the same batch-building code as a
worker: ``iobench.loader.worker``'s producers and emitter), runs its step on it, then builds
batch ``k + 1``.  Nothing is read ahead of the step (``--read-ahead N`` still lets a block's
read-ahead thread overlap the next block's reads with this one's gathers, in this process, on
a second core: NOTE [ Block buffers ] in docs/design.md, which also says when ``--block-read
mmap`` is the cheaper one-thread design).

What a step records is what ``core._step_loop`` records for a worker-fed step, read the same
way by ``core._metrics``: ``wait`` is the time the consumer spent producing the batch itself
(from the end of the previous step to the batch in hand, delivery included), ``compute`` the
step, and each batch's storage time, prep time, bytes and requests as the producer counted
them.  The producer's counters become the one ``per_worker`` entry (worker 0, this process).

How the worker's code runs here: its emitter writes each batch into a slot of a pool and
sends its metadata down a connection.  ``_OneSlot`` is that pool with a single private
buffer (a batch is done with before the next is built, so one is enough); ``_InProcessEmitter``
is the worker's emitter with only the hand-off replaced: where a worker packs the batch's
metadata for a pipe, it hands the step the slot's array view itself; ``_StepOnSend`` runs
and records the step (and stands in for the pipe the emitter expects).
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

from ..metrics import now_ns
from .slots import _DTYPES, Batch, batch_from_meta
from .worker import _I8, _Emitter


class _OneSlot:
    """The emitter's slot pool, in one process: one page-aligned private buffer, always free.
    (No ``wait_taken``/``wait_sent``: a W=0 job has no lag and no lock step, so ``gate`` never waits.)"""

    n = 1

    def __init__(self, slot_bytes: int) -> None:
        self.slot_bytes = max(int(slot_bytes), 1)
        # page-aligned (an O_DIRECT read may land in it), and only touched pages cost memory
        self._u8 = np.frombuffer(mmap.mmap(-1, -(-self.slot_bytes // mmap.PAGESIZE) * mmap.PAGESIZE),
                                 dtype=np.uint8)[:self.slot_bytes]
        self.before_wait = None   # the emitter sets it (a worker flushes held batches before it sleeps)

    def acquire(self, k: int, stop, wid: int = 0) -> int | None:
        return None if stop.is_set() else 0

    def queued(self) -> int:
        return 0   # never more than the step's own batch: the emitter never holds one back

    def buf(self, s: int) -> memoryview:
        return self._u8.data

    def u8(self, s: int) -> np.ndarray:
        return self._u8


class _StepOnSend:
    """The emitter's connection: batch ``k`` "sent" is step ``k`` run, and recorded in ``rec``.

    Each step logs one tuple (the hot path: one append, where ``rec`` has sixteen lists); the
    tuples are spread into ``rec`` at the end, and before each look of a stop rule, which reads it."""

    def __init__(self, st, rec, pool: _OneSlot, stop: threading.Event, stop_rule, bar) -> None:
        self.rec, self.pool, self.stop, self.stop_rule, self.bar = rec, pool, stop, stop_rule, bar
        self.total = st.schedule.total
        self.t_prev = 0   # when the previous step ended (the clock's start for step 0)
        self.log: list[tuple] = []
        self._deliver, self._compute = st.deliver, st.compute

    def batch(self, meta: dict, hold: bool = False) -> None:
        """A batch as a worker's metadata (the emitter's general path: ``_InProcessEmitter._send``)."""
        self.run(meta["k"], batch_from_meta(meta, self.pool), meta["nbytes"], meta["n"], meta["io_s"], meta["prep_s"],
                 meta["fill_s"], meta["requests"], meta["ready_ns"], meta["start_ns"])

    def run(self, k: int, batch: Batch, nbytes: int, n: int, io_s: float, prep_s: float, fill_s: float,
            requests: int, ready_ns: int, start_ns: int | None) -> None:
        """Step ``k`` on ``batch``: delivery, the step's compute, one logged tuple."""
        batch = self._deliver(batch)
        t1 = now_ns()
        c = self._compute(batch, k, idle=None)   # a failing --compute-fn raises IobenchError naming the step
        del batch
        t2 = now_ns()
        self.log.append((self.t_prev, t1, t2, c, nbytes, n, io_s, prep_s, fill_s, requests, ready_ns, start_ns))
        self.t_prev = t2
        if self.bar is not None:
            self.bar[0].update(self.bar[1], advance=1)
        if self.stop_rule is not None and k + 1 < self.total:
            self.spread()
            why = self.stop_rule(self.rec, (now_ns() - self.rec.t_start) / 1e9)
            if why:
                self.rec.stopped_early = why
                self.stop.set()   # the producer's next gate or slot raises worker._Stopped

    def spread(self) -> None:
        """The logged steps into ``rec``'s per-step lists (what ``core._metrics`` reads): the batch in
        hand is the only one there is (depth 1), and its hand-off is delivery only."""
        for t0, t1, t2, c, nbytes, n, io_s, prep_s, fill_s, requests, ready_ns, start_ns in self.log:
            self.rec.add(t0, t1, t2, c, 1, 0, nbytes, n, io_s, prep_s, fill_s, requests, ready_ns, start_ns)
        self.log.clear()

    def flush(self) -> None:
        pass   # the emitter's pool.before_wait: nothing is ever held


class _InProcessEmitter(_Emitter):
    """The worker's emitter (batch building: gathers into the slot, reads into a claimed slot,
    collation) with its hand-off replaced: ``_send`` gives the step the slot's array view itself,
    where a worker packs metadata for the pipe and the consumer rebuilds the view from it."""

    def __init__(self, job, pool: _OneSlot, step: _StepOnSend, stop, stats: dict) -> None:
        super().__init__(job, pool, step, stop, stats)
        self.step = step
        self._out: tuple | None = None   # (the block's rows, batch size, the slot as that batch array)

    def __call__(self, k: int, epoch: int, bd, sel: np.ndarray, io_s: float, prep_s: float, fill_s: float = 0.0,
                 requests: int = 0, more: bool = False, ids: np.ndarray | None = None) -> None:
        """Fixed-size rows (raw tokens): the emitter's fast path with nothing of the hand-off left,
        one gather into the slot and the step run on it; the rest takes the emitter's own path.

        The same work and the same records as ``_Emitter.__call__`` + ``_send``, without what
        only a hand-off needs (the metadata dict, the slot wait, the view rebuilt from the
        metadata): at 256 rows of 1 KiB a step is a few tens of microseconds, so every
        microsecond of Python per batch shows in the throughput."""
        arr = bd.array
        n = len(sel)
        out = self._out
        # checked once per block (one rows array per block) and batch size; a weak reference, as
        # holding the block would keep its buffer from the next block's read
        if out is None or out[0]() is not arr or out[1] != n:
            if arr is None or self.job.synthetic or n * self._row_bytes(arr) > self.pool.slot_bytes:
                return super().__call__(k, epoch, bd, sel, io_s, prep_s, fill_s, requests, more, ids)
            out = self._out = (weakref.ref(arr), n, self._slot_view(0, (n,) + arr.shape[1:], arr.dtype))
        tp = now_ns()
        data = out[2]
        # mode="clip": no temporary (the block's order was bounds-checked once); see _Emitter.__call__
        arr.take(sel, axis=0, out=data, mode="clip")
        te = now_ns()
        ids = (bd.ids[sel] if ids is None else ids).astype(_I8, copy=False)
        nbytes = data.nbytes
        prep_s += (te - tp) / 1e9
        self._count(n, nbytes, io_s, prep_s, fill_s, 0.0)
        start_ns, self.start_ns = self.start_ns, None
        self.step.run(k, Batch(index=k, epoch=epoch, indices=ids, labels=None, data=data, layout="array",
                               nbytes=nbytes), nbytes, n, io_s, prep_s, fill_s, requests, te, start_ns)

    def _send(self, k: int, epoch: int, meta: dict, slot: int, ids: np.ndarray, io_s: float, prep_s: float,
              fill_s: float, requests: int, slot_wait_s: float, ready_ns: int, hold: bool = False) -> None:
        if meta["layout"] != "array" or meta.get("inline") is not None or meta.get("labels") is not None:
            # labels, ragged samples, a batch larger than the slot: the worker's metadata, which
            # ``_StepOnSend.batch`` reads as the consumer does
            return super()._send(k, epoch, meta, slot, ids, io_s, prep_s, fill_s, requests, slot_wait_s, ready_ns)
        bs = len(ids)
        self._count(bs, meta["nbytes"], io_s, prep_s, fill_s, slot_wait_s)
        dt = _DTYPES.get(meta["dtype"])   # the consumer's cache of them (slots.batch_from_meta)
        if dt is None:
            dt = _DTYPES[meta["dtype"]] = np.dtype(meta["dtype"])
        batch = Batch(index=k, epoch=epoch, indices=ids.astype(_I8, copy=False), labels=None,
                      data=self._slot_view(slot, meta["shape"], dt), layout="array", nbytes=meta["nbytes"])
        start_ns, self.start_ns = self.start_ns, None
        self.step.run(k, batch, meta["nbytes"], bs, io_s, prep_s, fill_s, requests, ready_ns, start_ns)


def progress_bar(total: int) -> tuple[Any, Any]:
    """A started progress bar of ``total`` steps and its task (both step loops advance it once a step)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("load"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True)
    bar.start()
    return bar, bar.add_task("load", total=total)


def step_loop(st, rec, progress: bool, synthetic: bool, stop_rule=None):
    """``core._step_loop`` for ``workers == 0``: the consumer produces every batch itself, recording
    each step in ``rec`` (a ``core._Steps``, its block-device counter started)."""
    from .sysmon import SystemMonitor
    from .worker import WorkerJob, close_source, new_stats, produce

    from ..formats import get_format

    stop = threading.Event()
    job = WorkerJob.of_load(st, synthetic)
    stats = new_stats(0)
    pool = _OneSlot(st.slot_bytes)
    bar = progress_bar(st.schedule.total) if progress else None
    conn = _StepOnSend(st, rec, pool, stop, stop_rule, bar)
    monitor = SystemMonitor(st.cfg.monitor_interval_s)
    source = st.source
    try:
        monitor.start([os.getpid()], device=rec.device)
        rec.t_spawn = now_ns()
        if not synthetic:
            source.open(worker_id=0)   # storage connections: start-up, as a worker's are
        reader = get_format(st.manifest.format).reader(st.manifest)
        rec.t_start = conn.t_prev = now_ns()
        produce(job, source, reader, _InProcessEmitter(job, pool, conn, stop, stats))   # ends early when stop is set
        rec.t_end = now_ns()
        conn.spread()
        rec.system = monitor.stop(rec.t_start)
    finally:
        if bar is not None:
            bar[0].stop()
        if monitor.running:
            monitor.stop()
        close_source(source, stats)
    rec.done = {0: stats}
    return rec
