"""Atomic publication of local files: temp name, fsync, rename, fsync of the directory.

Nothing half-written is ever visible under the final name.  ``fsync_calls`` lets tests
prove the syncs happen (measurement rule 6): wrap ``os.fsync`` and count.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", fsync: bool = True) -> Iterator[IO]:
    """Write to a temp file beside ``path``; on success fsync and rename it into place."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, final)
        if fsync:
            fsync_dir(final.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes, fsync: bool = True) -> None:
    with atomic_open(path, "wb", fsync=fsync) as f:
        f.write(data)
