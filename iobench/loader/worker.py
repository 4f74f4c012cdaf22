"""A loader worker process: read samples, collate batches into slots, per access pattern.

Which batches a worker makes, and from which reads (``load.access``; orders in ``sampler``):

- ``map``: batch ``j`` of an epoch is worker ``j % W``'s; it reads each of the batch's
  samples with one ranged request (one file per sample for ``files``), like a PyTorch
  map-style Dataset's ``__getitem__`` called per index.
- ``stream``: the worker streams its shards in order — one streamed request per shard, read
  in pieces of whole samples of about ``stream_read_size`` bytes (Parquet: a row group per
  piece) — into its shuffle buffer, and cuts a batch each time ``batch_size`` samples left.
- ``block``: worker ``w`` takes blocks ``b % W == w``, reads every shard of the block, then
  cuts the block into batches (the block's reads all land on its first batch: lumpy).

Per batch it reports ``io_s`` — storage time spent producing that batch (the requests made
for it) — and ``prep_s`` (parse, decode, gather, copy into the slot).  ``fill_s`` is the
storage time of a stream's shuffle-buffer fill (the first ``buffer`` samples of each epoch),
reported apart so that warm-up never enters the batch I/O percentiles.  Waiting for a free
slot is back-pressure, not I/O, and is reported apart too.
"""

from __future__ import annotations

import gc
import io
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ConfigError, IntegrityError
from ..lifeline import die_with_parent
from ..manifest import Manifest
from ..metrics import now_ns
from ..units import parse_size
from .messages import Done, ExceptionWrapper, Failed, Ready
from .sampler import order_of
from .source import ShardSource


@dataclass
class WorkerJob:
    wid: int
    workers: int
    manifest: Manifest
    plans: list[Any]              # EpochPlan (block), MapEpoch (map) or StreamEpoch (stream): sampler
    total_batches: int
    decode: bool
    synthetic: bool = False       # no I/O: batches of the right size from memory (stall analysis)
    read_ahead: int = 0           # block: blocks a worker reads ahead; map: extra sample reads in flight
    access: str = "block"         # map | stream | block
    stream_read_size: int = 64 * 2**10   # stream: bytes of whole samples per piece (at least one sample)
    lag: int = 0                  # map/stream: batch k starts once batch k - lag was taken (Q x W)
    # stream, LoadConfig.lockstep: round_need[k // workers][i] = batches worker i has sent before batch k
    # may start (every batch of the earlier rounds); None: the workers run free of each other
    round_need: Any = None

    @classmethod
    def of_load(cls, st: Any, synthetic: bool, wid: int = 0, workers: int = 1, lag: int = 0,
                need: np.ndarray | None = None) -> "WorkerJob":
        """What producer ``wid`` of ``workers`` makes in the load set up as ``st`` (a ``core._Setup``;
        ``workers=1``: the consumer itself, W=0)."""
        cfg, schedule = st.cfg, st.schedule
        return cls(wid=wid, workers=workers, manifest=st.manifest, plans=list(schedule.plans),
                   total_batches=schedule.total, decode=cfg.decode, synthetic=synthetic, read_ahead=cfg.read_ahead,
                   access=schedule.access, stream_read_size=parse_size(cfg.stream_read_size, "load.stream_read_size"),
                   lag=lag, round_need=need)


def _decode_jpeg(data) -> np.ndarray:
    from PIL import Image  # present: LoadConfig checks for Pillow before workers start

    with Image.open(io.BytesIO(bytes(data))) as im:
        return np.asarray(im.convert("RGB"))


@dataclass
class _BlockData:
    """The block's samples, either one (samples, ...) array (fast path) or a list of Samples."""

    array: np.ndarray | None
    samples: list | None
    ids: np.ndarray
    read_s: float = 0.0
    parse_s: float = 0.0


