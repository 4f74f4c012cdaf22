"""The ``cpu`` path: a thread pool of preadv into page-aligned host memory, optionally O_DIRECT.

With ``odirect=True`` every storage call is aligned to ``alignment`` (offset, length and
buffer address).  Unaligned requests are read into a per-thread aligned scratch buffer
and copied out.  File systems that refuse O_DIRECT (EINVAL, e.g. older tmpfs) make the
reader fall back to the page cache, and ``describe()`` says so.
"""

from __future__ import annotations

import errno
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from iobench.io.inputs import pread_full

from .base import PAGE, GdsReader, aligned_host, chunks, host_view

DEFAULT_TASK_SIZE = 4 << 20


def _open_direct(path: str) -> int:
    return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))


def _pread_direct(fd: int, buf: memoryview, offset: int, alignment: int) -> int:
    """Aligned reads until ``buf`` is full; a short, unaligned count means end of file."""
    want = len(buf)
    got = 0
    while got < want:
        n = os.preadv(fd, [buf[got:]], offset + got)
        got += n
        if n == 0 or n % alignment:
            break
    return got


class CpuReader(GdsReader):
    name = "cpu"
    device_memory = False

    def __init__(self, path: str, *, threads: int = 4, task_size: int = DEFAULT_TASK_SIZE,
                 odirect: bool = False, alignment: int = PAGE) -> None:
        super().__init__(path)
        if threads < 1:
            raise ValueError("threads must be at least 1")
        if task_size < 1:
            raise ValueError("task_size must be at least 1")
        self.threads = threads
        self.alignment = alignment
        self.odirect_requested = odirect
        self.odirect_reason: str | None = None
        if odirect:
            # Whole aligned blocks per task, so that only a request's two ends need the scratch copy.
            task_size = max(alignment, task_size - task_size % alignment)
        self.task_size = task_size
        self._fd = os.open(self.path, os.O_RDONLY)
        self._direct_fd: int | None = None
        if odirect:
            self._direct_fd = self._try_direct()
        self._local = threading.local()
        self._last: tuple | None = None  # (dst, its uint8 view, memoryview): reused while dst is the same array
        # threads - 1 helpers: the calling thread reads one piece of every request itself.
        self._pool = ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="gds-cpu") if threads > 1 else None

    @property
    def odirect(self) -> bool:
        return self._direct_fd is not None

    def _try_direct(self) -> int | None:
        if not hasattr(os, "O_DIRECT"):
            self.odirect_reason = "this platform has no O_DIRECT; reading through the page cache"
            return None
        try:
            fd = _open_direct(self.path)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.odirect_reason = "the file system refused O_DIRECT at open (EINVAL); reading through the page cache"
            return None
        # Some file systems accept the flag at open and refuse the first read instead.
        probe = aligned_host(self.alignment)
        try:
            os.preadv(fd, [memoryview(probe)], 0)
        except OSError as e:
            os.close(fd)
            if e.errno != errno.EINVAL:
                raise
            self.odirect_reason = "the file system refused an O_DIRECT read (EINVAL); reading through the page cache"
            return None
        return fd

    def _scratch(self):
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = aligned_host(self.task_size + 2 * self.alignment)
        return buf

    def _read_piece(self, arr, pos: int, off: int, n: int) -> tuple[int, int]:
        if self._direct_fd is None:
            got = pread_full(self._fd, memoryview(arr[pos:pos + n]), off)
            return got, got
        a = self.alignment
        start = off - off % a
        end = -(-(off + n) // a) * a
        if start == off and end == off + n and (arr.ctypes.data + pos) % a == 0:
            got = _pread_direct(self._direct_fd, memoryview(arr[pos:pos + n]), off, a)
            return got, got
        scratch = self._scratch()
        got = _pread_direct(self._direct_fd, memoryview(scratch[:end - start]), start, a)
        useful = max(0, min(got - (off - start), n))
        if useful:
            arr[pos:pos + useful] = scratch[off - start:off - start + useful]
        return useful, got

    def read_into(self, dst: Any, offset: int, nbytes: int) -> int:
        if offset < 0 or nbytes < 0:
            raise ValueError("offset and nbytes must be non-negative")
        last = self._last
        if last is not None and last[0] is dst and last[1].nbytes >= nbytes:
            arr, mv = last[1], last[2]
        else:
            arr = host_view(dst, nbytes)
            mv = memoryview(arr)
            # Only numpy arrays are remembered: a remembered bytearray could no longer be resized.
            self._last = (dst, arr, mv) if isinstance(dst, np.ndarray) else None
        if nbytes <= self.task_size and self._direct_fd is None:
            # One piece through the page cache: the common small read, kept short (QD1 latency).
            got = pread_full(self._fd, mv[:nbytes], offset)
            self.bytes_read += got
            self.io_bytes += got
            self.calls += 1
            return got
        pieces = list(chunks(offset, nbytes, self.task_size))
        if self._pool is None or len(pieces) <= 1:
            results = [self._read_piece(arr, *p) for p in pieces]
        else:
            # The calling thread reads the first piece itself: one hand-off fewer per call.
            futures = [self._pool.submit(self._read_piece, arr, *p) for p in pieces[1:]]
            results = [self._read_piece(arr, *pieces[0])] + [f.result() for f in futures]
        delivered = 0
        for (_pos, _, n), (got, _) in zip(pieces, results):
            delivered += got
            if got < n:  # end of file: later pieces read nothing useful
                break
        self.bytes_read += delivered
        self.io_bytes += sum(io for _, io in results)
        self.calls += 1
        return delivered

    def describe(self) -> dict:
        d = super().describe()
        d.update({"threads": self.threads, "task_size": self.task_size, "odirect_requested": self.odirect_requested,
                  "odirect": self.odirect, "alignment": self.alignment})
        if self.odirect_reason:
            d["odirect_reason"] = self.odirect_reason
        return d

    def evidence(self) -> dict:
        return {"backend": "posix-odirect" if self.odirect else "posix", "bytes": self.io_bytes}

    def close(self) -> None:
        self._last = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for fd in (self._fd, self._direct_fd):
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = -1
        self._direct_fd = None
