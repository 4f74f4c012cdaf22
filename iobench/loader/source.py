"""Where the loader's workers get shard bytes from.

The loader never opens storage itself: it asks a ``ShardSource`` (the base class below: one
required read, defaults for the rest, capability flags).  The default reads from the
dataset's backend; the tiers package supplies one that stages shards through faster tiers
(``iobench.tiers.loader_source``); ``loader.verifying`` wraps either to check checksums.
"""

from __future__ import annotations

import mmap
import os
import random as _random
import sys
import threading
from array import array
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from iobench.errors import IntegrityError
from iobench.io.inputs import open_regular, readinto_full
from iobench.io.retry import RetryPolicy
from iobench.manifest import ShardEntry
from iobench.metrics import now_ns
from iobench.storage import open_backend, planned_read_client, storage_kind
from iobench.wrappers import EmulatedBackend, FaultyBackend, InstrumentedBackend, resolve_emulation

_NOT_REGULAR = "replace it with the shard file"   # a FIFO or device where a shard should be


class ShardSource:
    """Where a worker's shard bytes come from: one required read, ``read_shard``; every other
    read has a default built on it (as fsspec builds ``cat_ranges`` on ``cat_file``), which a
    source overrides where it can do better.  Callers read the capability flags below; they
    never probe for methods.

    A source is made in the parent, pickled into each worker process, and opens its
    connections in ``open`` (called once in the worker before the first read).
    """

    # Capability flags (a subclass sets the ones it has; a wrapper reports its own, honestly).
    supports_range_reads = False   # read_range costs one request (else: a whole shard, sliced)
    supports_record_reads = False  # read_records reads no whole shards (else the worker slices cached shards)
    supports_pieces = False        # read_piece is one streamed request in pieces (else: a whole read, sliced)
    supports_pread = False         # records read in place by positional reads (read_records, read_block_records)
    supports_odirect = False       # whole shards read with O_DIRECT (no page cache)
    supports_mapped_blocks = False  # read_block_records maps a one-shard block (block_read="mmap") instead of reading it
    concurrent_reads = False       # read_shards may run in several threads at once, and gains from it

    _whole: bytes | memoryview | None = None   # the default read_piece's current shard

    def open(self, worker_id: int = 0) -> None:
        """Called once in each worker process before the first read (``worker_id``: its seed offset)."""

    def read_shard(self, shard: ShardEntry) -> bytes | memoryview:
        """The whole shard's contents (one request); a short shard is an ``IntegrityError``."""
        raise NotImplementedError

    def read_shards(self, shards: list[ShardEntry]) -> list[bytes | memoryview]:
        """Several shards' contents (a loader block), in order."""
        return [self.read_shard(s) for s in shards]

    def read_range(self, shard: ShardEntry, start: int, length: int) -> bytes | memoryview:
        """Bytes ``start:start+length`` of the shard (one request where ``supports_range_reads``)."""
        return _exact(memoryview(self.read_shard(shard))[start:start + length], length, shard.path, start)

    def read_piece(self, shard: ShardEntry, start: int, length: int, first: bool) -> bytes | memoryview:
        """The next piece of one sequential streamed read of the shard (``first``: its first piece,
        which pays the request's latency).  By default the first piece reads the whole shard."""
        if first or self._whole is None:
            self._whole = self.read_shard(shard)
        return memoryview(self._whole)[start:start + length]

    def read_piece_into(self, shard: ShardEntry, start: int, out, first: bool) -> None:
        """``read_piece`` into ``out`` (a writable byte buffer of the piece's length)."""
        memoryview(out).cast("B")[:] = memoryview(self.read_piece(shard, start, len(out), first)).cast("B")

    def read_records(self, shards, shard_of: np.ndarray, local: np.ndarray, first: int, length: int,
                     out: np.ndarray, inflight: int = 1) -> int:
        """A batch of fixed-size records (record r of a shard at ``first + r * length``): sample i
        is record ``local[i]`` of ``shards[shard_of[i]]`` and lands in ``out[i]`` (the batch's
        order: ``out`` may be the batch's shared-memory slot).  The caller has checked that every
        record lies in its shard.  Returns the requests made: here one ``read_range`` per record,
        grouped by shard (``inflight``: reads a source may keep in flight at once)."""
        order = np.argsort(shard_of, kind="stable")
        for p, s, x in zip(order.tolist(), shard_of[order].tolist(), local[order].tolist()):
            out[p] = np.frombuffer(self.read_range(shards[s], first + x * length, length), dtype=np.uint8)
        return len(local)

    def read_block_records(self, shards, first: int, length: int, check) -> np.ndarray | None:
        """A block of shards of fixed-size records as one (records, length) array, each shard's
        records landing straight in their place; None where this source cannot (the caller then
        uses ``read_shards``).  ``check(header, shard, records)`` vets each shard's header."""
        return None

    def finish(self) -> None:
        """Called after the last read, before ``close``: complete whatever was left part-read (a
        verifying source checks the shards a stream stopped short of their end; it may read)."""

    def stats(self) -> dict:
        """This worker's counters (bytes read, mergeable histograms per operation)."""
        return {}

    def describe(self) -> dict:
        """JSON-able description for results['environment'] (no secrets)."""
        return {"kind": type(self).__name__}

    def close(self) -> None:
        """Called once in each worker process after the last read."""


