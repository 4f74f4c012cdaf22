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
import time
from dataclasses import dataclass
from typing import Callable

from ..errors import ConfigError, IntegrityError, StorageError
from ..metrics import now_ns
from ..storage import Backend

CHUNK = 8 * 1024 * 1024
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF)


class _Crc32c:
    def __init__(self) -> None:
        import crc32c

        self._fn = crc32c.crc32c
        self.value = 0

    def update(self, data) -> None:
        self.value = self._fn(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def new_hasher(checksum: str):
    """A hasher for a manifest checksum ``"<algo>:<hex>"`` (xxh64, xxh3_64, xxh128, crc32c, sha256, md5)."""
    algo = checksum.partition(":")[0].lower()
    if algo in ("xxh64", "xxh3_64", "xxh3", "xxh128", "xxh3_128", "xxh32"):
        import xxhash

        return {"xxh64": xxhash.xxh64, "xxh32": xxhash.xxh32, "xxh3_64": xxhash.xxh3_64, "xxh3": xxhash.xxh3_64,
                "xxh128": xxhash.xxh3_128, "xxh3_128": xxhash.xxh3_128}[algo]()
    if algo == "crc32c":
        return _Crc32c()
    if algo in ("sha256", "md5", "sha1"):
        import hashlib

        return hashlib.new(algo)
    raise ConfigError("manifest.checksum", f"unknown checksum algorithm {algo!r}",
                      "use xxh64, xxh3_64, xxh128, crc32c or sha256")


def checksum_of(data, like: str) -> str:
    """``data``'s checksum in the same ``algo:hex`` form as ``like``."""
    h = new_hasher(like)
    h.update(data)
    return f"{like.partition(':')[0]}:{h.hexdigest()}"


def matches(checksum: str, hexdigest: str) -> bool:
    return checksum.partition(":")[2].lower() == hexdigest.lower()


def iter_chunks(backend: Backend, rel: str, nbytes: int, chunk: int = CHUNK):
    """The bytes of ``rel`` in chunks, one request each (a local read or a ranged GET).

    Local chunks are views of one reused buffer (a fresh 8 MiB allocation per read costs
    more page faults than the copy itself): use each before asking for the next.
    """
    if backend.protocol == "s3":
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
    return type(b) is Backend and b.is_local


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
    with open(src_path, "rb", buffering=0) as s:
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
    with open(src_path, "rb", buffering=0) as s:
        while True:
            got = os.copy_file_range(s.fileno(), out, max(nbytes - n, CHUNK))
            if got == 0:
                break
            n += got
    return n


@dataclass(frozen=True)
class CopyResult:
    bytes: int
    seconds: float
    attempts: int
    refetches: int          # attempts repeated because the bytes failed their checksum


def _retrying(what: str, src_url: str, retries: int, backoff_s: float, attempt_fn: Callable[[], int],
              on_retry: Callable[[int, BaseException], None] | None = None) -> tuple[int, int, int]:
    refetches = 0
    last: BaseException | None = None
    for attempt in range(1, retries + 1):
        try:
            return attempt_fn(), attempt, refetches
        except (ConfigError, KeyboardInterrupt):
            raise
        except IntegrityError as e:
            refetches += 1
            last = e
        except Exception as e:  # source unreachable, timeouts, vanished files: retry
            last = e
        if on_retry is not None:
            on_retry(attempt, last)
        if attempt < retries:
            time.sleep(backoff_s * (2 ** (attempt - 1)))
    kind = "failed its checksum" if isinstance(last, IntegrityError) else "failed"
    raise StorageError(f"{what} from {src_url} {kind} after {retries} attempts: "
                       f"{type(last).__name__}: {last}") from last


def copy_verified(src: Backend, src_rel: str, dst: Backend, dst_rel: str, nbytes: int, checksum: str, *,
                  retries: int = 3, backoff_s: float = 0.2, verify: bool = True, fsync: bool = True,
                  chunk: int = CHUNK, on_retry=None) -> CopyResult:
    """Copy one shard; the destination appears only whole and verified."""
    t0 = now_ns()

    direct = _plain_local(src) and _plain_local(dst)
    use_kernel = [direct and not verify and hasattr(os, "copy_file_range")]

    def attempt() -> int:
        h = new_hasher(checksum) if verify else None
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

    n, attempts, refetches = _retrying(f"copy of {src_rel} to {dst.url}", src.path(src_rel), retries, backoff_s,
                                       attempt, on_retry)
    return CopyResult(n, (now_ns() - t0) / 1e9, attempts, refetches)


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

    _, attempts, refetches = _retrying(f"read of {rel}", src.path(rel), retries, backoff_s, attempt, on_retry)
    return out[0], attempts, refetches


def _check(src: Backend, rel: str, got: int, nbytes: int, h, checksum: str) -> None:
    if got != nbytes:
        raise IntegrityError(f"{src.path(rel)}: {got} bytes arrived, the manifest says {nbytes}")
    if h is not None and not matches(checksum, h.hexdigest()):
        raise IntegrityError(f"{src.path(rel)}: checksum {h.hexdigest()} does not match the manifest's {checksum}")


def write_copy(dst: Backend, rel: str, data, fsync: bool = True) -> None:
    with dst.open_output(rel, fsync=fsync) as f:
        f.write(data)