def _read_block(job: WorkerJob, source: ShardSource, reader, block, fixed=None) -> _BlockData:
    shards = [job.manifest.shards[s] for s in block.shards]
    ids = np.concatenate([np.arange(sh.first_sample, sh.first_sample + sh.samples) for sh in shards])
    if job.synthetic:
        return _BlockData(None, None, ids)
    t0 = now_ns()
    if fixed is not None:
        # fixed-size token rows: the shards' records read straight into one block array (no
        # concatenate), where the source can (None: whole shards, below)
        rows = source.read_block_records(shards, fixed[0], fixed[1], reader.check_records)
        if rows is not None:
            return _BlockData(rows.view(fixed[2]), None, ids, read_s=(now_ns() - t0) / 1e9)
    # (an object store fetches a block's shards together: concurrent ranged GETs)
    datas = list(zip(shards, source.read_shards(shards)))
    t1 = now_ns()
    bd = _parse_block(job, reader, block, datas, ids)
    bd.read_s, bd.parse_s = (t1 - t0) / 1e9, (now_ns() - t1) / 1e9
    return bd


def _parse_block(job: WorkerJob, reader, block, datas, ids) -> _BlockData:
    m = job.manifest
    if m.modality == "tokens":
        # A reader's tokens() may return None for a shard it cannot vectorise: per-sample path then.
        arrays = [reader.tokens(d, sh) for sh, d in datas]
        if all(a is not None and a.ndim == 2 and a.shape[1:] == arrays[0].shape[1:] and a.dtype == arrays[0].dtype
               for a in arrays):
            arr = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            if len(arr) == len(ids):
                return _BlockData(arr, None, ids)
    samples = [smp for sh, d in datas for smp in reader.iter_samples(d, sh)]
    if len(samples) != len(ids):
        raise IntegrityError(f"block of shards {[m.shards[s].path for s in block.shards]}: "
                             f"manifest says {len(ids)} samples, read {len(samples)}")
    return _BlockData(None, samples, ids)


def _collate(job: WorkerJob, bd: _BlockData, sel: np.ndarray, nominal: int) -> tuple[dict, Callable[[Any], None]]:
    """(metadata, writer) where writer(buf) copies the samples' payload into a slot buffer."""
    if job.synthetic:
        meta = {"layout": "ragged", "nbytes": nominal, "offsets": None}
        return meta, lambda buf: None
    assert bd.samples is not None   # rows in one array take the emitter's own fast path
    picked = [bd.samples[i] for i in sel]
    labels = None
    if any(s.label is not None for s in picked):
        labels = np.array([s.label if s.label is not None else -1 for s in picked], dtype=np.int64)
    datas = [s.data for s in picked]
    if job.decode and job.manifest.modality == "images":
        datas = [_decode_jpeg(d) for d in datas]
    arrays = all(isinstance(d, np.ndarray) for d in datas)
    if arrays and datas and all(d.shape == datas[0].shape and d.dtype == datas[0].dtype for d in datas):
        shape = (len(datas),) + datas[0].shape
        nbytes = int(np.prod(shape)) * datas[0].dtype.itemsize
        meta = {"layout": "array", "dtype": datas[0].dtype.str, "shape": shape, "nbytes": nbytes, "labels": labels}

        def write_stacked(buf) -> None:
            np.stack(datas, out=np.ndarray(shape, dtype=datas[0].dtype, buffer=buf))
        return meta, write_stacked
    views = [np.ascontiguousarray(d).data.cast("B") if isinstance(d, np.ndarray) else memoryview(d).cast("B")
             for d in datas]
    offsets = np.zeros(len(views) + 1, dtype=np.int64)
    np.cumsum([len(v) for v in views], out=offsets[1:])
    meta = {"layout": "ragged", "nbytes": int(offsets[-1]), "offsets": offsets, "labels": labels}
    if arrays:
        meta["shapes"] = [d.shape for d in datas]
        meta["dtype"] = datas[0].dtype.str if datas else None

    def write_ragged(buf) -> None:
        for v, a in zip(views, offsets[:-1]):
            buf[int(a):int(a) + len(v)] = v
    return meta, write_ragged


# A batch is held back (to share a message with the next ones) only while the consumer has at
# least this many batches in hand (its step's and one more): holding a batch the consumer is about
# to wait for left it idle while the worker filled every slot, then the worker idle until the
# consumer caught up (W=1, compute 0, memory://: 0.8 -> 1.1M samples/s; 1.38-1.61x in 3 pairs).
_HOLD_WHILE_QUEUED = 2


