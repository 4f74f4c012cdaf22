"""A loader worker process: read its blocks' shards, parse, shuffle, collate into slots.

Worker ``w`` of ``W`` takes blocks ``b`` with ``b % W == w``.  Per batch it reports
``io_s``, the time it spent making that batch ready — the "batch I/O time" of the
prefetch model: the block's read + parse for the block's first batch (the others were
read with it), plus the batch's own prep (gather, decode, copy into the slot).  A block's
read is latency every batch behind it waits for, so it is not spread over them.  Waiting
for a free slot is back-pressure, not I/O, and is reported apart.
"""

from __future__ import annotations

import inspect
import io
import math
import os
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..metrics import now_ns
from .sampler import EpochPlan


@dataclass
class WorkerJob:
    wid: int
    workers: int
    manifest: object
    plans: list[EpochPlan]
    total_batches: int
    decode: bool
    synthetic: bool = False       # no I/O: batches of the right size from memory (stall analysis)
    read_ahead: int = 0           # blocks a worker reads ahead of the one it is collating


def open_source(source, wid: int) -> None:
    params = inspect.signature(source.open).parameters
    if "worker_id" in params:
        source.open(worker_id=wid)
    else:
        source.open()


def _decode_jpeg(data) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(bytes(data))) as im:
        return np.asarray(im.convert("RGB"))


class _BlockData:
    """The block's samples, either one (samples, ...) array (fast path) or a list of Samples."""

    def __init__(self, array: np.ndarray | None, samples: list | None, ids: np.ndarray) -> None:
        self.array, self.samples, self.ids = array, samples, ids


def _read_block(job: WorkerJob, source, reader, block) -> _BlockData:
    m = job.manifest
    ids = np.concatenate([np.arange(m.shards[s].first_sample, m.shards[s].first_sample + m.shards[s].samples)
                          for s in block.shards])
    if job.synthetic:
        return _BlockData(None, None, ids)
    shards = [m.shards[s] for s in block.shards]
    # A source that can fetch a block's shards together (concurrent ranged GETs) does so.
    read_many = getattr(source, "read_shards", None)
    datas = list(zip(shards, read_many(shards) if read_many else [source.read_shard(sh) for sh in shards]))
    if m.modality == "tokens" and hasattr(reader, "tokens"):
        # A reader's tokens() may return None for a shard it cannot vectorise: per-sample path then.
        arrays = [reader.tokens(d, sh) for sh, d in datas]
        if all(a is not None and a.ndim == 2 and a.shape[1:] == arrays[0].shape[1:] and a.dtype == arrays[0].dtype
               for a in arrays):
            arr = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            if len(arr) == len(ids):
                return _BlockData(arr, None, ids)
    samples = [smp for sh, d in datas for smp in reader.iter_samples(d, sh)]
    if len(samples) != len(ids):
        from ..errors import IntegrityError

        raise IntegrityError(f"block of shards {[m.shards[s].path for s in block.shards]}: "
                             f"manifest says {len(ids)} samples, read {len(samples)}")
    return _BlockData(None, samples, ids)


def _collate(job: WorkerJob, bd: _BlockData, sel: np.ndarray, nominal: int) -> tuple[dict, object]:
    """(metadata, writer) where writer(buf) copies the payload into a slot buffer."""
    if job.synthetic:
        meta = {"layout": "ragged", "nbytes": nominal, "offsets": None}
        return meta, lambda buf: None
    if bd.array is not None:
        shape = (len(sel),) + bd.array.shape[1:]
        nbytes = math.prod(shape) * bd.array.dtype.itemsize  # np.prod costs ~10 us a call
        meta = {"layout": "array", "dtype": bd.array.dtype.str, "shape": shape, "nbytes": nbytes}

        def write(buf):
            out = np.ndarray(shape, dtype=bd.array.dtype, buffer=buf)
            # mode="clip": with the default "raise", take() gathers into a temporary and copies
            # that into ``out`` (2-3x the time).  The block's order was bounds-checked once.
            np.take(bd.array, sel, axis=0, out=out, mode="clip")
        return meta, write
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

        def write(buf):
            np.stack(datas, out=np.ndarray(shape, dtype=datas[0].dtype, buffer=buf))
        return meta, write
    views = [memoryview(np.ascontiguousarray(d)).cast("B") if isinstance(d, np.ndarray) else memoryview(d).cast("B")
             for d in datas]
    offsets = np.zeros(len(views) + 1, dtype=np.int64)
    np.cumsum([len(v) for v in views], out=offsets[1:])
    meta = {"layout": "ragged", "nbytes": int(offsets[-1]), "offsets": offsets, "labels": labels}
    if arrays:
        meta["shapes"] = [d.shape for d in datas]
        meta["dtype"] = datas[0].dtype.str if datas else None

    def write(buf):
        for v, a in zip(views, offsets[:-1]):
            buf[int(a):int(a) + len(v)] = v
    return meta, write


