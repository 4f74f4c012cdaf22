"""Atomic publication of local files: temp name, fsync, rename, fsync of the directory.

Nothing half-written is ever visible under the final name.  Tests prove the syncs happen
(measurement rule 6, "fsync means fsync", docs/design.md) by wrapping ``os.fsync`` and counting.

This module owns the temp-name convention (``.<final name>.<host>-<pid>-<start>-<random>.tmp``
beside the final file: the writer's host, process id and process start time, so that a later run
can tell a live writer's temp file from a dead one's): ``temp_file`` makes one, ``final_name_of``
recognises one and ``writer_alive`` says whether its writer still runs (clean-ups of killed writers
in generate and tier reconcile ask them, never a pattern of their own, and remove only the temp
files of dead writers: a second ``gen`` into the same directory leaves the first one's alone).
``publish_new`` publishes only where no file of that name exists yet, atomically (a hard
link, which fails with EEXIST), so two writers of one commit point cannot both win.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

_TEMP = re.compile(r"\.(.+)\.(?P<host>[0-9a-f]{6})-(?P<pid>\d+)-(?P<start>\d+)-[0-9a-f]{4}\.tmp")
_TEMP_OLD = re.compile(r"\.(.+)\.[A-Za-z0-9_]{8}\.tmp")   # before the writer was in the name: no one's now
_ME: tuple[int, str] | None = None   # (pid, "<host>-<pid>-<start>") of this process, redone after a fork


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22): with the pid, a
    name no later process has.  None when there is no such process, or only its zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    if fields[0] in (b"Z", b"X"):   # a zombie writes nothing: dead (its parent has not reaped it yet)
        return None
    return fields[19].decode()


def _host() -> str:
    import hashlib
    import socket

    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]


def _writer_tag() -> str:
    global _ME
    pid = os.getpid()
    if _ME is None or _ME[0] != pid:
        _ME = (pid, f"{_host()}-{pid}-{_start_time(pid) or 0}")
    return _ME[1]


def writer_pid(name: str) -> int | None:
    """The pid of the process on this host that made temp file ``name`` (None: another host, or no
    writer recorded)."""
    m = _TEMP.fullmatch(name)
    return int(m.group("pid")) if m is not None and m.group("host") == _host() else None


def writer_alive(name: str) -> bool:
    """Whether the process that made temp file ``name`` may still be writing it: True for a live
    process with the same start time, or one on another host (which this host cannot see); False for
    a dead writer, a reused pid, or a temp name of the old convention (no writer recorded)."""
    m = _TEMP.fullmatch(name)
    if m is None:
        return False
    if m.group("host") != _host():
        return True
    start = _start_time(int(m.group("pid")))
    if start is None:
        if os.path.exists("/proc/self/stat"):
            return False
        try:
            os.kill(int(m.group("pid")), 0)   # no /proc (not Linux): the pid alone
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return m.group("start") in ("0", start)


def temp_file(final: str | os.PathLike) -> tuple[int, str]:
    """(fd, path) of a new temp file beside ``final``, named by the convention above, with the
    mode an ordinary ``open(path, "w")`` gives: datasets and results on shared storage must be
    readable by the group/world the user's umask allows.  The file is created with 0666 and
    the kernel applies the umask (mkstemp's 0600 needed an fchmod with the umask read from
    /proc/self/status, ~1 ms a file in a process with copier threads: a sixth of a local
    prestage's copy time went there)."""
    final = Path(final)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        tmp = str(final.parent / f".{final.name}.{_writer_tag()}-{secrets.token_hex(2)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", str(final.parent))


def final_name_of(name: str) -> str | None:
    """The final file name a temp file of ours stands for, or None when ``name`` is not one."""
    m = _TEMP.fullmatch(name) or _TEMP_OLD.fullmatch(name)
    return m.group(1) if m else None


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
    fd, tmp = temp_file(final)
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


def publish_new(path: str | os.PathLike, data: bytes, fsync: bool = True, before_publish=None) -> None:
    """Publish ``data`` as ``path`` only if nothing is there yet; ``FileExistsError`` otherwise.

    The temp file is linked to the final name (``link(2)`` fails when the name exists, in
    one atomic step), so there is no window between a check and the rename in which another
    writer's file could be replaced.  ``before_publish`` runs after the data is durable and
    before it becomes visible (crash-injection hooks).
    """
    final = Path(path)
    fd, tmp = temp_file(final)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        if before_publish is not None:
            before_publish()
        try:
            os.link(tmp, final)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV):
                raise
            # No hard links on this file system (some FUSE/SMB mounts): exclusive create, then fill.
            _publish_new_by_create(final, data, fsync)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    if fsync:
        fsync_dir(final.parent)


def _publish_new_by_create(final: Path, data: bytes, fsync: bool) -> None:
    # O_EXCL makes the name ours; a reader may see it before it is full, so this is only the
    # fallback where link(2) is missing.
    fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
