"""Writing rank files: staging buffer → file on a tier, checksummed on the way, fsynced.

Local files go to a temp name, are fsynced, renamed into the step directory, and the
directory is fsynced (iobench.io.atomic).  Object stores get a streamed (multipart when
large) upload that only becomes visible when it completes.  A full disk or any other
I/O error leaves no partial file under the final name and is raised as ``StorageError``
naming the file.
"""

from __future__ import annotations

import errno
import time

import numpy as np

from iobench.errors import StorageError
from iobench.io.checksum import checksum_of, new_hasher
from iobench.io.copy import stream_copy
from iobench.io.pagecache import start_writeback
from iobench.storage import Backend

from .hooks import crashpoint
from iobench.io.ratelimit import RateLimiter

CHUNK = 8 * 1024 * 1024


RANK_ALGO = "xxh3_64"


def checksum(buf) -> str:
    """Rank files carry xxh3_64 (the fastest of the algorithms iobench.io.checksum knows)."""
    return checksum_of(buf, RANK_ALGO)


def _write_chunks(f, mv: memoryview, throttle: RateLimiter | None, crash_mid: str, hasher=None,
                  writeback: bool = False) -> None:
    """Write ``mv`` in chunks; ``hasher`` is fed each chunk just before it is written (the
    digest then covers exactly the bytes handed to the file), ``writeback`` starts each
    chunk's writeback as soon as it is written (the caller's fsync then waits for less)."""
    n = len(mv)
    half = max(1, n // 2)
    pos = 0
    while pos < n:
        end = min(n, pos + CHUNK, half if pos < half else n)
        if hasher is not None:
            hasher.update(mv[pos:end])
        f.write(mv[pos:end])
        if writeback:
            start_writeback(f.fileno(), pos, end - pos)
        if throttle is not None:
            throttle.consume(end - pos)
        if pos < half <= end:
            crashpoint(crash_mid)
        pos = end


def write_buffer(backend: Backend, rel: str, buf: np.ndarray, fsync: bool = True,
                 throttle: RateLimiter | None = None) -> tuple[str, float]:
    """Publish ``buf`` as ``rel``; returns (checksum, seconds)."""
    t0 = time.perf_counter()
    mv = memoryview(buf).cast("B")
    digest = checksum(mv)
    crashpoint("before_shard_write")
    try:
        with backend.open_output(rel, fsync=fsync) as f:
            _write_chunks(f, mv, throttle, "mid_shard_write")
    except OSError as e:
        if isinstance(e, StorageError):
            raise
        what = "disk full" if e.errno == errno.ENOSPC else type(e).__name__
        raise StorageError(f"{backend.url.rstrip('/')}/{rel}: write failed ({what}: {e})") from e
    return digest, time.perf_counter() - t0


def _paced(throttle: RateLimiter | None):
    """``stream_copy``'s per-chunk hook: the rate cap, and the ``mid_upload`` crash point once,
    after the first chunk (of the first file, where one hook serves several copies)."""
    fired = [False]

    def on_chunk(n: int, first: bool) -> None:
        if throttle is not None:
            throttle.consume(n)
        if not fired[0]:
            fired[0] = True
            crashpoint("mid_upload")
    return on_chunk


def copy_file(src: Backend, src_rel: str, dst: Backend, dst_rel: str, fsync: bool = True,
              throttle: RateLimiter | None = None) -> float:
    """Copy one committed file between tiers (upload to the durable tier); returns seconds."""
    t0 = time.perf_counter()
    try:
        if throttle is None and src.is_local and dst.supports_bulk_transfer:
            # s3fs's put_file does a concurrent multipart upload: the same path a plain put takes.
            dst.fs.put_file(src.local_path(src_rel), dst.path(dst_rel))
            crashpoint("mid_upload")
        else:
            with src.open(src_rel, "rb") as fin, dst.open_output(dst_rel, fsync=fsync) as fout:
                stream_copy(fin, fout, on_chunk=_paced(throttle))
    except StorageError:
        raise
    except OSError as e:
        what = "disk full" if e.errno == errno.ENOSPC else type(e).__name__
        raise StorageError(f"{dst.url.rstrip('/')}/{dst_rel}: upload failed ({what}: {e})") from e
    return time.perf_counter() - t0



def write_buffers_local(backend: Backend, items: list[tuple[str, np.ndarray]], fsync: bool = True,
                        throttle: RateLimiter | None = None) -> list[str]:
    """Write several files into one local step directory, fsync each, then fsync the directory once.

    Files go straight to their final names: the step directory is not a checkpoint until its
    manifest is published (after this returns), and restore checks every file's size and
    checksum against that manifest, so a torn file here can never be taken for whole.
    Skipping temp names and renames saves a metadata operation per rank on the critical path.
    Returns the files' checksums.
    """
    import os

    from iobench.io.atomic import fsync_dir

    written: list[str] = []
    digests = []
    try:
        for rel, buf in items:
            final = backend.local_path(rel)
            mv = memoryview(buf).cast("B")
            crashpoint("before_shard_write")
            fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            written.append(final)
            h = new_hasher(RANK_ALGO)
            with os.fdopen(fd, "wb", buffering=0) as f:
                # Hash and start writeback chunk by chunk: the disk writes chunk k while this thread
                # hashes and copies chunk k+1, where hashing first and leaving every byte to the
                # fsync put the hash, the copy and the disk one after the other (256 MiB: ~15 %
                # shorter time to durable here).  The fsync below is still what makes it durable.
                _write_chunks(f, mv, throttle, "mid_shard_write", hasher=h, writeback=fsync)
                if fsync:
                    os.fsync(f.fileno())
            digests.append(f"{RANK_ALGO}:{h.hexdigest()}")
        if fsync and written:
            fsync_dir(os.path.dirname(written[0]))
    except OSError as e:
        _unlink_and_raise(written, e, written[-1] if written else backend.local_path(items[0][0]), "write")
    return digests


def _unlink_and_raise(written: list[str], e: OSError, where: str, verb: str) -> None:
    """Remove this step's partial files (no manifest names them yet) and raise a StorageError."""
    import os

    for p in written:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    if isinstance(e, StorageError):
        raise e
    what = "disk full" if e.errno == errno.ENOSPC else type(e).__name__
    raise StorageError(f"{where}: {verb} failed ({what}: {e})") from e


def copy_files_local(src: Backend, dst: Backend, rels: list[str], fsync: bool = True,
                     throttle: RateLimiter | None = None) -> None:
    """Copy files of an uncommitted step to a local/PFS tier: each fsynced, then one directory fsync
    (the same reasoning as ``write_buffers_local``: the manifest, published after, is the commit)."""
    import os

    from iobench.io.atomic import fsync_dir

    written: list[str] = []
    on_chunk = _paced(throttle)
    try:
        for rel in rels:
            final = dst.local_path(rel)
            fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            written.append(final)
            with src.open(rel, "rb") as fin, os.fdopen(fd, "wb", buffering=0) as fout:
                stream_copy(fin, fout, on_chunk=on_chunk)
                if fsync:
                    os.fsync(fout.fileno())
        if fsync and written:
            fsync_dir(os.path.dirname(written[0]))
    except OSError as e:
        _unlink_and_raise(written, e, written[-1] if written else dst.url, "upload")