def run_worker(job: WorkerJob, source, pool, conn, stop) -> None:
    """Process entry point; always ends with a 'done' or an 'error' message."""
    ahead = None
    stats: dict = {"wid": job.wid, "pid": os.getpid(), "batches": 0, "samples": 0, "busy_s": 0.0,
                   "slot_wait_s": 0.0, "payload_bytes": 0}
    import gc

    # Objects inherited from the parent (e.g. its S3 sessions) must not be finalized here,
    # on another event loop; freezing keeps the collector away from them.
    gc.freeze()
    try:
        from ..formats import get_format

        if not job.synthetic:
            open_source(source, job.wid)
        reader = get_format(job.manifest.format).reader(job.manifest)
        conn.send(("ready", job.wid))
        per_sample = max(1, job.manifest.total_bytes // max(1, job.manifest.total_samples))
        mine = []
        k_base = 0
        for plan in job.plans:
            for block in plan.blocks:
                if block.index % job.workers == job.wid and k_base < job.total_batches:
                    mine.append((plan.epoch, block, k_base))
                k_base += len(block.batch_sizes)

        def read(item):
            t0 = now_ns()
            bd = _read_block(job, source, reader, item[1])
            return bd, (now_ns() - t0) / 1e9

        # Read ahead: the next block's I/O (which releases the GIL) overlaps this block's collation.
        ahead = ThreadPoolExecutor(1, thread_name_prefix="iobench-readahead") if job.read_ahead else None
        pending = []
        for idx, (epoch, block, k_base) in enumerate(mine):
            if stop.is_set():
                raise _Stopped
            if ahead is None:
                bd, block_s = read(mine[idx])
            else:
                while len(pending) <= job.read_ahead and idx + len(pending) < len(mine):
                    pending.append(ahead.submit(read, mine[idx + len(pending)]))
                bd, block_s = pending.pop(0).result()
            stats["busy_s"] += block_s
            if bd.array is not None and len(block.order) and not (
                    0 <= int(block.order.min()) and int(block.order.max()) < len(bd.array)):
                from ..errors import IntegrityError

                raise IntegrityError(f"block {block.index}: sample order out of range of its {len(bd.array)} samples")
            pos = 0
            for j, bs in enumerate(block.batch_sizes):
                k = k_base + j
                if k >= job.total_batches:
                    break
                sel = block.order[pos:pos + bs]
                pos += bs
                tp = now_ns()
                meta, write = _collate(job, bd, sel, per_sample * bs)
                tw = now_ns()
                slot = pool.acquire(k, stop, job.wid)
                if slot is None:
                    raise _Stopped
                tw2 = now_ns()
                if meta["nbytes"] <= pool.slot_bytes:
                    write(pool.buf(slot))
                    meta["inline"] = None
                else:  # larger than a slot: falls back to pickling, and the results say so
                    tmp = bytearray(meta["nbytes"])
                    write(memoryview(tmp))
                    meta["inline"] = bytes(tmp)
                te = now_ns()
                prep_s = ((tw - tp) + (te - tw2)) / 1e9
                stats["busy_s"] += prep_s
                stats["slot_wait_s"] += (tw2 - tw) / 1e9
                stats["batches"] += 1
                stats["samples"] += bs
                stats["payload_bytes"] += meta["nbytes"]
                _pack(meta)
                meta.update(worker_batch=stats["batches"] - 1, k=k, slot=slot, epoch=epoch, n=bs,
                            indices=bd.ids[sel].astype("<i8").tobytes(),
                            worker=job.wid, io_s=(block_s if j == 0 else 0.0) + prep_s, ready_ns=te)
                conn.send(("batch", meta))
                pool.sent[job.wid] += 1  # after the write: a consumer that sees it finds the message
    except _Stopped:
        pass
    except BaseException as e:  # noqa: BLE001 — reported to the parent with the original error
        stats["source"] = _source_stats(source)
        conn.send(("error", job.wid, _picklable(e), traceback.format_exc()))
        return
    finally:
        if ahead is not None:
            ahead.shutdown(wait=True, cancel_futures=True)
        try:
            source.close()
        except Exception:  # noqa: BLE001
            pass
    stats["source"] = _source_stats(source)
    conn.send(("done", job.wid, stats))


class _Stopped(Exception):
    pass


def _pack(meta: dict) -> None:
    # Arrays travel as raw bytes: pickling an ndarray costs ~10x more, on every batch.
    for key in ("labels", "offsets"):
        if meta.get(key) is not None:
            meta[key] = np.ascontiguousarray(meta[key], dtype="<i8").tobytes()


def _source_stats(source) -> dict:
    fn = getattr(source, "stats", None)
    try:
        return fn() if fn else {}
    except Exception:  # noqa: BLE001
        return {}


def _picklable(e: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")
