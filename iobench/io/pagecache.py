"""Declared and measured page-cache state of a dataset's shards (measurement rule 3, "declared and measured cache state", docs/design.md).

``cold`` writes back and evicts each shard's pages (``posix_fadvise DONTNEED``), ``warm``
reads each shard once, ``as-is`` leaves them; in every case the residency is then
measured with ``mincore`` and reported, because a declaration alone proves nothing
(another process, or a filesystem that ignores the advice, can keep pages resident).
Object stores and memory have no client page cache: their residency is reported as None
with the reason.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import sys
from typing import Iterable

from ..config import check_choice
from ..storage import Backend

STATES = ("cold", "warm", "as-is")
_libc = None


def _lib():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        lib.syscall.restype = ctypes.c_long
        _libc = lib
    return _libc


def _open_data(path: str) -> int:
    """A data file opened for a cache operation; a FIFO or device is refused, never waited on
    (the residency probe runs on every shard before a load)."""
    from .inputs import open_regular

    return open_regular(path, "shard", "replace it with the data file")


def drop_pages(path: str) -> None:
    fd = _open_data(path)
    try:
        os.fdatasync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


_SYNC_FILE_RANGE_WRITE = 2   # linux/fs.h: start writeback of the dirty pages in the range, do not wait


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing a just-written range back to the device now, without waiting
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, Linux).  A writer that calls this after each
    chunk keeps the disk busy while it copies the next one, instead of leaving all the
    writeback to the final fsync.  It makes nothing durable: the fsync still must follow.
    A no-op where the call does not exist."""
    lib = _lib()
    fn = getattr(lib, "sync_file_range", None)
    if fn is None:
        return
    if fn.argtypes is None:
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def resident_pages(path: str) -> tuple[int, int] | None:
    """(resident, total) pages of the file in the page cache; None where neither call is available."""
    fd = _open_data(path)
    try:
        return resident_pages_fd(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted",
                                                 "nr_recently_evicted")]


_NR_CACHESTAT = 451        # the same number on every Linux architecture (added in 6.5)
_cachestat_works: bool | None = None


def resident_pages_fd(fd: int, size: int) -> tuple[int, int] | None:
    """(resident, total) pages of bytes ``0:size`` of an open file.

    ``cachestat(2)`` where the kernel has it (Linux 6.5+): one call that walks the file's cache
    entries in order.  Else ``mincore`` over a mapping of the file, which looks each page up on
    its own (~0.5 ms per 8 MiB on a busy 2-core VM: a third of the loader's cost of mapping a
    cached shard, measured with perf).  None where neither works."""
    global _cachestat_works
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    if pages == 0:
        return 0, 0
    lib = _lib()
    if _cachestat_works is not False and sys.platform.startswith("linux"):
        rng, st = _CachestatRange(0, size), _Cachestat()
        if lib.syscall(_NR_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(st), 0) == 0:
            _cachestat_works = True
            return min(int(st.nr_cache), pages), pages
        if _cachestat_works is None and ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            _cachestat_works = False   # an older kernel (or a seccomp filter): mincore from now on
    addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        return None
    try:
        vec = (ctypes.c_ubyte * pages)()
        if lib.mincore(ctypes.c_void_p(addr), size, vec) != 0:
            return None
        import numpy as np

        # bit 0 of each byte: resident.  Counted in numpy: a Python loop over the vector cost
        # ~1.6 s per GiB of file, which a checkpoint restore paid on every file.
        return int(np.count_nonzero(np.frombuffer(memoryview(vec), dtype=np.uint8) & 1)), pages
    finally:
        lib.munmap(ctypes.c_void_p(addr), size)


def warm_file(path: str, chunk: int = 8 << 20) -> int:
    n = 0
    with os.fdopen(_open_data(path), "rb", buffering=0) as f:
        while True:
            b = f.read(chunk)
            if not b:
                return n
            n += len(b)


def file_residency(path: str) -> float | None:
    """Fraction 0-1 of one local file's pages in the page cache; None where mincore fails."""
    r = resident_pages(path)
    if r is None:
        return None
    return r[0] / r[1] if r[1] else 1.0


def set_file_state(path: str, state: str) -> float | None:
    """Bring one local file to ``state`` ('cold', 'warm' or 'as-is'); returns the measured residency."""
    if state == "cold":
        drop_pages(path)
    elif state == "warm":
        warm_file(path)
    return file_residency(path)


def odirect_supported(directory: str) -> tuple[bool, str]:
    """Whether the filesystem under ``directory`` accepts O_DIRECT, with the reason when not."""
    if not hasattr(os, "O_DIRECT"):
        return False, "this OS has no O_DIRECT"
    probe = os.path.join(directory, f".odirect-check-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
    except OSError as e:
        return False, f"open(O_DIRECT) failed: {e.strerror} (tmpfs and some FUSE filesystems reject it)"
    try:
        buf = mmap.mmap(-1, mmap.PAGESIZE)
        try:
            os.pwritev(fd, [buf], 0)
        except OSError as e:
            return False, f"O_DIRECT write failed: {e.strerror}"
        finally:
            buf.close()
        return True, ""
    finally:
        os.close(fd)
        os.unlink(probe)


def residency(backend: Backend, rels: Iterable[str]) -> float | None:
    """Fraction 0-1 of the files' pages in the page cache (local backends only)."""
    base = backend.base
    if not base.is_local:
        return None
    res = tot = 0
    for rel in rels:
        r = resident_pages(base.local_path(rel))
        if r is None:
            return None
        res, tot = res + r[0], tot + r[1]
    return res / tot if tot else 1.0


def set_cache_state(backend: Backend, rels: Iterable[str], state: str, field: str = "--cache") -> dict:
    """Bring the files to ``state`` and report what was declared and what was measured."""
    check_choice(field, state, STATES)
    rels = list(rels)
    base = backend.base
    out: dict = {"declared": state, "files": len(rels)}
    if not base.is_local:
        if state == "warm":
            for rel in rels:  # warms server-side caches; there is no client page cache to fill
                base.cat(rel)
        out.update(residency_found=None, measured_residency=None, method="none",
                   note=f"{base.protocol}:// has no client page cache; residency not measurable")
        return out
    # what the run found, before any action: a warm dataset dropped to cold says so
    out["residency_found"] = residency(base, rels)
    for rel in rels:
        p = base.local_path(rel)
        if state == "cold":
            drop_pages(p)
        elif state == "warm":
            warm_file(p)
    out.update(measured_residency=residency(base, rels),
               method={"cold": "posix_fadvise(DONTNEED)", "warm": "pre-read", "as-is": "none"}[state])
    return out


def prepare_file(path: str, state: str) -> dict:
    """Put ``path`` in cache ``state`` ('cold' | 'warm') and measure what that achieved."""
    if state not in ("cold", "warm"):
        raise ValueError(f"unknown cache state {state!r}")
    r = set_file_state(path, state)
    out: dict = {"declared": state, "resident_ratio": r}
    if r is None:
        out.update(verified=False, note="mincore unavailable: residency unknown")
    elif state == "cold":
        out["verified"] = r <= 0.05
        if not out["verified"]:
            out["note"] = (f"{r:.0%} of the file stayed in memory after DONTNEED "
                           "(tmpfs, or pages pinned elsewhere): these are not cold-cache numbers")
    else:
        out["verified"] = r >= 0.95
        if not out["verified"]:
            out["note"] = f"only {r:.0%} of the file is resident after pre-reading (memory pressure)"
    return out