def short_read(where: str, got: int, want: int, start: int | None = None):
    """The IntegrityError of a read that returned fewer bytes than asked (one message everywhere)."""
    at = f" offset {start}:" if start is not None else ""
    return IntegrityError(f"{where}:{at} short read ({got} of {want} bytes)")


def ranged_gets(size: int, block_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` of the GETs that read ``size`` bytes in requests of about ``block_size``.

    The object is cut into ``round(size / block_size)`` equal parts (at least one), not into
    full blocks and a remainder: a shard of 8 MiB plus a 64-byte header read with 8 MiB GETs
    would otherwise cost a second, 64-byte GET -- a whole round trip for nothing.
    """
    if size <= 0:
        return []
    n = max(1, round(size / block_size))
    step = -(-size // n)
    return [(a, min(a + step, size)) for a in range(0, size, step)]


@dataclass
class BackendSource(ShardSource):
    """Shards from the dataset's backend, one request per read, through the emulation and fault
    wrappers (every request passes them): any storage kind, and the base of the kinds' own
    sources below, which ``backend_source`` picks.

    Every byte is counted by an ``InstrumentedBackend`` (the outermost wrapper), so the
    latencies it records are the ones the worker saw; reads a subclass makes by other means
    (preads, gathers) are logged here and counted in bulk (``_logged``).
    """

    url: str
    endpoint_url: str | None = None
    storage_options: dict = field(default_factory=dict, repr=False)
    emulation: str | None = None
    seed: int = 0                     # emulation/fault seed; each worker adds its id
    block_size: int = 8 * 2**20
    concurrency: int = 4
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    odirect: bool = False             # local files: O_DIRECT reads into aligned buffers (no page cache)
    block_read: str = "read"          # local files, block access: read | mmap (NOTE [ Block buffers ])
    s3_client: str = "auto"           # auto | s3fs | obstore (iobench.storage.S3_CLIENTS)
    # Per worker, made by open() (None until then: a source is pickled into its workers unopened).
    backend: Any = field(default=None, repr=False, compare=False)
    _rng: Any = field(default=None, init=False, repr=False, compare=False)
    _lock: Any = field(default=None, init=False, repr=False, compare=False)
    _buffers: list = field(default_factory=list, init=False, repr=False, compare=False)
    _log: Any = field(default=None, init=False, repr=False, compare=False)
    _log_bytes: int = field(default=0, init=False, repr=False, compare=False)
    _pool: Any = field(default=None, init=False, repr=False, compare=False)   # helper threads (GETs, preads)

    supports_range_reads = True
    supports_record_reads = True
    supports_pieces = True

    def open(self, worker_id: int = 0) -> None:
        # client_attempts=1: self.retry makes every attempt, so each one is counted (iobench.io.retry)
        b = open_backend(self.url, endpoint_url=self.endpoint_url, storage_options=self.storage_options or None,
                         client_attempts=1, s3_client=self.s3_client)
        b.connect()  # the read client and its session: start-up, before the loader's clock starts
        seed = self.seed * 1_000_003 + worker_id
        if self.error_rate or self.timeout_rate:
            b = FaultyBackend(b, self.error_rate, self.timeout_rate, seed=seed)
        spec = resolve_emulation(self.emulation)
        if spec.active:
            b = EmulatedBackend(b, spec, seed=seed)
        self.backend = InstrumentedBackend(b)
        self._rng = _random.Random(seed)
        # reads may run in several threads at once (a worker's read-ahead, see concurrent_reads):
        # the buffer pool's hand-out (and an object store's GET pool) are guarded.
        self._lock = threading.Lock()
        self._buffers = []
        # Request times are logged here and histogrammed in bulk (``_flush_log``): an hdrh
        # record per request would cost more than the read itself.
        self._log = array("q")
        self._log_bytes = 0

    def _get(self, fn, rel: str, start: int | None = None, end: int | None = None):
        """``fn()``, one GET of ``rel`` (bytes ``[start, end)``), under the retry policy."""
        where = lambda: f"GET {self.backend.path(rel)}" + (f" bytes {start}-{end}" if start is not None else "")  # noqa: E731
        return self.retry.call(fn, where, self._rng)

    def read_shard(self, shard: ShardEntry) -> bytes | memoryview:
        data = self._get(lambda: self.backend.cat(shard.path), shard.path)
        if len(data) < shard.bytes:
            raise short_read(shard.path, len(data), shard.bytes)
        return data

    def read_range(self, shard: ShardEntry, start: int, length: int) -> bytes | memoryview:
        """Bytes ``start:start+length`` of the shard as one request (a ranged GET)."""
        return _exact(self._get(lambda: self.backend.cat(shard.path, start, start + length), shard.path, start,
                                start + length), length, shard.path, start)

    def read_piece(self, shard: ShardEntry, start: int, length: int, first: bool) -> bytes | memoryview:
        """The next piece of one sequential streamed read of the shard (one request's latency)."""
        end = start + length
        return _exact(self._get(lambda: self.backend.cat_stream(shard.path, start, end, first), shard.path, start,
                                end), length, shard.path, start)

    def _logged(self, ns: int, nbytes: int) -> None:
        """One request of ``nbytes`` that took ``ns``, made by other means than the backend's calls."""
        self._log.append(ns)
        self._logged_bytes(nbytes)

    def _logged_bytes(self, nbytes: int) -> None:
        """The bytes of requests whose times were appended to ``_log`` directly (a hot loop's)."""
        self._log_bytes += nbytes
        if len(self._log) >= 65536:
            self._flush_log()

    def _flush_log(self) -> None:
        log = self._log
        if log:
            self.backend.record_many("read", np.frombuffer(log, dtype=np.int64), nread=self._log_bytes)
            del log[:]
            self._log_bytes = 0

    def _direct_buffer(self, size: int):
        """A page-aligned buffer, reused once nothing refers to it (fresh ones cost a page fault per page)."""
        # Under the lock: two read-ahead threads must not both take the same free buffer (the
        # returned reference is on this frame's stack before the lock is released).
        with self._lock:
            pool = self._buffers
            for i in range(len(pool)):
                # refs: the list, and getrefcount's argument; anything more is a live view of the data
                if len(pool[i]) >= size and sys.getrefcount(pool[i]) <= 2:
                    return pool[i]
            buf = np.frombuffer(_anonymous(size), dtype=np.uint8)   # not sliced: views must keep *it* referenced
            if len(pool) < 32:   # a block of shards and blocks read ahead, reused without page faults
                pool.append(buf)
            return buf

    def stats(self) -> dict:
        if self.backend is None:
            return {}
        self._flush_log()
        return self.backend.stats(encode=True)

    def close(self) -> None:
        if self.backend is not None:
            self._flush_log()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def describe(self) -> dict:
        spec = resolve_emulation(self.emulation)
        return {"kind": "backend", "url": self.url, "endpoint_url": self.endpoint_url,
                "emulated": spec.describe() if spec.active else None,
                "faults": {"error_rate": self.error_rate, "timeout_rate": self.timeout_rate}
                if (self.error_rate or self.timeout_rate) else None,
                "s3_block_size": self.block_size, "s3_concurrency": self.concurrency, "odirect": self.odirect,
                "block_read": self.block_read,
                # the client the workers will read with (describe() runs in the parent, before open())
                "read_client": self.backend.read_client if self.backend is not None else
                planned_read_client(self.url, self.s3_client, self.endpoint_url, self.storage_options or None),
                "retry": {"attempts": self.retry.attempts, "budget_s": self.retry.budget_s}}


_HUGE = 2 * 2**20   # a transparent huge page (x86-64, arm64 with 4 KiB pages)
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)   # Linux only: elsewhere the gathers fault the pages in


def _anonymous(size: int) -> mmap.mmap:
    """A page-aligned private buffer of at least ``size`` bytes, in transparent huge pages where
    the kernel gives them (``madvise`` mode included; a huge page is committed whole, so only
    buffers of a few of them ask).  Why huge pages: a batch gathered from a block buffer touches
    a random page per 1 KiB row; an 8 MiB buffer is 2048 small pages, more than the TLB holds
    beside everything else, but 4 huge ones (NOTE [ Block buffers ] in docs/design.md; most of
    the gain over the old mapped path came from reading on the gathering core, this is the
    smaller part)."""
    if size < 2 * _HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m = mmap.mmap(-1, -(-size // _HUGE) * _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with suppress(OSError):   # THP disabled, or not for this kind of mapping: small pages, as before
        m.madvise(mmap.MADV_HUGEPAGE)
    return m


def _exact(data, want: int, where: str, start: int | None = None):
    """``data`` (bytes, or a count of bytes read) when it is ``want`` bytes; else the short read's error."""
    got = data if isinstance(data, int) else len(data)
    if got != want:
        raise short_read(where, got, want, start)
    return data


def _by_shard(shard_of: np.ndarray, local: np.ndarray):
    """A batch's records grouped by shard (stable): (order, local record per sorted record, cut
    points of the groups, the groups' shard indices)."""
    n = len(local)
    order = np.argsort(shard_of, kind="stable")
    so = shard_of[order]
    cuts = [0, *(np.flatnonzero(so[1:] != so[:-1]) + 1).tolist(), n]
    groups = so[cuts[:-1]].tolist() if n else []
    return order, local[order], cuts, groups


def gather_rows(rows_of, shard_of: np.ndarray, local: np.ndarray, out: np.ndarray, scratch):
    """Sample i = row ``local[i]`` of ``rows_of(shard_of[i])`` (a shard's (records, length) array)
    into ``out[i]``: one gather per shard into ``scratch`` (grown where it is too small, and
    returned), then one gather into the batch's order.  mode="clip": no temporary (the caller
    checked the bounds)."""
    n, length = len(local), out.shape[1]
    if scratch is None or scratch.shape[0] < n or scratch.shape[1] != length:
        scratch = np.empty((max(n, 256), length), dtype=np.uint8)
    order, lo, cuts, groups = _by_shard(shard_of, local)
    for g, s in enumerate(groups):
        np.take(rows_of(s), lo[cuts[g]:cuts[g + 1]], axis=0, out=scratch[cuts[g]:cuts[g + 1]], mode="clip")
    inv = np.empty(n, dtype=np.intp)
    inv[order] = np.arange(n)
    np.take(scratch[:n], inv, axis=0, out=out, mode="clip")
    return scratch


def _whole_records(shards, first: int, length: int) -> list[int] | None:
    """Records per shard where every shard is exactly a header of ``first`` bytes and whole
    records of ``length`` (as its manifest entry says); None otherwise (the general path checks it)."""
    counts = [(s.bytes - first) // length for s in shards]
    if any(s.bytes != first + c * length or c != s.samples for s, c in zip(shards, counts)):
        return None
    return counts


def _shorter_than_manifest(shard: ShardEntry, got: int):
    return IntegrityError(f"{shard.path}: offset {got}: file is shorter than the manifest's {shard.bytes} bytes")


def map_shard(fd: int, shard: ShardEntry, flags: int = mmap.MAP_SHARED) -> mmap.mmap:
    """A read-only mapping of the shard's bytes (as many as the manifest says) in the open file ``fd``."""
    size = os.fstat(fd).st_size
    if size < shard.bytes:   # a row past the end of a mapping is SIGBUS, not an error
        raise _shorter_than_manifest(shard, size)
    return mmap.mmap(fd, shard.bytes, flags=flags, prot=mmap.PROT_READ)


@dataclass
class _InPlaceSource(BackendSource):
    """Local files and memory objects (no emulation or faults in the way): samples and pieces
    read by position from a handle kept open per shard (an fd, the object's buffer), a block of
    records each shard's records landing straight in their place in the block."""

    _handles: dict = field(default_factory=dict, init=False, repr=False, compare=False)   # shard path -> handle (LRU)

    supports_pread = True

    def _open_handle(self, shard: ShardEntry):
        raise NotImplementedError

    def _evict(self, handle) -> None:
        """A handle pushed out of the LRU."""

    def _at(self, handle, start: int, length: int) -> bytes:
        """Bytes ``start:start+length`` of the shard ``handle`` holds (one positional read)."""
        raise NotImplementedError

    def _block_rows(self, shard: ShardEntry, first: int, rows, check) -> None:
        """The shard's records into ``rows`` (their place in the block); ``check`` vets its header."""
        raise NotImplementedError

    def _handle(self, shard: ShardEntry):
        """The shard's handle (few kept, LRU-bounded; fsspec's per-call path costs ~50 us a request)."""
        handles = self._handles
        h = handles.pop(shard.path, None)
        if h is None:
            if len(handles) >= 64:
                self._evict(handles.pop(next(iter(handles))))
            h = self._open_handle(shard)
        handles[shard.path] = h  # most recently used last
        return h

    def read_range(self, shard: ShardEntry, start: int, length: int) -> bytes:
        h = self._handle(shard)
        t0 = now_ns()
        data = self._at(h, start, length)
        self._logged(now_ns() - t0, len(data))
        return _exact(data, length, shard.path, start)

    def read_piece(self, shard: ShardEntry, start: int, length: int, first: bool) -> bytes:
        return self.read_range(shard, start, length)

    def read_block_records(self, shards, first: int, length: int, check) -> np.ndarray | None:
        counts = _whole_records(shards, first, length)
        if counts is None:
            return None
        total = sum(counts)
        rows = self._direct_buffer(total * length)[:total * length].reshape(total, length)
        a = 0
        for sh, c in zip(shards, counts):
            self._block_rows(sh, first, rows[a:a + c], check)
            a += c
        return rows

    def close(self) -> None:
        super().close()
        for h in self._handles.values():
            self._evict(h)
        self._handles = {}


@dataclass
class LocalFileSource(_InPlaceSource):
    """Plain local files: whole shards read into reused buffers, or with O_DIRECT (``odirect``);
    samples and pieces by ``pread`` on descriptors kept open per shard; a block of token
    records read in place."""

    _head: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def supports_odirect(self) -> bool:   # type: ignore[override]
        return self.odirect and hasattr(os, "O_DIRECT")

    @property
    def supports_mapped_blocks(self) -> bool:   # type: ignore[override]
        return not self.odirect   # O_DIRECT reads whole shards past the page cache: nothing to map

    def _open_handle(self, shard: ShardEntry) -> int:
        return open_regular(self.backend.base.local_path(shard.path), "shard", _NOT_REGULAR)

    def _evict(self, fd: int) -> None:
        os.close(fd)

    @staticmethod
    def _at(fd: int, start: int, length: int) -> bytes:
        return os.pread(fd, length, start)

    def read_shard(self, shard: ShardEntry) -> memoryview:
        return self._read_direct(shard) if self.odirect else self._read_into_pool(shard)

    def _read_direct(self, shard: ShardEntry) -> memoryview:
        """The whole shard with O_DIRECT preads of about ``block_size`` into a page-aligned buffer.

        The requests are whole pages, cut as ``ranged_gets`` cuts GETs: a shard of 8 MiB plus a
        64-byte header is one request of 8 MiB + 4 KiB, not 8 MiB and then a page.  That page
        alone was a second round trip to the device per shard at queue depth 1 (0.1-10 ms on
        this VM's disk, most of the gap to fio, which reads 8 MiB per file and skips the tail).
        """
        align = mmap.PAGESIZE
        size = -(-shard.bytes // align) * align
        buf = self._direct_buffer(size)
        t0 = now_ns()
        # open_regular: a FIFO swapped in would block forever
        fd = open_regular(self.backend.base.local_path(shard.path), "shard", _NOT_REGULAR, os.O_DIRECT)
        try:
            mv = memoryview(buf)
            off = 0
            for a, b in ranged_gets(size // align, max(1, self.block_size // align)):
                off, end = a * align, min(b * align, shard.bytes)
                while off < end:
                    n = os.preadv(fd, [mv[off:b * align]], off)
                    if n <= 0:
                        break
                    off += n
                if off < end:
                    break   # the file ends before the manifest's size: the short read below
        finally:
            os.close(fd)
        self.backend.record("read", now_ns() - t0, nread=min(off, shard.bytes))
        if off < shard.bytes:
            raise IntegrityError(f"{shard.path}: offset {off}: short O_DIRECT read ({off} of {shard.bytes} bytes)")
        return memoryview(buf[:shard.bytes])

    def _read_into_pool(self, shard: ShardEntry) -> memoryview:
        """A local shard read into a reused buffer."""
        buf = self._direct_buffer(shard.bytes)
        with self.backend.open(shard.path, "rb") as f:
            got = readinto_full(f, memoryview(buf)[:shard.bytes])
        if got < shard.bytes:
            raise _shorter_than_manifest(shard, got)
        return memoryview(buf[:shard.bytes])

    def read_piece_into(self, shard: ShardEntry, start: int, out, first: bool) -> None:
        """One preadv straight into ``out``: no bytes object per piece, whose fresh pages cost a
        fault per 4 KiB, and no second copy."""
        fd = self._handle(shard)
        t0 = now_ns()
        got = os.preadv(fd, [out], start)
        self._logged(now_ns() - t0, got)
        _exact(got, len(out), shard.path, start)

    def read_records(self, shards, shard_of: np.ndarray, local: np.ndarray, first: int, length: int,
                     out: np.ndarray, inflight: int = 1) -> int:
        """A preadv per record straight into its row, grouped by shard (one descriptor looked up
        per shard, not per record), ``inflight`` of them at a time (the calling thread and
        ``inflight - 1`` helper threads; 1: one after another, as a DataLoader worker's
        ``__getitem__`` does).  os.preadv releases the GIL, so ``inflight`` preads are in flight
        until the batch runs out."""
        n = len(local)
        order, lo, cuts, groups = _by_shard(shard_of, local)
        rows = order.tolist()
        offs = (lo * length + first).tolist()
        fds = [0] * n   # record j's descriptor, its shard's
        clock, preadv, append = now_ns, os.preadv, self._log.append   # locals: this loop is the map hot path

        def reads(js) -> None:
            for j in js:
                t0 = clock()
                got = preadv(fds[j], (out[rows[j]],), offs[j])
                append(clock() - t0)
                if got != length:
                    raise short_read(shards[shard_of[rows[j]]].path, got, length, offs[j])

        # several in flight: every shard's descriptor is taken first (the LRU of open descriptors
        # is not for threads, and must not close one a helper is reading); else shard by shard
        shared = inflight > 1 and n > 1 and len(groups) <= 64
        for g, s in enumerate(groups):
            fds[cuts[g]:cuts[g + 1]] = [self._handle(shards[s])] * (cuts[g + 1] - cuts[g])
            if not shared:
                reads(range(cuts[g], cuts[g + 1]))
        if shared:
            if self._pool is None:
                # The helpers live as long as the source (a thread per batch would cost more than a
                # 4 KiB read); a worker's inflight is fixed (its read-ahead + 1), the first batch sizes them.
                self._pool = ThreadPoolExecutor(inflight - 1, thread_name_prefix="iobench-mapread")
            todo = iter(range(n))   # every thread takes its next read from it (atomic under the GIL)
            helping = [self._pool.submit(reads, todo) for _ in range(min(inflight, n) - 1)]
            try:
                reads(todo)
            finally:
                wait(helping)
            for f in helping:
                f.result()   # a helper's error, once every read has stopped
        self._logged_bytes(length * n)
        return n

    def read_block_records(self, shards, first: int, length: int, check) -> np.ndarray | None:
        """One preadv per shard, the header into a scratch buffer and the records into the block
        (a reused buffer in huge pages), or with ``block_read="mmap"`` a block of one shard mapped
        (NOTE [ Block buffers ] in docs/design.md: which is cheaper depends on the CPU's caches).
        None with O_DIRECT (whole shards are read then)."""
        if self.odirect:
            return None
        if self.block_read == "mmap" and len(shards) == 1 and self.supports_mapped_blocks:
            return self._mapped_rows(shards[0], first, length, check)
        return super().read_block_records(shards, first, length, check)

    def _mapped_rows(self, shard: ShardEntry, first: int, length: int, check) -> np.ndarray | None:
        """The shard's records as a view of a populated mapping of it: the page cache's own pages,
        no copy.  The mapping is the block's; it is unmapped when the block's last view goes (the
        worker drops the block before it reads the next)."""
        counts = _whole_records([shard], first, length)
        if not counts or not counts[0]:
            return super().read_block_records([shard], first, length, check)   # the general path checks it
        t0 = now_ns()
        # MAP_POPULATE: the page-table entries made now, in the read's time (no fault per page in the gathers)
        m = map_shard(self._handle(shard), shard, mmap.MAP_SHARED | _MAP_POPULATE)
        self.backend.record("read", now_ns() - t0, nread=shard.bytes)
        check(m[:first], shard, counts[0])
        return np.frombuffer(m, dtype=np.uint8, count=counts[0] * length, offset=first).reshape(counts[0], length)

    def _block_rows(self, shard: ShardEntry, first: int, rows, check) -> None:
        head = self._head
        if head is None or len(head) != first:
            head = self._head = bytearray(first)
        t0 = now_ns()
        got = os.preadv(self._handle(shard), [head, rows], 0)
        self.backend.record("read", now_ns() - t0, nread=got)
        if got != shard.bytes:
            raise _shorter_than_manifest(shard, got)
        check(head, shard, len(rows))


@dataclass
class MemorySource(_InPlaceSource):
    """Plain memory:// objects: the null-storage floor.  Samples and pieces are slices of the
    object's own buffer, a batch of records one gather per shard, a block of records one copy."""

    _views: dict = field(default_factory=dict, init=False, repr=False, compare=False)   # records views
    _scratch: Any = field(default=None, init=False, repr=False, compare=False)

    def _open_handle(self, shard: ShardEntry) -> memoryview:
        return self.backend.base.memory_buffer(shard.path)

    @staticmethod
    def _at(buf: memoryview, start: int, length: int) -> bytes:
        return bytes(buf[start:start + length])

    def _records_view(self, shard: ShardEntry, first: int, length: int) -> np.ndarray:
        """The shard's records as a (records, length) view of the object (cached)."""
        views = self._views
        view = views.get((shard.path, first, length))
        if view is None:
            src = np.frombuffer(self._handle(shard), dtype=np.uint8)
            if len(src) < shard.bytes:
                raise IntegrityError(f"{shard.path}: object holds {len(src)} bytes, the manifest says "
                                     f"{shard.bytes}")
            nrec = (len(src) - first) // length
            if len(views) >= 64:
                views.pop(next(iter(views)))
            view = views[(shard.path, first, length)] = src[first:first + nrec * length].reshape(nrec, length)
        return view

    def read_records(self, shards, shard_of: np.ndarray, local: np.ndarray, first: int, length: int,
                     out: np.ndarray, inflight: int = 1) -> int:
        """One gather per shard into a reused scratch array, then one gather into ``out`` (each
        request's time is then the gathers' time / the records)."""
        n = len(local)
        t0 = now_ns()
        self._scratch = gather_rows(lambda s: self._records_view(shards[s], first, length), shard_of, local, out,
                                    self._scratch)
        dt = now_ns() - t0
        if n:
            self._log.frombytes(np.full(n, dt // n, dtype=np.int64).tobytes())
        self._logged_bytes(length * n)
        return n

    def _block_rows(self, shard: ShardEntry, first: int, rows, check) -> None:
        """One copy of the object's records into the block."""
        t0 = now_ns()
        np.copyto(rows, self._records_view(shard, first, rows.shape[1])[:len(rows)])
        self.backend.record("read", now_ns() - t0, nread=shard.bytes)
        check(self._handle(shard)[:first], shard, len(rows))

    def close(self) -> None:
        self._views = {}   # views of the buffers must go before the buffers are released
        for buf in self._handles.values():
            buf.release()
        super().close()


@dataclass
class ObjectStoreSource(BackendSource):
    """Object stores (S3 and the like): a shard larger than ``block_size`` is fetched as ranged
    GETs of about that size (``ranged_gets``), ``concurrency`` at a time, each retried under
    ``retry``, each landing in its place in a reused buffer (no per-shard allocation, no join of
    parts).  Emulation and faults apply: every GET goes through the wrappers."""

    _in_flight: Any = field(default=None, init=False, repr=False, compare=False)   # whole-shard GETs in flight

    # read_shards may be called from several threads at once, and gains from it: a worker then
    # keeps ``concurrency`` GETs in flight across the blocks it reads ahead, instead of draining
    # the pool at the end of every block (each block's last GET alone on the wire).
    concurrent_reads = True

    def open(self, worker_id: int = 0) -> None:
        super().open(worker_id)
        # whole-shard GETs made by the read-ahead threads themselves obey ``concurrency`` too
        self._in_flight = threading.BoundedSemaphore(self.concurrency)

    def _get_into(self, rel: str, start: int, end: int, out) -> None:
        """One ranged GET straight into ``out`` (retried); a short read is an integrity error."""
        _exact(self._get(lambda: self.backend.cat_into(rel, start, end, out), rel, start, end), end - start, rel,
               start)

    def _get_whole(self, shard: ShardEntry) -> memoryview:
        """A whole shard in one GET (retried), made in this thread: parsed in the client's own
        buffer where that costs no copy (obstore), else read into a reused one of ours (s3fs)."""
        if self.backend.zero_copy_reads:
            with self._in_flight:
                data = self._get(lambda: self.backend.cat_buffer(shard.path, 0, shard.bytes), shard.path)
            return memoryview(_exact(data, shard.bytes, shard.path)).cast("B")
        buf = self._direct_buffer(shard.bytes)
        with self._in_flight:
            self._get_into(shard.path, 0, shard.bytes, memoryview(buf)[:shard.bytes])
        return memoryview(buf[:shard.bytes])

    def read_shard(self, shard: ShardEntry) -> bytes | memoryview:
        return self.read_shards([shard])[0]

    def read_shards(self, shards: list[ShardEntry]) -> list[bytes | memoryview]:
        """Every shard cut into GETs of about ``block_size``, all of the block's GETs sharing one
        pool of ``concurrency`` in flight: a block of small shards costs about one round trip per
        ``concurrency`` GETs, not one per shard."""
        if all(len(ranged_gets(s.bytes, self.block_size)) == 1 for s in shards) and \
                (len(shards) == 1 or self.concurrency == 1):
            # One GET per shard, made in this thread (several shards in one block still go
            # through the pool).
            return [self._get_whole(s) for s in shards]
        bufs = [self._direct_buffer(s.bytes) for s in shards]
        jobs = [(s.path, a, b, memoryview(buf)[a:b])
                for s, buf in zip(shards, bufs) for a, b in ranged_gets(s.bytes, self.block_size)]
        if len(jobs) == 1 or self.concurrency == 1:
            for j in jobs:
                self._get_into(*j)
        else:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="iobench-get")
            futs = [self._pool.submit(self._get_into, *j) for j in jobs]
            try:
                for f in futs:
                    f.result()  # re-raises the original error of the first failed range
            except BaseException:
                for f in futs:
                    f.cancel()
                raise
        return [memoryview(buf[:s.bytes]) for s, buf in zip(shards, bufs)]


def backend_source(url: str, **options) -> BackendSource:
    """The shard source for the dataset at ``url`` (``options``: BackendSource's fields): one
    class per storage kind, each reading in that kind's fastest way.  Emulated or faulty local
    and memory storage is read by the generic ``BackendSource``, so that every request passes
    the wrappers (a pread or a gather would go round them); object stores' GETs pass them anyway."""
    kind = storage_kind(url)
    wrapped = resolve_emulation(options.get("emulation")).active or options.get("error_rate") or \
        options.get("timeout_rate")
    cls: type[BackendSource] = BackendSource
    if kind == "object":
        cls = ObjectStoreSource
    elif not wrapped:
        cls = {"local": LocalFileSource, "memory": MemorySource}.get(kind, BackendSource)
    return cls(url=url, **options)
