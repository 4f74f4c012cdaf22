"""The built-in file I/O engine, for machines without fio.

Queue depth is produced by ``qd`` threads, each with one synchronous ``os.preadv`` /
``os.pwritev`` in flight (the GIL is released during the system call).  Buffers are
page-aligned (anonymous mmap), so the same code serves O_DIRECT.  Per-request latencies
are kept as raw integers during the run and turned into an HDR histogram afterwards, so
the timed loop does as little Python work as possible.  Its per-request overhead is what
``benchmarks/bench_probe_engines.py`` measures against fio on the same job.
"""

from __future__ import annotations

import mmap
import os
import threading
import time

import numpy as np

from ..metrics import LatencyHistogram
from .jobs import Job, JobResult

ENGINE = "python"
_BATCH = 8192


def describe(job: Job | None = None) -> str:
    return "python threads (os.preadv/os.pwritev, one request in flight per thread)"


def _histogram(latencies: list[list[int]]) -> LatencyHistogram:
    h = LatencyHistogram()
    arrays = [np.asarray(v, dtype=np.int64) for v in latencies if v]
    if arrays:
        values, counts = np.unique(np.concatenate(arrays), return_counts=True)
        raw = h._h
        for v, c in zip(values.tolist(), counts.tolist()):
            raw.record_value(max(1, v), c)
    return h


def run(job: Job) -> JobResult:
    flags = os.O_WRONLY if job.is_write else os.O_RDONLY
    if job.direct:
        flags |= os.O_DIRECT
    fd = os.open(job.path, flags)
    try:
        return _run(job, fd)
    finally:
        os.close(fd)


def _run(job: Job, fd: int) -> JobResult:
    bs = job.bs
    blocks = max(1, job.file_size // bs)
    regions = job.regions()
    barrier = threading.Barrier(job.qd + 1)
    starts = [0] * job.qd
    ends = [0] * job.qd
    moved = [0] * job.qd
    lat: list[list[int]] = [[] for _ in range(job.qd)]
    errors: list[BaseException] = []
    deadline = [0]
    now_ns = time.perf_counter_ns
    io = os.pwritev if job.is_write else os.preadv

    def worker(i: int) -> None:
        buf = mmap.mmap(-1, bs)
        try:
            if job.is_write:
                buf.write(np.random.default_rng(job.seed + i).bytes(bs))
            bufs = [buf]
            rng = np.random.default_rng(job.seed * 1000 + i)
            start, end = regions[i]
            off = start
            record = lat[i].append
            n_bytes = 0
            barrier.wait()
            t_end = deadline[0]
            starts[i] = now_ns()
            while True:
                if job.is_random:
                    offsets = (rng.integers(0, blocks, _BATCH, dtype=np.int64) * bs).tolist()
                else:
                    offsets = []
                    for _ in range(_BATCH):
                        offsets.append(off)
                        off += bs
                        if off >= end:
                            off = start
                for o in offsets:
                    t0 = now_ns()
                    n = io(fd, bufs, o)
                    t1 = now_ns()
                    record(t1 - t0)
                    n_bytes += n
                    if t1 >= t_end:
                        break
                else:
                    continue
                break
            ends[i] = now_ns()
            moved[i] = n_bytes
        except BaseException as e:  # re-raised in the caller with its own traceback
            errors.append(e)
            try:
                barrier.abort()
            except Exception:
                pass
        finally:
            buf.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(job.qd)]
    for t in threads:
        t.start()
    deadline[0] = now_ns() + int(job.runtime_s * 1e9)
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    t_last = max(ends)
    if job.is_write:
        os.fsync(fd)  # like fio's end_fsync=1: written means on the device
        t_last = now_ns()
    seconds = (t_last - min(starts)) / 1e9
    h = _histogram(lat)
    summary, cdf = h.summary(), [list(p) for p in h.cdf(50)]
    return JobResult(engine=ENGINE, engine_detail=describe(job), bytes=sum(moved), seconds=seconds,
                     ios=h.count, latency=h, latency_summary=summary, latency_cdf=cdf)
