"""Declared and verified page-cache state of a local file (measurement rule 3).

``drop`` writes back and evicts the file's pages (``posix_fadvise DONTNEED``);
``residency`` measures the fraction of its pages in memory with ``mincore``;
``warm`` reads it once.  Residency is what the results report, whatever was declared.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

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
        _libc = lib
    return _libc


def drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)  # dirty pages cannot be evicted
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def residency(path: str) -> float | None:
    """Fraction 0-1 of the file's pages resident in the page cache; None where mincore fails."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    lib = _lib()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if lib.mincore(addr, size, vec) != 0:
                return None
            return sum(v & 1 for v in vec) / pages
        finally:
            lib.munmap(addr, size)
    finally:
        os.close(fd)


def warm(path: str, chunk: int = 8 << 20) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(chunk):
            pass


def set_state(path: str, state: str) -> float | None:
    """Bring the file to ``state`` ('cold' or 'warm'); returns the measured residency."""
    if state == "cold":
        drop(path)
    elif state == "warm":
        warm(path)
    return residency(path)


def odirect_supported(directory: str) -> tuple[bool, str]:
    """Whether the filesystem under ``directory`` accepts O_DIRECT, with the reason when not."""
    if not hasattr(os, "O_DIRECT"):
        return False, "this OS has no O_DIRECT"
    probe = os.path.join(directory, f".odirect-check-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
    except OSError as e:
        return False, f"open(O_DIRECT) failed: {os.strerror(e.errno)} (tmpfs and some FUSE filesystems reject it)"
    try:
        buf = mmap.mmap(-1, mmap.PAGESIZE)
        try:
            os.pwritev(fd, [buf], 0)
        except OSError as e:
            return False, f"O_DIRECT write failed: {os.strerror(e.errno)}"
        finally:
            buf.close()
        return True, ""
    finally:
        os.close(fd)
        os.unlink(probe)
