"""Verified copies between tiers: stream, checksum on arrival, publish atomically, retry.

A copy is written through ``Backend.open_output`` (temp name + rename locally, a completed
multipart upload on S3), so a reader never sees a partial copy.  The checksum is computed
while the bytes stream through; a mismatch aborts the write and fetches the shard again.
Source errors (connection refused, timeouts, vanished files) are retried with doubling
back-off, then raised as one ``StorageError`` naming the shard and both URLs.

How the bytes move: local→local with ``verify`` reads the source once into a reused 1 MiB
buffer, hashes it and writes it (one pass, like ``cp``; see ``_direct_copy`` for what the
checksum then proves); local→local without ``verify`` copies inside the kernel
(``copy_file_range``); everything else (S3, emulated tiers) hashes each chunk as it arrives
(one ranged GET per chunk on S3) and writes it — never a second read of the copy.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from typing import Callable, cast

from ..errors import IntegrityError
from ..metrics import now_ns
from ..storage import Backend, LocalBackend
from .checksum import matches, new_hasher
from .inputs import open_regular_file
from .retry import RetryPolicy, any_failure

CHUNK = 8 * 1024 * 1024
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF)


def iter_chunks(backend: Backend, rel: str, nbytes: int, chunk: int = CHUNK):
    """The bytes of ``rel`` in chunks, one request each (a local read or a ranged GET).

    Local chunks are views of one reused buffer (a fresh 8 MiB allocation per read costs
    more page faults than the copy itself): use each before asking for the next.
    """
    if backend.parallel_ranged_reads:   # one ranged GET per chunk, no open file to keep
        for start in range(0, max(nbytes, 1), chunk):
            data = backend.cat(rel, start, min(start + chunk, nbytes))
            if data:
                yield data
        return
    buf = bytearray(max(1, min(chunk, nbytes or chunk)))
    view = memoryview(buf)
    with backend.open(rel, "rb") as f:
        readinto = getattr(f, "readinto", None)
        while True:
            if readinto is None:
                data = f.read(chunk)
                if not data:
                    return
                yield data
                continue
            n = readinto(buf)
            if not n:
                return
            yield view[:n]


def _plain_local(b: Backend) -> bool:
    """A local backend with no wrapper around it (emulation must see every read)."""
    return isinstance(b, LocalBackend)   # wrappers are not LocalBackends


_tls = threading.local()

# The direct copy's buffer: small enough to stay in the CPU cache between the read that
# fills it, the hash and the write that drains it (8 MiB spills to DRAM: ~30 % slower here).
COPY_BUF = 1024 * 1024


def _buffer(size: int = CHUNK) -> bytearray:
    """One reused buffer per thread and size: fresh allocations cost a page fault per 4 KiB."""
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    b = bufs.get(size)
    if b is None:
        b = bufs[size] = bytearray(size)
    return b


def _write_all(fd: int, data: memoryview) -> None:
    """``write(2)`` until the kernel has accepted every byte (a short count is resumed, never dropped)."""
    done, n = 0, len(data)
    while done < n:
        got = os.write(fd, data[done:])
        if got <= 0:
            raise OSError(errno.EIO, f"write(2) accepted {got} of {n - done} bytes")
        done += got


def _direct_copy(src_path: str, f, h) -> int:
    """Copy a local file through one reused buffer, hashing the bytes as they pass.

    One read and one write per byte, as ``cp`` does, and no second pass over the copy.
    The hash covers exactly what was handed to ``write(2)``, and every write's return
    count is checked until the whole buffer is accepted, so the temp file holds those
    bytes: a flipped or truncated source fails the manifest checksum, and the copy is
    retried.  (Reading the new file back, as this did before, only re-read the page
    cache the write had just filled: it caught no media error that this misses.)
    """
    f.flush()
    out = f.fileno()
    buf = _buffer(COPY_BUF)
    view = memoryview(buf)
    n = 0
    with open_regular_file(src_path, "shard", "replace it with the shard file", buffering=0) as s:
        fd = s.fileno()
        while True:
            got = os.readv(fd, [buf])
            if got == 0:
                return n
            data = view[:got]
            h.update(data)
            _write_all(out, data)
            n += got


def _kernel_copy(src_path: str, f, nbytes: int) -> int:
    """Copy inside the kernel (copy_file_range, as cp does); for copies that are not verified."""
    f.flush()
    out = f.fileno()
    n = 0
    with open_regular_file(src_path, "shard", "replace it with the shard file", buffering=0) as s:
        while True:
            got = os.copy_file_range(s.fileno(), out, max(nbytes - n, CHUNK))
            if got == 0:
                break
            n += got
    return n


def stream_copy(fin, fout, *, chunk: int = CHUNK, on_chunk: Callable[[int, bool], None] | None = None) -> int:
    """Copy an open readable file into an open writable one, ``chunk`` bytes at a time; returns bytes.

    A short ``write`` is resumed until the chunk is accepted (raw unbuffered files may take
    less).  ``on_chunk(nbytes, first)`` runs after each chunk (rate limits, crash hooks).
    """
    n, first = 0, True
    while True:
        data = fin.read(chunk)
        if not data:
            return n
        mv = memoryview(data)
        while mv:
            got = fout.write(mv)
            mv = mv[got if got is not None else len(mv):]
        n += len(data)
        if on_chunk is not None:
            on_chunk(len(data), first)
        first = False


@dataclass(frozen=True)
class CopyResult:
    bytes: int
    seconds: float
    attempts: int
    refetches: int          # attempts repeated because the bytes failed their checksum


def _policy(retries: int, backoff_s: float) -> RetryPolicy:
    """Tier copies: ``retries`` tries, the back-off doubling from ``backoff_s``, no jitter or budget."""
    return RetryPolicy(attempts=retries, base_delay_s=backoff_s, max_delay_s=float("inf"),
                       budget_s=float("inf"), jitter=False)


def copy_verified(src: Backend, src_rel: str, dst: Backend, dst_rel: str, nbytes: int, checksum: str | None, *,
                  retries: int = 3, backoff_s: float = 0.2, verify: bool = True, fsync: bool = True,
                  chunk: int = CHUNK, on_retry=None, read_back: bool = False) -> CopyResult:
    """Copy one file; the destination appears only whole and verified.

    ``checksum`` is the source's manifest checksum; with None (a file no manifest names,
    e.g. a checkpoint being archived) the bytes are hashed with xxh64 as they pass and
    ``read_back`` re-reads the published copy and compares: the archive then proves it holds
    what was sent.
    """
    t0 = now_ns()
    if checksum is None:
        read_back = True

    direct = _plain_local(src) and _plain_local(dst)
    use_kernel = [direct and not verify and hasattr(os, "copy_file_range")]

    def attempt() -> int:
        n = _attempt()
        if read_back:
            _check_read_back(dst, dst_rel, n, sent[0], checksum or "xxh64")
        return n

    sent: list = [None]

    def _attempt() -> int:
        h = new_hasher(checksum or "xxh64") if (verify or read_back) else None
        sent[0] = h
        n = 0
        if direct and h is not None:
            with dst.open_output(dst_rel, fsync=fsync) as f:
                n = _direct_copy(src.path(src_rel), f, h)
                _check(src, src_rel, n, nbytes, h, checksum)  # raising here discards the temp copy
            return n
        if use_kernel[0]:
            try:
                with dst.open_output(dst_rel, fsync=fsync) as f:
                    n = _kernel_copy(src.path(src_rel), f, nbytes)
                    _check(src, src_rel, n, nbytes, None, checksum)
                return n
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                use_kernel[0] = False  # e.g. EXDEV across file systems on kernels before 5.3
        with dst.open_output(dst_rel, fsync=fsync) as f:
            for data in iter_chunks(src, src_rel, nbytes, chunk):
                f.write(data)
                if h is not None:
                    h.update(data)
                n += len(data)
            _check(src, src_rel, n, nbytes, h, checksum)  # raising here discards the temp copy
        return n

    out = _policy(retries, backoff_s).run(attempt, lambda: f"copy of {src_rel} to {dst.url} from {src.path(src_rel)}",
                                          retry_if=any_failure, on_retry=on_retry)
    return CopyResult(cast(int, out.value), (now_ns() - t0) / 1e9, out.attempts, out.refetches)


def fetch_verified(src: Backend, rel: str, nbytes: int, checksum: str, *, retries: int = 3,
                   backoff_s: float = 0.2, verify: bool = True, on_retry=None) -> tuple[bytes, int, int]:
    """A whole shard in memory, verified: (data, attempts, refetches)."""
    out: list[bytes] = []

    def attempt() -> int:
        data = src.cat(rel)
        h = None
        if verify:
            h = new_hasher(checksum)
            h.update(data)
        _check(src, rel, len(data), nbytes, h, checksum)
        out[:] = [data]
        return len(data)

    res = _policy(retries, backoff_s).run(attempt, lambda: f"read of {rel} from {src.path(rel)}",
                                          retry_if=any_failure, on_retry=on_retry)
    return out[0], res.attempts, res.refetches


def _check_read_back(dst: Backend, rel: str, nbytes: int, sent, algo: str) -> None:
    """Re-read a published copy and compare it with the hash of the bytes that were sent."""
    got = dst.size(rel)
    if got != nbytes:
        raise IntegrityError(f"copy {dst.path(rel)} has {got} bytes, the source {nbytes}")
    back = new_hasher(algo)
    for data in iter_chunks(dst, rel, nbytes):
        back.update(data)
    if back.hexdigest() != sent.hexdigest():
        raise IntegrityError(f"copy {dst.path(rel)} does not match its source")


def _check(src: Backend, rel: str, got: int, nbytes: int, h, checksum: str | None) -> None:
    if got != nbytes:
        raise IntegrityError(f"{src.path(rel)}: {got} bytes arrived, the manifest says {nbytes}")
    if checksum and h is not None and not matches(checksum, h.hexdigest()):
        raise IntegrityError(f"{src.path(rel)}: checksum {h.hexdigest()} does not match the manifest's {checksum}")


def write_copy(dst: Backend, rel: str, data, fsync: bool = True) -> None:
    with dst.open_output(rel, fsync=fsync) as f:
        f.write(data)
