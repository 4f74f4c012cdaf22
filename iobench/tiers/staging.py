"""Verified copies between tiers: stream, checksum on arrival, publish atomically, retry.

A copy is written through ``Backend.open_output`` (temp name + rename locally, a completed
multipart upload on S3), so a reader never sees a partial copy.  The checksum is computed
while the bytes stream through; a mismatch aborts the write and fetches the shard again.
Source errors (connection refused, timeouts, vanished files) are retried with doubling
back-off, then raised as one ``StorageError`` naming the shard and both URLs.
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


def _buffer() -> bytearray:
    """One reused read buffer per thread: fresh 8 MiB allocations cost a page fault per 4 KiB."""
    b = getattr(_tls, "buf", None)
    if b is None:
        b = _tls.buf = bytearray(CHUNK)
    return b


def _kernel_copy(src_path: str, f, nbytes: int, h) -> int:
    """Copy inside the kernel (copy_file_range, as cp does), then checksum what arrived.

    The destination file itself is read back and hashed (from the page cache), so the
    checksum covers the bytes that landed, not the ones that were sent.
    """
    f.flush()
    out = f.fileno()
    n = 0
    with open(src_path, "rb", buffering=0) as s:
        while True:
            got = os.copy_file_range(s.fileno(), out, max(nbytes - n, CHUNK))
            if got == 0:
                break
            n += got
    if h is not None and n:
        buf = _buffer()
        view = memoryview(buf)
        for start in range(0, n, len(buf)):
            got = os.preadv(out, [buf], start)
            if got <= 0:
                break
            h.update(view[:got])
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

    use_kernel = [_plain_local(src) and _plain_local(dst) and hasattr(os, "copy_file_range")]

    def attempt() -> int:
        h = new_hasher(checksum) if verify else None
        n = 0
        if use_kernel[0]:
            try:
                with dst.open_output(dst_rel, fsync=fsync) as f:
                    n = _kernel_copy(src.path(src_rel), f, nbytes, h)
                    _check(src, src_rel, n, nbytes, h, checksum)
                return n
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                use_kernel[0] = False  # e.g. EXDEV across file systems on kernels before 5.3
                h = new_hasher(checksum) if verify else None
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
