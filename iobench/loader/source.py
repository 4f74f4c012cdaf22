"""Where the loader's workers get shard bytes from.

The loader never opens storage itself: it asks a ``ShardSource``.  The default reads
from the dataset's backend; the tiers package supplies one that stages shards through
faster tiers (``iobench.tiers.loader_source``).  A source is created in the parent,
pickled into each worker process, and must open connections lazily (``open()`` runs in
the worker before the first read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from iobench.manifest import ShardEntry

if TYPE_CHECKING:
    import numpy as np


@runtime_checkable
class ShardSource(Protocol):
    def open(self) -> None:
        """Called once in each worker process before the first read."""

    def read_shard(self, shard: ShardEntry) -> "bytes | memoryview":
        """The whole shard's contents; bytes read are counted by the source's backend."""

    # Optional (the loader falls back to whole-shard reads, sliced, without them):
    #   read_range(shard, start, length) -> bytes   one request: a sample for the map pattern
    #   read_piece(shard, start, length, first) -> bytes   the next piece of one streamed request

    def close(self) -> None:
        """Called once in each worker process after the last read."""

    def describe(self) -> dict:
        """JSON-able description for results['environment'] (no secrets)."""


# ---------------------------------------------------------------------------------------
# The default source: read shards straight from the dataset's backend.

import random as _random  # noqa: E402
import threading  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

from iobench.io.retry import RetryPolicy  # noqa: E402

def short_read(where: str, got: int, want: int, start: int | None = None):
    """The IntegrityError of a read that returned fewer bytes than asked (one message everywhere)."""
    from iobench.errors import IntegrityError

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



class _ReadCrew:
    """Helper threads that share one batch's reads with the calling thread (map, local files).

    ``run(fn)`` calls ``fn`` in the caller and in every helper at once and returns when all
    have returned (re-raising the first error); ``fn`` takes its next read from a shared
    counter, so ``helpers + 1`` preads are in flight until the batch runs out (os.preadv
    releases the GIL).  The helpers live as long as the source: a thread per batch would
    cost more than a 4 KiB read."""

    def __init__(self, helpers: int) -> None:
        self._go = [threading.Semaphore(0) for _ in range(helpers)]
        self._done = threading.Semaphore(0)
        self._fn = None
        self._err: BaseException | None = None
        self._threads = [threading.Thread(target=self._serve, args=(g,), daemon=True, name="iobench-mapread")
                         for g in self._go]
        for t in self._threads:
            t.start()

    @property
    def size(self) -> int:
        return len(self._threads) + 1

    def _serve(self, go) -> None:
        while True:
            go.acquire()
            fn = self._fn
            if fn is None:
                return
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 — re-raised in the caller by run()
                self._err = self._err or e
            finally:
                self._done.release()

    def run(self, fn) -> None:
        self._fn, self._err = fn, None
        for g in self._go:
            g.release()
        try:
            fn()
        finally:
            for _ in self._go:
                self._done.acquire()
        if self._err is not None:
            raise self._err

    def close(self) -> None:
        self._fn = None
        for g in self._go:
            g.release()
        for t in self._threads:
            t.join()


@dataclass
class BackendSource:
    """Reads whole shards from the dataset's backend, through the emulation/fault wrappers.

    On object stores a shard larger than ``block_size`` is fetched as ranged GETs of about
    that size (``ranged_gets``),
    ``concurrency`` at a time, each retried under ``retry``; elsewhere one read per shard.
    Every byte is counted by an ``InstrumentedBackend`` (the outermost wrapper), so the
    latencies it records are the ones the worker saw.
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
    s3_client: str = "auto"           # auto | s3fs | obstore (iobench.storage.S3_CLIENTS)
    backend: object = field(default=None, repr=False)   # set by open()

    def open(self, worker_id: int = 0) -> None:
        from iobench.storage import open_backend
        from iobench.wrappers import EmulatedBackend, FaultyBackend, InstrumentedBackend, resolve_emulation

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
        self._pool = None
        # read_shards may run in several threads at once (a worker's read-ahead, see concurrent_reads):
        # the GET pool's creation and the buffer pool's hand-out are guarded.
        self._lock = threading.Lock()
        # whole-shard GETs made by the read-ahead threads themselves obey ``concurrency`` too
        self._in_flight = threading.BoundedSemaphore(self.concurrency)

    @property
    def concurrent_reads(self) -> bool:
        """read_shards may be called from several threads at once, and gains from it: on object
        stores a worker then keeps ``concurrency`` GETs in flight across the blocks it reads
        ahead, instead of draining the pool at the end of every block (each block's last GET
        alone on the wire)."""
        return self.backend is not None and self.backend.parallel_ranged_reads

    def _get(self, rel: str, start: int | None, end: int | None):
        where = lambda: f"GET {self.backend.path(rel)}" + (f" bytes {start}-{end}" if start is not None else "")  # noqa: E731
        return self.retry.call(lambda: self.backend.cat(rel, start, end), where, self._rng)

    def _get_into(self, rel: str, start: int, end: int, out) -> None:
        """One ranged GET straight into ``out`` (retried); a short read is an integrity error."""
        where = lambda: f"GET {self.backend.path(rel)} bytes {start}-{end}"  # noqa: E731
        n = self.retry.call(lambda: self.backend.cat_into(rel, start, end, out), where, self._rng)
        if n != end - start:
            raise short_read(rel, n, end - start, start)

    def _get_buffer(self, shard: ShardEntry) -> memoryview:
        """A whole shard in one GET (retried), as a view of the buffer the client filled."""
        where = lambda: f"GET {self.backend.path(shard.path)}"  # noqa: E731
        with self._in_flight:
            data = self.retry.call(lambda: self.backend.cat_buffer(shard.path, 0, shard.bytes), where, self._rng)
        if len(data) != shard.bytes:
            raise short_read(shard.path, len(data), shard.bytes)
        return memoryview(data).cast("B")

    def _get_whole_into(self, shard: ShardEntry) -> memoryview:
        """A whole shard in one GET (retried) into a reused buffer of ours."""
        buf = self._direct_buffer(shard.bytes)
        with self._in_flight:
            self._get_into(shard.path, 0, shard.bytes, memoryview(buf)[:shard.bytes])
        return memoryview(buf[:shard.bytes])

    def read_shard(self, shard: ShardEntry) -> "bytes | memoryview":
        return self.read_shards([shard])[0]

    def read_shards(self, shards: "list[ShardEntry]") -> "list[bytes | memoryview]":
        """Several shards' contents (a loader block), in order.

        On object stores every shard is cut into GETs of about ``block_size`` and all of the
        block's GETs share one pool of ``concurrency`` in flight, so a block of small shards
        costs about one round trip per ``concurrency`` GETs, not one per shard; each GET lands
        in its place in a reused buffer (no per-shard allocation, no join of parts).
        """
        if self.backend is None:
            self.open()
        if self.odirect and self.backend.base.supports_odirect:
            return [self._read_direct(s) for s in shards]
        if self.backend.is_local and self.backend.inner is self.backend.base:
            return [self._read_into_pool(s) for s in shards]
        if not self.backend.parallel_ranged_reads:
            return [self._get(s.path, None, None) for s in shards]
        if all(len(ranged_gets(s.bytes, self.block_size)) == 1 for s in shards) and \
                (len(shards) == 1 or self.concurrency == 1):
            # One GET per shard, made in this thread: each shard is parsed in the client's own
            # buffer where that costs no copy (obstore), else read into a reused one of ours
            # (s3fs).  Several shards in one block still go through the pool.
            if self.backend.base.zero_copy_reads:
                return [self._get_buffer(s) for s in shards]
            return [self._get_whole_into(s) for s in shards]
        bufs = [self._direct_buffer(s.bytes) for s in shards]
        jobs = []
        for s, buf in zip(shards, bufs):
            out = memoryview(buf)
            for start, end in ranged_gets(s.bytes, self.block_size):
                jobs.append((s.path, start, end, out[start:end]))
        if len(jobs) == 1 or self.concurrency == 1:
            for j in jobs:
                self._get_into(*j)
        else:
            from concurrent.futures import ThreadPoolExecutor

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
        del jobs
        return [memoryview(buf[:s.bytes]) for s, buf in zip(shards, bufs)]

    def _read_direct(self, shard: ShardEntry) -> memoryview:
        """The whole shard with O_DIRECT preads of about ``block_size`` into a page-aligned buffer.

        The requests are whole pages, cut as ``ranged_gets`` cuts GETs: a shard of 8 MiB plus a
        64-byte header is one request of 8 MiB + 4 KiB, not 8 MiB and then a page.  That page
        alone was a second round trip to the device per shard at queue depth 1 (0.1-10 ms on
        this VM's disk, most of the gap to fio, which reads 8 MiB per file and skips the tail).
        """
        import mmap
        import os

        from iobench.metrics import now_ns

        align = mmap.PAGESIZE
        size = -(-shard.bytes // align) * align
        buf = self._direct_buffer(size)
        path = self.backend.base.local_path(shard.path)
        t0 = now_ns()
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
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
            from iobench.errors import IntegrityError

            raise IntegrityError(f"{shard.path}: offset {off}: short O_DIRECT read ({off} of {shard.bytes} bytes)")
        return memoryview(buf[:shard.bytes])

    def _read_into_pool(self, shard: ShardEntry) -> memoryview:
        """A local shard read into a reused buffer (plain local files: no emulation or faults in the way)."""
        buf = self._direct_buffer(shard.bytes)
        mv = memoryview(buf)[:shard.bytes]
        got = 0
        with self.backend.open(shard.path, "rb") as f:
            while got < shard.bytes:
                n = f.readinto(mv[got:])
                if not n:
                    break
                got += n
        if got < shard.bytes:
            from iobench.errors import IntegrityError

            raise IntegrityError(f"{shard.path}: offset {got}: file is shorter than the manifest's {shard.bytes} bytes")
        return memoryview(buf[:shard.bytes])

    def read_range(self, shard: ShardEntry, start: int, length: int) -> "bytes | memoryview":
        """Bytes ``start:start+length`` of the shard as one request (a ranged GET, one pread)."""
        if self.backend is None:
            self.open()
        if self.backend.inner is self.backend.base and self.backend.supports_pread:
            return self._pread(shard, start, length)
        data = self._get(shard.path, start, start + length)
        if len(data) != length:
            raise short_read(shard.path, len(data), length, start)
        return data

    def read_piece(self, shard: ShardEntry, start: int, length: int, first: bool) -> "bytes | memoryview":
        """The next piece of one sequential streamed read of the shard (one request's latency)."""
        if self.backend is None:
            self.open()
        if self.backend.inner is self.backend.base and self.backend.supports_pread:
            return self._pread(shard, start, length)
        where = lambda: f"GET {self.backend.path(shard.path)} bytes {start}-{start + length}"  # noqa: E731
        data = self.retry.call(lambda: self.backend.cat_stream(shard.path, start, start + length, first), where,
                               self._rng)
        if len(data) != length:
            raise short_read(shard.path, len(data), length, start)
        return data

    def read_piece_into(self, shard: ShardEntry, start: int, out, first: bool) -> None:
        """``read_piece`` into ``out`` (a writable byte buffer of the piece's length).  Plain local
        files are read straight into it (one preadv): no bytes object per piece, whose fresh pages
        cost a fault per 4 KiB, and no second copy."""
        if self.backend is None:
            self.open()
        if self.backend.inner is self.backend.base and self.backend.supports_pread:
            fd = self._handle(shard)
            if isinstance(fd, int):
                import os

                from iobench.metrics import now_ns

                t0 = now_ns()
                got = os.preadv(fd, [out], start)
                self._logged(now_ns() - t0, got)
                if got != len(out):
                    raise short_read(shard.path, got, len(out), start)
                return
        memoryview(out).cast("B")[:] = memoryview(self.read_piece(shard, start, len(out), first)).cast("B")

    def read_records(self, shards, shard_of: np.ndarray, local: np.ndarray, first: int, length: int,
                     out: np.ndarray, inflight: int = 1) -> int:
        """A batch of fixed-size records (record r of a shard at ``first + r * length``), one
        request per record: sample i is record ``local[i]`` of ``shards[shard_of[i]]`` and lands
        in ``out[i]`` (the batch's order: ``out`` may be the batch's shared-memory slot, so no
        second copy).  Returns the number of requests.

        The requests are made grouped by shard (each shard's back to back: one descriptor or
        object looked up per shard, not per record).  The caller has checked every ``local``
        lies in its shard.  Plain local files: a preadv per record straight into its row,
        ``inflight`` of them at a time (the calling thread and ``inflight - 1`` helpers,
        ``_ReadCrew``; 1: one after another, as a DataLoader worker's ``__getitem__`` does).
        Plain memory:// objects: one gather per shard into a reused scratch array, then one
        gather into ``out`` (the null-storage floor; each request's time is then the gathers'
        time / the records).  Others: ``read_range`` per record."""
        import numpy as np

        from iobench.metrics import now_ns

        if self.backend is None:
            self.open()
        log = self._request_log()
        n = len(local)
        order = np.argsort(shard_of, kind="stable")
        so = shard_of[order]
        lo = local[order]
        if not (self.backend.inner is self.backend.base and self.backend.supports_pread):
            for p, s, x in zip(order.tolist(), so.tolist(), lo.tolist()):
                out[p] = np.frombuffer(self.read_range(shards[s], first + x * length, length), dtype=np.uint8)
            return n
        cuts = [0, *(np.flatnonzero(so[1:] != so[:-1]) + 1).tolist(), n]
        groups = so[cuts[:-1]].tolist() if n else []
        if self.backend.base.protocol == "memory":
            scratch = self.__dict__.get("_scratch")
            if scratch is None or scratch.shape[0] < n or scratch.shape[1] != length:
                scratch = self._scratch = np.empty((max(n, 256), length), dtype=np.uint8)
            t0 = now_ns()
            for g, s in enumerate(groups):
                a, b = cuts[g], cuts[g + 1]
                # mode="clip": no temporary (bounds were checked by the caller and by _records_view)
                np.take(self._records_view(shards[s], first, length), lo[a:b], axis=0, out=scratch[a:b], mode="clip")
            inv = np.empty(n, dtype=np.intp)
            inv[order] = np.arange(n)
            np.take(scratch[:n], inv, axis=0, out=out, mode="clip")
            dt = now_ns() - t0
            if n:
                log.frombytes(np.full(n, dt // n, dtype=np.int64).tobytes())
        else:
            import os

            rows = order.tolist()
            offs = (lo * length + first).tolist()
            clock, preadv, append = now_ns, os.preadv, log.append   # locals: this loop is the map hot path
            # several in flight: every shard's descriptor is taken first, here (the LRU of open
            # descriptors is not for threads, and must not close one a helper is reading)
            if inflight > 1 and n > 1 and len(groups) <= 64:
                self._crew_reads(shards, groups, cuts, rows, offs, out, length, min(inflight, n))
                groups = ()
            for g, s in enumerate(groups):
                sh = shards[s]
                fd = self._handle(sh)
                for j in range(cuts[g], cuts[g + 1]):
                    t0 = clock()
                    got = preadv(fd, (out[rows[j]],), offs[j])
                    append(clock() - t0)
                    if got != length:
                        raise short_read(sh.path, got, length, offs[j])
        self._log_bytes += length * n
        if len(log) >= 65536:
            self._flush_log()
        return n

    def _crew_reads(self, shards, groups, cuts, rows, offs, out, length: int, inflight: int) -> None:
        """One batch's record preads, ``inflight`` at a time (read_records' local-file path)."""
        import itertools
        import os

        from iobench.metrics import now_ns

        fds = []
        for g, s in enumerate(groups):
            fds += [self._handle(shards[s])] * (cuts[g + 1] - cuts[g])
        crew = self.__dict__.get("_crew")
        if crew is None or crew.size != inflight:
            if crew is not None:
                crew.close()
            crew = self._crew = _ReadCrew(inflight - 1)
        n, nxt = len(rows), itertools.count().__next__   # next() on a count is atomic under the GIL
        clock, preadv, append = now_ns, os.preadv, self._log.append

        def reads() -> None:
            while (j := nxt()) < n:
                t0 = clock()
                got = preadv(fds[j], (out[rows[j]],), offs[j])
                append(clock() - t0)
                if got != length:
                    path = next(shards[s].path for g, s in enumerate(groups) if cuts[g] <= j < cuts[g + 1])
                    raise short_read(path, got, length, offs[j])

        crew.run(reads)

    def read_block_records(self, shards, first: int, length: int, check) -> "np.ndarray | None":
        """A loader block of fixed-size records as one (records, length) array: each shard read
        whole (one request), its records landing straight in their place after the previous
        shard's -- no per-shard buffer and no concatenation after.  None where this source
        cannot (O_DIRECT, emulated or faulty storage, object stores: ``read_shards`` then).

        Plain local files: one preadv per shard, the header into a scratch buffer and the
        records into the block.  Plain memory:// objects: one copy of the object's records.
        ``check(header, shard, records)`` (the format reader's) vets each shard's header."""
        import numpy as np

        from iobench.metrics import now_ns

        if self.backend is None:
            self.open()
        base = self.backend.base
        if self.odirect or not (self.backend.inner is base and self.backend.supports_pread):
            return None
        counts = [(s.bytes - first) // length for s in shards]
        if any(s.bytes != first + c * length or c != s.samples for s, c in zip(shards, counts)):
            return None      # not exactly header + whole records: the general path checks it
        import mmap

        if len(shards) == 1 and base.protocol != "memory" and hasattr(mmap, "MAP_POPULATE"):
            mapped = self._mapped_records(shards[0], first, length, counts[0], check)
            if mapped is not None:
                return mapped
        total = sum(counts)
        rows = self._direct_buffer(total * length)[:total * length].reshape(total, length)
        a = 0
        for sh, c in zip(shards, counts):
            t0 = now_ns()
            if base.protocol == "memory":
                np.copyto(rows[a:a + c], self._records_view(sh, first, length)[:c])
                got = sh.bytes
                head = self._handle(sh)[:first]
            else:
                import os

                head = self.__dict__.get("_head")
                if head is None or len(head) != first:
                    head = self._head = bytearray(first)
                got = os.preadv(self._handle(sh), [head, rows[a:a + c]], 0)
            self.backend.record("read", now_ns() - t0, nread=got)
            if got != sh.bytes:
                from iobench.errors import IntegrityError

                raise IntegrityError(f"{sh.path}: offset {got}: file is shorter than the manifest's {sh.bytes} bytes")
            check(head, sh, c)
            a += c
        return rows

    def _mapped_records(self, shard: ShardEntry, first: int, length: int, count: int, check) -> "np.ndarray | None":
        """A block of one plain local shard: its records as a view of the file's page-cache pages.

        What memmap token loaders (nanoGPT, Megatron) do: the loader's gather copies each record
        from the page cache straight into its batch slot, where a read would copy the whole
        shard into a buffer first (two copies of every byte).  MAP_POPULATE maps the whole shard
        in this call, so its time and bytes are counted here, as a read's would be, and the
        gather never faults.  The mapping lives as long as the view (the block's batches), no longer.

        Only a shard wholly in the page cache (``pagecache.resident_pages_fd``) is mapped; None otherwise, and it is
        read: faulting a cold shard in reads it 128 KiB at a time, one request after another
        (0.79x a read, cold, 3 alternating rounds), where a read gets the kernel's large read-ahead."""
        import mmap
        import os

        import numpy as np

        from iobench.io.pagecache import resident_pages_fd
        from iobench.metrics import now_ns

        fd = self._handle(shard)
        t0 = now_ns()
        size = os.fstat(fd).st_size
        res = resident_pages_fd(fd, min(size, shard.bytes))
        if res is None or res[0] < res[1]:
            return None
        if size < shard.bytes:   # mapping past the end would fault (SIGBUS) in the gather
            raise short_read(shard.path, size, shard.bytes)
        m = mmap.mmap(fd, shard.bytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
        self.backend.record("read", now_ns() - t0, nread=shard.bytes)
        data = np.frombuffer(m, dtype=np.uint8)
        check(data[:first], shard, count)
        return data[first:first + count * length].reshape(count, length)

    def _records_view(self, shard: ShardEntry, first: int, length: int) -> np.ndarray:
        """A plain memory:// shard's records as a (records, length) view of the object (cached)."""
        import numpy as np

        views = self.__dict__.setdefault("_views", {})
        view = views.get((shard.path, first, length))
        if view is None:
            src = np.frombuffer(self._handle(shard), dtype=np.uint8)
            if len(src) < shard.bytes:
                from iobench.errors import IntegrityError

                raise IntegrityError(f"{shard.path}: object holds {len(src)} bytes, the manifest says "
                                     f"{shard.bytes}")
            nrec = (len(src) - first) // length
            if len(views) >= 64:
                views.pop(next(iter(views)))
            view = views[(shard.path, first, length)] = src[first:first + nrec * length].reshape(nrec, length)
        return view

    def _handle(self, shard: ShardEntry):
        """Plain local files: a descriptor kept open per shard (few, LRU-bounded); plain memory://
        objects: the object's buffer (fsspec's per-call path costs ~50 us a request)."""
        import os

        fds = self.__dict__.setdefault("_fds", {})
        fd = fds.pop(shard.path, None)
        base = self.backend.base
        if fd is None:
            if len(fds) >= 64:
                old = fds.pop(next(iter(fds)))
                if isinstance(old, int):
                    os.close(old)
            if base.protocol == "memory":
                fd = base.fs.store[base.fs._strip_protocol(base.path(shard.path))].getbuffer()
            else:
                fd = os.open(base.local_path(shard.path), os.O_RDONLY)
        fds[shard.path] = fd  # most recently used last
        self._request_log()
        return fd

    def _request_log(self):
        """Request times are logged here and histogrammed in bulk (``_flush_log``): an hdrh
        record per request would cost more than the read itself."""
        log = self.__dict__.get("_log")
        if log is None:
            from array import array

            log = self._log = array("q")
            self._log_bytes = 0
        return log

    def _pread(self, shard: ShardEntry, start: int, length: int) -> bytes:
        import os

        from iobench.metrics import now_ns

        fd = self._handle(shard)
        t0 = now_ns()
        data = os.pread(fd, length, start) if isinstance(fd, int) else bytes(fd[start:start + length])
        self._logged(now_ns() - t0, len(data))
        if len(data) != length:
            raise short_read(shard.path, len(data), length, start)
        return data

    def _logged(self, ns: int, nbytes: int) -> None:
        """One request of ``nbytes`` that took ``ns`` (after ``_handle``, which makes the log)."""
        self._log.append(ns)
        self._log_bytes += nbytes
        if len(self._log) >= 65536:
            self._flush_log()

    def _direct_buffer(self, size: int):
        """A page-aligned buffer, reused once nothing refers to it (fresh ones cost a page fault per page)."""
        import mmap
        import sys

        import numpy as np

        # Under the lock: two read-ahead threads must not both take the same free buffer (the
        # returned reference is on this frame's stack before the lock is released).
        with self._lock:
            pool = self.__dict__.setdefault("_direct_pool", [])
            for i in range(len(pool)):
                # refs: the list, and getrefcount's argument; anything more is a live view of the data
                if len(pool[i]) >= size and sys.getrefcount(pool[i]) <= 2:
                    return pool[i]
            buf = np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)
            if len(pool) < 32:   # a block of shards and blocks read ahead, reused without page faults
                pool.append(buf)
            return buf

    def _flush_log(self) -> None:
        log = self.__dict__.get("_log")
        if log:
            import numpy as np

            self.backend.record_many("read", np.frombuffer(log, dtype=np.int64), nread=self._log_bytes)
            del log[:]
            self._log_bytes = 0

    def stats(self) -> dict:
        if self.backend is None:
            return {}
        self._flush_log()
        return self.backend.stats(encode=True)

    def close(self) -> None:
        import os

        if self.backend is not None:
            self._flush_log()

        crew = self.__dict__.pop("_crew", None)
        if crew is not None:
            crew.close()
        self.__dict__.pop("_views", None)   # views of memory:// buffers must go before the buffers are released
        for fd in self.__dict__.pop("_fds", {}).values():
            if isinstance(fd, int):
                os.close(fd)
            else:
                fd.release()
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _planned_client(self) -> str:
        """The client the workers will read with (describe() runs in the parent, before open())."""
        if not str(self.url).startswith("s3://"):
            return "fsspec"
        from iobench.storage import _s3_reader, s3_options

        r = _s3_reader(self.s3_client, s3_options(self.endpoint_url, self.storage_options or None), "load.s3_client")
        return r.name if r is not None else "s3fs"

    def describe(self) -> dict:
        from iobench.wrappers import resolve_emulation

        spec = resolve_emulation(self.emulation)
        return {"kind": "backend", "url": self.url, "endpoint_url": self.endpoint_url,
                "emulated": spec.describe() if spec.active else None,
                "faults": {"error_rate": self.error_rate, "timeout_rate": self.timeout_rate}
                if (self.error_rate or self.timeout_rate) else None,
                "s3_block_size": self.block_size, "s3_concurrency": self.concurrency, "odirect": self.odirect,
                "read_client": self.backend.read_client if self.backend is not None else self._planned_client(),
                "retry": {"attempts": self.retry.attempts, "budget_s": self.retry.budget_s}}
