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


def current_umask() -> int:
    """The process umask, read without changing it where Linux lets us (threads may be running)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """Mode an ordinary ``open(path, "w")`` would give: datasets and results on shared storage
    must be readable by the group/world the user's umask allows (mkstemp alone gives 0600)."""
    return 0o666 & ~current_umask()


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", fsync: bool = True) -> Iterator[IO]:
    """Write to a temp file beside ``path``; on success fsync and rename it into place."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        os.fchmod(fd, default_file_mode())
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
