"""The consumer's end of the worker → consumer metadata channel.

Each worker has its own pipe and sends small messages (batch metadata, counters, errors)
synchronously from its own thread: an ``mp.Queue`` would hand them to a feeder thread
that can wait a whole GIL switch interval (5 ms) behind the worker's busy main thread.
The consumer reads them itself, only when it needs the next batch; a batch already sent
costs one pipe read and a small unpickle.  Worker errors are re-raised in the consumer.

Waking a process blocked on a pipe costs the writer ~0.1 ms on a VM (an inter-processor
interrupt), on every batch when the consumer is waiting.  So when a core is free for it
(``spin_s`` > 0), the consumer first polls the workers' shared "batches sent" counters for
up to ``spin_s`` (yielding the core between looks) and reads the pipe once a counter moves;
only then does it block.  The pipe still carries every message; the counter is a hint.
"""

from __future__ import annotations

import select
from os import sched_yield
from pickle import HIGHEST_PROTOCOL
from pickle import dumps as _dumps
from time import perf_counter, perf_counter_ns, sleep

from ..errors import StorageError
from .messages import Done, Failed, Ready


class Sender:
    """A worker's end of its pipe.  ``Connection.send`` pickles with a ForkingPickler built
    per message (~12 us for a batch's metadata); plain pickle takes ~6 us and
    ``Connection.recv`` reads it the same way.  The messages carry no file descriptors.

    Batches may be held and sent several to a message (``batch(meta, hold=True)``): each
    message costs the worker a pickle and a pipe write and, when the consumer sleeps on the
    pipe, a wake-up of its process (an inter-processor interrupt on a VM) — per batch, that
    is the hand-off's largest cost where cores are short.  A worker holds a batch only when
    it goes straight on to collate the next one into a free slot (the rest of a block already
    in memory) and the consumer has two batches in hand (``worker._HOLD_WHILE_QUEUED``: a held
    batch never leaves it idle); whatever is held goes out before the worker can wait for anything (a slot,
    the next block's reads: ``flush``), before any other message, and at ``max_held``, so a
    held batch is late by at most the collation of the ones after it.  ``sent`` (the shared
    counters the consumer polls) counts batches, after their message is written.
    """

    __slots__ = ("conn", "sent", "wid", "held", "max_held")

    def __init__(self, conn, sent, wid: int = 0, max_held: int = 8) -> None:
        self.conn = conn
        self.sent = sent
        self.wid = wid
        self.held: list = []
        self.max_held = max(1, int(max_held))

    def send(self, msg) -> None:
        if self.held:
            self.flush()
        self.conn.send_bytes(_dumps(msg, HIGHEST_PROTOCOL))

    def batch(self, meta: dict, hold: bool = False) -> None:
        """Batch metadata: sent now, or held (``hold``) for one message with the next ones."""
        self.held.append(meta)
        if not hold or len(self.held) >= self.max_held:
            self.flush()

    def flush(self) -> None:
        held = self.held
        if not held:
            return
        self.held = []
        self.conn.send_bytes(_dumps(("batch", held[0]) if len(held) == 1 else ("batches", held), HIGHEST_PROTOCOL))
        self.sent[self.wid] += len(held)  # after the write: a consumer that sees it finds the message