class _Emitter:
    """Collates one batch into its slot and sends the consumer its metadata (all patterns)."""

    def __init__(self, job: WorkerJob, pool, conn, stop, stats: dict) -> None:
        self.job, self.pool, self.conn, self.stop, self.stats = job, pool, conn, stop, stats
        self.per_sample = max(1, job.manifest.total_bytes // max(1, job.manifest.total_samples))
        self.start_ns: int | None = None
        self._claimed: tuple[int, bool] | None = None   # map: (slot, the batch fits it) from claim()
        self._views: dict = {}       # (slot, shape, dtype) -> the slot as that array (_slot_view)
        self._row_cache: dict = {}
        pool.before_wait = conn.flush   # held batches (receiver.Sender) go out before the worker sleeps

    def gate(self, k: int) -> None:
        """map/stream: start batch ``k`` only once its index would have reached the worker —
        DataLoader keeps ``prefetch_factor × W`` indices out and sends the next one each time
        the training loop takes a batch (so nothing is read further ahead than that)."""
        if self.stop.is_set():
            raise _Stopped
        lag = self.job.lag
        t0 = now_ns()
        if lag and k >= lag and not self.pool.wait_taken(k - lag + 1, self.stop, self.job.wid):
            raise _Stopped
        need = self.job.round_need
        if need is not None and k >= self.job.workers and \
                not self.pool.wait_sent(need[k // self.job.workers], self.stop, self.job.wid):
            raise _Stopped
        self.start_ns = now_ns()   # the batch's work starts now (its index "arrived")
        self.stats["gate_wait_s"] = self.stats.get("gate_wait_s", 0.0) + (self.start_ns - t0) / 1e9

    def __call__(self, k: int, epoch: int, bd: "_BlockData", sel: np.ndarray, io_s: float, prep_s: float,
                 fill_s: float = 0.0, requests: int = 0, more: bool = False, ids: np.ndarray | None = None) -> None:
        """Batch ``k`` into its slot, then to the consumer; ``more``: the worker goes straight on to the
        next batch (the rest of a block in memory), so this one may share its message (receiver.Sender).
        ``ids``: the batch's sample ids where the caller has them at hand (``bd.ids[sel]`` otherwise)."""
        job, pool = self.job, self.pool
        tp = now_ns()
        arr = None if job.synthetic else bd.array
        if arr is not None:
            # the fast path (fixed-size rows, e.g. raw tokens): one gather straight into the slot
            shape = (len(sel),) + arr.shape[1:]
            meta = {"layout": "array", "dtype": arr.dtype.str, "shape": shape, "nbytes": len(sel) * self._row_bytes(arr)}
        else:
            meta, write = _collate(job, bd, sel, self.per_sample * len(sel))
        tw = now_ns()
        slot = self._slot(k)
        tw2 = now_ns()
        if meta["nbytes"] <= pool.slot_bytes:
            if arr is not None:
                # mode="clip": with the default "raise", take() gathers into a temporary and copies
                # that into ``out`` (2-3x the time).  The block's order was bounds-checked once.
                arr.take(sel, axis=0, out=self._slot_view(slot, shape, arr.dtype), mode="clip")
            else:
                write(pool.buf(slot))
            meta["inline"] = None
        elif arr is not None:   # larger than a slot: falls back to pickling, and the results say so
            meta["inline"] = arr.take(sel, axis=0, mode="clip").tobytes()
        else:
            tmp = bytearray(meta["nbytes"])
            write(memoryview(tmp))
            meta["inline"] = bytes(tmp)
        te = now_ns()
        self._send(k, epoch, meta, slot, bd.ids[sel] if ids is None else ids, io_s,
                   prep_s + ((tw - tp) + (te - tw2)) / 1e9, fill_s, requests, (tw2 - tw) / 1e9, te,
                   hold=more and pool.queued() >= _HOLD_WHILE_QUEUED)

    def _slot(self, k: int) -> int:
        """Batch ``k``'s slot, once free (``_Stopped`` when the run stops meanwhile)."""
        slot = self.pool.acquire(k, self.stop, self.job.wid)
        if slot is None:
            raise _Stopped
        return slot

    def _row_bytes(self, arr: np.ndarray) -> int:
        # math.prod per batch costs ~1 us; a block's rows all have one shape
        key = (arr.shape[1:], arr.dtype.itemsize)
        rb = self._row_cache.get(key)
        if rb is None:
            rb = self._row_cache[key] = math.prod(arr.shape[1:]) * arr.dtype.itemsize
        return rb

    def _slot_view(self, slot: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """Slot ``slot`` as an array of ``shape`` (made once per slot, shape and dtype: building an
        ndarray over a buffer costs ~3 us, a batch's whole metadata message about as much)."""
        key = (slot, shape, dtype)
        v = self._views.get(key)
        if v is None:
            if len(self._views) >= 64:   # a short last batch per block adds shapes; keep it bounded
                self._views.clear()
            v = self._views[key] = self.pool.u8(slot)[:math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
        return v

    def claim(self, k: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """map: batch ``k``'s slot, taken before its reads so that they land in it (no copy
        through a worker buffer), as an array of ``shape``; a private array where the batch
        is larger than a slot.  Right after ``gate(k)`` this never waits: map has W·Q + 1 slots
        and the gate lets batch k start only once batch k - W·Q was taken, i.e. once batch
        k - W·Q - 1, the slot's previous user, was released."""
        t0 = now_ns()
        slot = self._slot(k)
        self.stats["slot_wait_s"] += (now_ns() - t0) / 1e9
        fits = math.prod(shape) * dtype.itemsize <= self.pool.slot_bytes
        self._claimed = (slot, fits)
        # larger than a slot: a private array, pickled, and the results say so
        return self._slot_view(slot, shape, dtype) if fits else np.empty(shape, dtype=dtype)

    def written(self, k: int, epoch: int, data: np.ndarray, ids: np.ndarray, io_s: float, prep_s: float,
                requests: int) -> None:
        """map: batch ``k`` was read straight into the array ``claim(k)`` gave; send it."""
        assert self._claimed is not None   # claim(k) came first
        (slot, in_slot), self._claimed = self._claimed, None
        meta = {"layout": "array", "dtype": data.dtype.str, "shape": data.shape, "nbytes": data.nbytes,
                "inline": None if in_slot else data.tobytes()}
        self._send(k, epoch, meta, slot, ids, io_s, prep_s, 0.0, requests, 0.0, now_ns())

    def _count(self, n: int, nbytes: int, io_s: float, prep_s: float, fill_s: float, slot_wait_s: float) -> None:
        """A batch made: the producer's counters (its ``Done`` message, or W=0's ``per_worker`` entry)."""
        stats = self.stats
        stats["busy_s"] += prep_s + io_s + fill_s
        stats["slot_wait_s"] += slot_wait_s
        stats["batches"] += 1
        stats["samples"] += n
        stats["payload_bytes"] += nbytes

    def _send(self, k: int, epoch: int, meta: dict, slot: int, ids: np.ndarray, io_s: float, prep_s: float,
              fill_s: float, requests: int, slot_wait_s: float, ready_ns: int, hold: bool = False) -> None:
        bs = len(ids)
        self._count(bs, meta["nbytes"], io_s, prep_s, fill_s, slot_wait_s)
        if "labels" in meta or "offsets" in meta:
            _pack(meta)
        meta.update(worker_batch=self.stats["batches"] - 1, k=k, slot=slot, epoch=epoch, n=bs,
                    indices=ids.astype(_I8, copy=False).tobytes(), worker=self.job.wid, io_s=io_s, prep_s=prep_s,
                    fill_s=fill_s, requests=requests, ready_ns=ready_ns, start_ns=self.start_ns)
        self.start_ns = None
        self.conn.batch(meta, hold)   # counts it in pool.sent once written
        if self.job.round_need is not None:
            self.pool.notify_others(self.job.wid)   # a worker in lock step may wait for this one


def run_worker(job: WorkerJob, source: ShardSource, pool, conn, stop) -> None:
    """Process entry point; always ends with a ``Done`` or a ``Failed`` message (loader.messages)."""
    die_with_parent()   # a killed `load` takes its workers with it (they would block on slots for ever)
    stats = new_stats(job.wid)
    # Objects inherited from the parent (e.g. its S3 sessions) must not be finalized here,
    # on another event loop; freezing keeps the collector away from them.
    gc.freeze()
    failed: Failed | None = None
    try:
        from ..formats import get_format

        if not job.synthetic:
            source.open(worker_id=job.wid)
        reader = get_format(job.manifest.format).reader(job.manifest)
        conn.send(Ready(job.wid))
        produce(job, source, reader, _Emitter(job, pool, conn, stop, stats))
    except BaseException as e:  # noqa: BLE001 — reported to the parent with the original error
        failed = Failed(job.wid, ExceptionWrapper.of(e))
    close_source(source, stats)
    conn.send(failed or Done(job.wid, stats))


def new_stats(wid: int) -> dict:
    """A producer's counters: its ``Done`` message, or the one ``per_worker`` entry of a W=0 load."""
    return {"wid": wid, "pid": os.getpid(), "batches": 0, "samples": 0, "busy_s": 0.0,
            "slot_wait_s": 0.0, "payload_bytes": 0, "fill_s": 0.0, "io_s": 0.0}


def close_source(source: ShardSource, stats: dict) -> None:
    """The source's counters into ``stats``, then the source closed: best effort, as neither may
    hide the run's own outcome (its error, or the message that reports it)."""
    try:
        stats["source"] = source.stats()
    except Exception:  # noqa: BLE001
        stats["source"] = {}
    try:
        source.close()
    except Exception:  # noqa: BLE001
        pass


def produce(job: WorkerJob, source: ShardSource, reader, emit: "_Emitter") -> None:
    """Make this worker's batches for its access pattern (in a worker process, or in the consumer
    itself for ``--workers 0``: iobench.loader.inprocess)."""
    try:
        {"map": _produce_map, "stream": _produce_stream}.get(order_of(job.access), _produce_block)(
            job, source, reader, emit)
    except _Stopped:
        pass
    source.finish()   # before close: it may read (--verify-checksums: shards a stream left part-read)


def _produce_block(job: WorkerJob, source, reader, emit: _Emitter) -> None:
    """``block``: whole blocks read, then cut into batches; the reads land on the block's first batch."""
    mine = []
    k_base = 0
    for plan in job.plans:
        for block in plan.blocks:
            if block.index % job.workers == job.wid and k_base < job.total_batches:
                mine.append((plan.epoch, block, k_base))
            k_base += len(block.batch_sizes)

    fixed = reader.fixed_layout() if job.manifest.modality == "tokens" else None

    def read(item):
        return _read_block(job, source, reader, item[1], fixed)

    # Read ahead: the next block's I/O (which releases the GIL) overlaps this block's collation.
    # A source whose reads may overlap (object stores: GETs from one shared pool) reads every
    # block ahead at once, so its GETs stay in flight across block boundaries.
    threads = job.read_ahead + 1 if source.concurrent_reads else 1
    ahead = ThreadPoolExecutor(threads, thread_name_prefix="iobench-readahead") if job.read_ahead else None
    pending: list = []
    try:
        for idx, (epoch, block, k_base) in enumerate(mine):
            if emit.stop.is_set():
                raise _Stopped
            if ahead is None:
                bd = read(mine[idx])
            else:
                while len(pending) <= job.read_ahead and idx + len(pending) < len(mine):
                    pending.append(ahead.submit(read, mine[idx + len(pending)]))
                bd = pending.pop(0).result()
            if bd.array is not None and len(block.order) and not (
                    int(block.order.min()) >= 0 and int(block.order.max()) < len(bd.array)):
                raise IntegrityError(f"block {block.index}: sample order out of range of its {len(bd.array)} samples")
            emit.stats["io_s"] += bd.read_s
            # the block's sample ids in delivery order, once per block (not a gather and a cast per batch)
            ids = np.ascontiguousarray(bd.ids[block.order], dtype=_I8)
            last = len(block.batch_sizes) - 1
            pos = 0
            for j, bs in enumerate(block.batch_sizes):
                k = k_base + j
                if k >= job.total_batches:
                    break
                end = pos + bs
                first = j == 0   # the block's reads and parse land on its first batch
                emit(k, epoch, bd, block.order[pos:end], bd.read_s if first else 0.0, bd.parse_s if first else 0.0, 0.0,
                     len(block.shards) if first else 0, j < last and k + 1 < job.total_batches, ids[pos:end])
                pos = end
            # the block's buffer is free again before the next block is read (read without read-ahead,
            # the same buffer then takes every block: NOTE [ Block buffers ] in docs/design.md)
            del bd
    finally:
        if ahead is not None:
            ahead.shutdown(wait=True, cancel_futures=True)


def _shard_starts(manifest) -> np.ndarray:
    starts = np.array([s.first_sample for s in manifest.shards], dtype=np.int64)
    if len(starts) > 1 and not (np.diff(starts) > 0).all():
        raise IntegrityError("manifest: shards' first_sample values are not increasing")
    return starts


_SHARD_CACHE_BYTES = 256 * 2**20
_U8 = np.dtype(np.uint8)
_I8 = np.dtype("<i8")   # sample ids on the wire


class _Ranges:
    """Per-sample requests: ``source.read_range`` where each is one request
    (``supports_range_reads``); else (e.g. a tiers source) whole shards, kept in a per-worker
    LRU of up to 256 MiB and sliced."""

    def __init__(self, source: ShardSource, reader) -> None:
        from collections import OrderedDict

        self.source, self.reader = source, reader
        self.ranged = source.supports_range_reads
        self._cache: OrderedDict = OrderedDict()
        self._cached = 0

    def read(self, shard, i: int) -> tuple[Any, float, int]:
        """(record, storage seconds, requests) for sample ``i`` of ``shard``."""
        r = self.reader.sample_range(shard, i)
        if r is None:
            raise ConfigError("load.access", f"{shard.path}: sample {i} has no byte range for the map pattern",
                              "use --access stream (or block) for this dataset")
        return self.read_at(shard, r[0], r[1])

    def read_at(self, shard, start: int, length: int) -> tuple[Any, float, int]:
        t0 = now_ns()
        if self.ranged:
            rec = self.source.read_range(shard, start, length)
            n = 1
        else:
            n = 0
            data = self._cache.pop(shard.path, None)
            if data is None:
                data = self.source.read_shard(shard)
                n = 1
                self._cached += len(data)
                while self._cache and self._cached > _SHARD_CACHE_BYTES:
                    self._cached -= len(self._cache.popitem(last=False)[1])
            self._cache[shard.path] = data
            rec = memoryview(data)[start:start + length]
        return rec, (now_ns() - t0) / 1e9, n


def _map_batches(job: WorkerJob) -> Iterator[tuple[int, int, np.ndarray]]:
    """(k, epoch, sample ids) of this worker's map batches: batch ``j`` of an epoch is worker ``j % W``'s."""
    k_base = 0
    for plan in job.plans:
        off = 0
        for j, bs in enumerate(plan.batch_sizes):
            k = k_base + j
            if k >= job.total_batches:
                return
            if j % job.workers == job.wid:
                yield k, plan.epoch, plan.ids[off:off + bs]
            off += bs
        k_base += plan.batches


def _produce_map(job: WorkerJob, source, reader, emit: _Emitter) -> None:
    """``map``: this worker's batches (``j % W``), each sample one ranged request."""
    m = job.manifest
    starts = _shard_starts(m)
    ranges = _Ranges(source, reader)
    fixed = reader.fixed_layout()
    rows_reader = source.read_records if source.supports_record_reads else None
    inflight = job.read_ahead + 1   # the batch's sample reads a worker keeps in flight (1: one after another)
    if fixed is not None:   # records per shard, for the batch-wide bounds check
        nrec = np.array([(sh.bytes - fixed[0]) // fixed[1] for sh in m.shards], dtype=np.int64)
    for k, epoch, ids in _map_batches(job):
        emit.gate(k)
        bs = len(ids)
        if job.synthetic:
            emit(k, epoch, _BlockData(None, None, ids), np.arange(bs), 0.0, 0.0)
            continue
        io_s, requests = 0.0, 0
        if fixed is not None:
            # fixed-size token rows, one request per sample, each read straight into its row of
            # the batch's slot (rows cut arithmetically: no parse, no second copy)
            out = emit.claim(k, (bs, fixed[1]), _U8)
            t0 = now_ns()
            shard_of = np.searchsorted(starts, ids, side="right") - 1
            local = ids - starts[shard_of]
            if rows_reader is not None:
                # The source reads the whole batch (grouped by shard) in one call.
                if bs and not (local < nrec[shard_of]).all():
                    bad = int(np.flatnonzero(local >= nrec[shard_of])[0])
                    raise IntegrityError(f"{m.shards[int(shard_of[bad])].path}: record {int(local[bad])} "
                                         f"lies past the shard's {m.shards[int(shard_of[bad])].bytes} bytes")
                t1 = now_ns()
                requests = rows_reader(m.shards, shard_of, local, fixed[0], fixed[1], out, inflight)
                io_s = (now_ns() - t1) / 1e9
            else:
                for i, (x, s) in enumerate(zip(local.tolist(), shard_of.tolist())):
                    rec, t, n = ranges.read_at(m.shards[s], fixed[0] + x * fixed[1], fixed[1])
                    out[i] = np.frombuffer(rec, dtype=np.uint8)
                    io_s += t
                    requests += n
            emit.stats["io_s"] += io_s
            emit.written(k, epoch, out.view(fixed[2]), ids, io_s, (now_ns() - t0) / 1e9 - io_s, requests=requests)
        else:
            prep_s = 0.0
            samples = []
            shard_of = np.searchsorted(starts, ids, side="right") - 1
            for sid, s in zip(ids.tolist(), shard_of.tolist()):
                sh = m.shards[s]
                i = sid - sh.first_sample
                rec, t, n = ranges.read(sh, i)
                io_s += t
                requests += n
                t1 = now_ns()
                samples.append(reader.sample_from_range(sh, i, rec))
                prep_s += (now_ns() - t1) / 1e9
            emit.stats["io_s"] += io_s
            emit(k, epoch, _BlockData(None, samples, ids), np.arange(bs), io_s, prep_s, requests=requests)


class _ShardStream:
    """A worker's shards as one sequential stream of pieces (whole samples), read on demand:
    ``next_piece()``."""

    def __init__(self, job: WorkerJob, source, reader, shards: tuple[int, ...]) -> None:
        self.job, self.source, self.reader = job, source, reader
        self.shards = list(shards)
        self.pieces: Iterator = iter(())
        self.fixed = reader.fixed_layout()
        # Pieces that come as (rows, cols) arrays: fixed-size records, or a reader that decodes a piece
        # (a Parquet row group) into rows of one length; they take the row store, not per-sample objects.
        self.arrays = self.fixed is not None or reader.stream_arrays()

    def _open(self, shard) -> Iterator:
        """The shard's pieces, as its format cuts them (``Reader.pieces``), each read timed."""
        return iter(self.reader.pieces(shard, lambda a, n, f: self.read(shard, a, n, f), self.job.stream_read_size,
                                       arrays=self.arrays, read_into=lambda a, out, f: self.read_into(shard, a, out, f)))

    def next_piece(self) -> tuple[Any, float, int, float]:
        """The next whole piece — a list of samples, or (``arrays``) a (rows, cols) array — with its
        read's cost: (piece, storage seconds, requests, parse seconds)."""
        while True:
            piece = next(self.pieces, None)
            if piece is not None:
                return piece
            if not self.shards:
                raise IndexError("stream ran out of samples")
            self.pieces = self._open(self.job.manifest.shards[self.shards.pop(0)])

    # -- reading -------------------------------------------------------------------------

    def read(self, shard, start: int, length: int, first: bool) -> tuple[Any, float, int]:
        t0 = now_ns()
        data = self.source.read_piece(shard, start, length, first)
        return data, (now_ns() - t0) / 1e9, 1 if first else 0

    def read_into(self, shard, start: int, out, first: bool) -> tuple[float, int]:
        """``read`` into ``out`` (a byte buffer of the piece's length); (seconds, requests)."""
        t0 = now_ns()
        self.source.read_piece_into(shard, start, out, first)
        return (now_ns() - t0) / 1e9, 1 if first else 0


class _Charge:
    """One stream batch's worker time: storage (``io_s``), shuffle-buffer fill (``fill_s``, kept out of the
    batch's I/O), parsing (``prep_s``) and requests."""

    __slots__ = ("io_s", "fill_s", "prep_s", "requests")

    def __init__(self) -> None:
        self.io_s = self.fill_s = self.prep_s = 0.0
        self.requests = 0

    def add(self, t: float, n: int, parse: float, filling: bool) -> None:
        if filling:
            self.fill_s += t
        else:
            self.io_s += t
        self.prep_s += parse
        self.requests += n


def _produce_stream(job: WorkerJob, source, reader, emit: _Emitter) -> None:
    """``stream``: shards in order through this worker's shuffle buffer; a batch per ``B`` samples out."""
    m = job.manifest
    firsts = _shard_starts(m)
    k_base = 0
    for plan in job.plans:
        wp = plan.workers[job.wid]
        ks = {int(r): k_base + idx for idx, (w, r) in enumerate(plan.sequence.tolist()) if w == job.wid}
        ids_all = np.concatenate([np.arange(firsts[s], firsts[s] + m.shards[s].samples) for s in wp.shards]) \
            if wp.shards else np.zeros(0, dtype=np.int64)
        stream = _ShardStream(job, source, reader, wp.shards)
        held: dict[int, object] = {}
        ingested = out = 0
        # the row store (stream.arrays), made at the first piece: rows, free rows, store row of each sample, ids
        store: Any = None
        free: Any = None
        slot_of: Any = None
        at: Any = None
        top = 0
        for r, bs in enumerate(wp.batch_sizes):
            k = ks[r]
            if k >= job.total_batches:
                return
            emit.gate(k)
            picks = wp.order[out:out + bs]
            sel = np.arange(bs)
            if job.synthetic:
                out += bs
                emit(k, plan.epoch, _BlockData(None, None, ids_all[picks]), sel, 0.0, 0.0)
                continue
            need = wp.need(out + bs - 1)
            ch = _Charge()
            if stream.arrays:
                # rows (fixed-size records, decoded row groups): pieces land in a row store (the buffer's
                # slots), a batch is one gather from it straight into the batch's slot (``at``: the sample
                # index each store row holds, so the emitter takes rows and ids by store row)
                while ingested < need:
                    arr, t, n, parse = stream.next_piece()
                    kk = len(arr)
                    if store is None:
                        per = max(1, job.stream_read_size // stream.fixed[1]) if stream.fixed is not None else 1
                        cap = max(wp.fill, 1) + max(wp.batch_sizes) + max(per, kk) + 1
                        store = np.empty((cap, arr.shape[1]), dtype=arr.dtype)
                        free, top = np.arange(cap, dtype=np.int64), cap
                        slot_of = np.empty(wp.n, dtype=np.int64)
                        at = np.empty(cap, dtype=ids_all.dtype)
                    elif top < kk:   # a piece larger than the first (row groups differ in size): grow the store
                        grow = kk - top
                        free = np.concatenate([free[:top], np.arange(len(store), len(store) + grow),
                                               np.empty(len(store) - top, dtype=np.int64)])
                        store = np.concatenate([store, np.empty((grow,) + store.shape[1:], dtype=store.dtype)])
                        at = np.concatenate([at, np.empty(grow, dtype=at.dtype)])
                        top += grow
                    ch.add(t, n, parse, filling=wp.fill > 1 and ingested < wp.fill)
                    slots = free[top - kk:top]
                    top -= kk
                    store[slots] = arr
                    slot_of[ingested:ingested + kk] = slots
                    at[slots] = ids_all[ingested:ingested + kk]
                    ingested += kk
                t1 = now_ns()
                sel = slot_of[picks]
                # the rows go back to the free list now, but are only overwritten by later pieces: the
                # emitter gathers them below, before this loop reads again
                free[top:top + bs] = sel
                top += bs
                ch.prep_s += (now_ns() - t1) / 1e9
                body = _BlockData(store, None, at)
            else:
                while ingested < need:
                    # a whole piece into the buffer: its cost on its first sample (the rest were read with it)
                    samples, t, n, parse = stream.next_piece()
                    ch.add(t, n, parse, filling=wp.fill > 1 and ingested < wp.fill)
                    for smp in samples:
                        held[ingested] = smp
                        ingested += 1
                body = _BlockData(None, [held.pop(int(p)) for p in picks], ids_all[picks])
            out += bs
            emit.stats["io_s"] += ch.io_s
            emit.stats["fill_s"] += ch.fill_s
            emit(k, plan.epoch, body, sel, ch.io_s, ch.prep_s, fill_s=ch.fill_s, requests=ch.requests)
        k_base += plan.batches


class _Stopped(Exception):
    pass


def _pack(meta: dict) -> None:
    # Arrays travel as raw bytes: pickling an ndarray costs ~10x more, on every batch.
    for key in ("labels", "offsets"):
        if meta.get(key) is not None:
            meta[key] = np.ascontiguousarray(meta[key], dtype="<i8").tobytes()
