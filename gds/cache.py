"""Page-cache state of one file: declared, set (fadvise DONTNEED / pre-read) and verified (mincore)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

_libc = None


def _c():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc = lib
    return _libc


def residency(path: str) -> float | None:
    """Fraction (0-1) of the file's pages in the page cache, from mincore(2); None if unknowable."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    try:
        libc = _c()
    except OSError:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return sum(b & 1 for b in vec) / pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: str, block: int = 8 << 20) -> None:
    buf = bytearray(block)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def prepare(path: str, state: str) -> dict:
    """Put ``path`` in cache ``state`` ('cold' | 'warm') and measure what that achieved."""
    if state == "cold":
        drop(path)
    elif state == "warm":
        warm(path)
    else:
        raise ValueError(f"unknown cache state {state!r}")
    r = residency(path)
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