class Receiver:
    def __init__(self, readers: list, procs: list, sent=None, spin_s: float = 0.0, build=None) -> None:
        self.readers = list(readers)
        self.by_worker = list(readers)      # worker id -> its pipe
        self.sent = sent                    # shared per-worker counters of batch messages written
        self.got = [0] * len(self.by_worker)
        self.spin_ns = int(spin_s * 1e9) if sent is not None else 0
        self.procs = procs
        self.batches: dict[int, dict] = {}
        self.done: dict[int, dict] = {}
        self.started: set[int] = set()
        self.overflow = 0
        # One poll object for the whole run: multiprocessing.connection.wait builds and fills a
        # selector on every call, ~10-20 us on each step that blocks.
        self._poll = select.poll()
        self._by_fd = {r.fileno(): r for r in self.readers}
        for fd in self._by_fd:
            self._poll.register(fd, select.POLLIN)
        # build(meta) -> the consumer's Batch view.  Batches that arrive while the consumer is
        # idle (the device computing) are built then, off the step's critical path: a view built
        # right after a wake-up costs ~60 us of cold caches on a VM, 1% of a 5 ms step.
        self.build = build
        self.built: dict[int, object] = {}

    def _handle(self, msg) -> None:
        if type(msg) is tuple:   # batch metadata (messages.py: the hot path stays a plain tuple)
            for meta in (msg[1],) if msg[0] == "batch" else msg[1]:
                self.got[meta["worker"]] += 1
                self.batches[meta["k"]] = meta
                self.overflow += meta.get("inline") is not None
        elif isinstance(msg, Ready):
            self.started.add(msg.worker)
        elif isinstance(msg, Done):
            self.done[msg.worker] = msg.stats
        elif isinstance(msg, Failed):
            msg.error.reraise(msg.worker)
        else:
            raise TypeError(f"unknown loader worker message {type(msg).__name__}")

    def _pump(self, timeout_s: float) -> bool:
        """Read whatever is ready (waiting up to ``timeout_s``); False if nothing came."""
        if not self.readers:
            return False
        got = False
        for fd, _ev in self._poll.poll(max(0, int(timeout_s * 1000))):
            r = self._by_fd[fd]
            try:
                msg = r.recv()
            except (EOFError, OSError):   # the write end is closed (and drained)
                self.readers.remove(r)
                self._poll.unregister(fd)
                continue
            got = True
            self._handle(msg)
        return got

    def _check_workers(self, k: int) -> None:
        dead = [p for p in self.procs if not p.is_alive() and p.exitcode not in (0, None)]
        if dead:
            raise StorageError(f"loader worker {dead[0].name} died (exit code {dead[0].exitcode})")
        if all(not p.is_alive() for p in self.procs) and not self._pump(0.1):
            raise StorageError(f"loader workers exited before batch {k} arrived")

    def _spin(self, k: int) -> None:
        """Poll the sent counters for up to spin_ns; read each pipe whose counter moved."""
        sent, got, by_worker = self.sent, self.got, self.by_worker
        n = len(by_worker)
        end = perf_counter_ns() + self.spin_ns
        while k not in self.batches:
            moved = False
            for w in range(n):
                if sent[w] > got[w]:
                    moved = True
                    try:
                        msg = by_worker[w].recv()
                    except (EOFError, OSError):
                        return
                    self._handle(msg)
            if not moved:
                if perf_counter_ns() > end:
                    return
                sched_yield()  # a pure spin measured far worse whenever other work shares the cores

    def wait_batch(self, k: int) -> dict:
        if self.spin_ns and k not in self.batches:
            self._spin(k)
        while k not in self.batches:
            if not self._pump(0.5) and k not in self.batches:
                self._check_workers(k)
        return self.batches.pop(k)

    def wait_started(self, n: int) -> None:
        """Until every worker has opened its storage connection and format reader."""
        while len(self.started) < n:
            if not self._pump(0.5) and len(self.started) < n:
                self._check_workers(0)

    def idle(self, timeout_s: float) -> None:
        """Take messages for up to ``timeout_s`` (returns early once something arrived)."""
        if not self.readers:
            sleep(timeout_s)
            return
        self._pump(timeout_s)
        if self.build is not None and len(self.built) < len(self.batches):
            for k, meta in self.batches.items():
                if k not in self.built:
                    self.built[k] = self.build(meta)

    def take_built(self, k: int):
        """Batch ``k``'s view if it was built while idle, else None."""
        return self.built.pop(k, None) if self.built else None

    def ready(self) -> int:
        """Batches received and not yet consumed."""
        return len(self.batches)

    def wait_done(self, n: int, timeout_s: float) -> None:
        end = perf_counter() + timeout_s
        while len(self.done) < n and self.readers and perf_counter() < end:
            if not self._pump(0.2) and all(not p.is_alive() for p in self.procs):
                self._pump(0)
                return
