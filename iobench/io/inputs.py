"""One reader for files the user hands us: never blocks, never a traceback.

Every file iobench reads because a user named it (``--workload``, ``--tiers``, ``--config``,
``--compute file:``, ``plan --from``, ``report``/``compare`` results, ``tiers simulate``
traces, manifests, catalogs) and every data file it opens on a read path (shards, the
page-cache residency probe, copies) goes through ``open_regular``:

- the open uses ``O_NONBLOCK``: a FIFO with no writer would otherwise block ``open`` forever
  (a device can too); the flag is cleared again once ``fstat`` has said "regular file";
- anything but a regular file (FIFO, directory, device, socket) is a ``ConfigError`` (exit 2)
  naming the flag or field the path came from;
- ``read_bytes``/``read_text`` cap the size (a config file of 10 GiB is a mistake, not a
  config) and turn decode errors (a non-UTF-8 YAML or JSON) into the same one-line error.

``check_sqlite`` applies the same rule to a SQLite catalog before ``sqlite3.connect``, which
would otherwise block on a FIFO or fail deep inside a transaction with a raw sqlite3 error.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
from typing import IO, Any, Iterator

from ..errors import ConfigError

MAX_CONFIG_BYTES = 64 << 20      # a YAML/JSON config, workload or tiers file
MAX_RESULTS_BYTES = 1 << 30      # a results document (load results with per-step series stay far below)
SQLITE_MAGIC = b"SQLite format 3\x00"


def kind_of(mode: int) -> str:
    """What a non-regular file is, in the words of an error message."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: str | os.PathLike, field: str, fix: str = "give a regular file", flags: int = 0) -> int:
    """An fd (blocking, close-on-exec, opened with ``flags`` too, e.g. ``O_DIRECT``) on ``path``,
    which must be a regular file.

    FileNotFoundError passes through unchanged (callers say what was expected there);
    a FIFO, directory, device or socket, and a permission error, are ``ConfigError(field)``."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0) | flags)
    except IsADirectoryError:
        raise ConfigError(field, f"{p} is a directory", fix) from None
    except PermissionError:
        raise ConfigError(field, f"{p} is not readable (permission denied)", "fix its permissions") from None
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP):   # a socket, or a device without a driver
            raise ConfigError(field, f"{p} is not a regular file ({e.strerror})", fix) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(field, f"{p} is {kind_of(st.st_mode)}", fix)
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def require_regular(path: str | os.PathLike, field: str, fix: str = "give a regular file") -> None:
    """``path`` is a regular file (following symlinks), checked with ``stat`` alone (no open).

    For the hot read paths that open a file through a library (fsspec, mmap): a FIFO in place
    of a shard is refused here instead of blocking the library's ``open``."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise
    except PermissionError:
        raise ConfigError(field, f"{p} is not readable (permission denied)", "fix its permissions") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(field, f"{p} is {kind_of(st.st_mode)}", fix)


def pread_full(fd: int, buf: memoryview, offset: int) -> int:
    """pread into ``buf`` from ``offset`` until it is full or the file ends (a short read is
    continued; end of file returns early): the bytes read."""
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got)
        if not n:
            break
        got += n
    return got


def readinto_full(f, buf: memoryview) -> int:
    """``f.readinto`` until ``buf`` is full or ``f`` ends: the bytes read."""
    got = 0
    while got < len(buf):
        n = f.readinto(buf[got:])
        if not n:
            break
        got += n
    return got


def open_regular_file(path: str | os.PathLike, field: str, fix: str = "give a regular file",
                      buffering: int = -1) -> IO[bytes]:
    """``open_regular`` as a binary file object."""
    return os.fdopen(open_regular(path, field, fix), "rb", buffering=buffering)


def read_bytes(path: str | os.PathLike, field: str, max_bytes: int = MAX_CONFIG_BYTES,
               what: str = "file") -> bytes:
    """The whole of a user-given file; ConfigError (exit 2) when missing, not regular or too big."""
    try:
        return read_regular(path, field, max_bytes, f"give a {what}", what)
    except FileNotFoundError:
        raise ConfigError(field, f"{os.fspath(path)} does not exist", f"give the path of an existing {what}") \
            from None


def read_regular(path: str | os.PathLike, field: str, max_bytes: int, fix: str, what: str = "file") -> bytes:
    """``read_bytes`` for callers that say themselves what a missing file means: FileNotFoundError
    passes through; any other problem is ``ConfigError(field, ..., fix)``."""
    p = os.fspath(path)
    fd = open_regular(p, field, fix)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise ConfigError(field, f"{p} is {size} bytes, more than the {max_bytes} a {what} may have", fix)
        chunks, left = [], max_bytes + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > max_bytes:   # grew while we read (or st_size lied: /proc-like files)
            raise ConfigError(field, f"{p} is more than {max_bytes} bytes", fix)
        return data
    except IsADirectoryError:
        raise ConfigError(field, f"{p} is a directory", fix) from None
    finally:
        os.close(fd)


def decode_text(data: bytes, path: str | os.PathLike, field: str, what: str = "file") -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(field, f"{os.fspath(path)} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})",
                          f"give a {what} saved as UTF-8") from None


def read_text(path: str | os.PathLike, field: str, max_bytes: int = MAX_CONFIG_BYTES, what: str = "text file") -> str:
    """A user-given UTF-8 text file (a leading BOM is dropped)."""
    text = decode_text(read_bytes(path, field, max_bytes, what), path, field, what)
    return text[1:] if text.startswith("\ufeff") else text


# ---- parsing text someone else wrote ------------------------------------------------------
# json.loads and yaml.safe_load recurse once per nesting level: `[[[[...` (100 000 deep, a
# 200 KB file or one command-line argument) raises RecursionError, which is no ValueError, so
# every `except ValueError` around a parse let it through as a traceback.  Every parse of text
# iobench did not write goes through these two, which report it as the parser's own error.

def loads_json(raw: str | bytes | bytearray) -> Any:
    """``json.loads``; nesting too deep is a ``ValueError`` like any other malformed JSON."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply to be JSON iobench reads") from None


def loads_yaml(text: str) -> Any:
    """``yaml.safe_load``; nesting too deep is a ``yaml.YAMLError`` like any other malformed YAML."""
    import yaml

    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply to be YAML iobench reads") from None


def read_yaml(path: str | os.PathLike, field: str, max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    import yaml

    text = read_text(path, field, max_bytes, "YAML file")
    try:
        return loads_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(field, f"{os.fspath(path)} is not valid YAML: {e}", "fix the file") from None


def read_json(path: str | os.PathLike, field: str, max_bytes: int = MAX_RESULTS_BYTES,
              what: str = "JSON file") -> Any:
    text = read_text(path, field, max_bytes, what)
    try:
        return loads_json(text)
    except ValueError as e:
        raise ConfigError(field, f"{os.fspath(path)} is not JSON ({e})", f"give a {what}") from None


MAX_LINE_BYTES = 1 << 20        # one record of a JSON-lines file (a trace record is ~200 bytes)


def read_lines(path: str | os.PathLike, field: str, what: str = "text file",
               max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """(line number, line) of a user-given text file, one line in memory at a time (traces can be
    large: the file has no cap, a line has ``max_line``: a 4 GiB file of NUL bytes is one line,
    and reading it whole took the host's memory).  A line over the cap or not UTF-8 is
    ``ConfigError(field)`` naming the line."""
    p = os.fspath(path)
    try:
        fd = open_regular(p, field, f"give a {what}")
    except FileNotFoundError:
        raise ConfigError(field, f"{p} does not exist", f"give the path of an existing {what}") from None
    with os.fdopen(fd, "rb") as f:
        for n, raw in enumerate(iter(lambda: f.readline(max_line + 1), b""), 1):
            if len(raw) > max_line:
                raise ConfigError(field, f"{p}:{n} is a line of more than {max_line} bytes", f"give a {what}")
            try:
                yield n, raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError(field, f"{p}:{n} is not UTF-8 text", f"give a {what}") from None


def check_sqlite(path: str | os.PathLike, field: str = "catalog") -> None:
    """``path`` can be opened as a SQLite database for reading and writing, or created.

    Refused (ConfigError): a directory, FIFO or device; a file that is not SQLite; a read-only
    file or directory (SQLite in WAL mode writes ``-wal`` and ``-shm`` files beside it)."""
    p = os.fspath(path)
    fix = "give the path of a SQLite catalog file, or omit catalog: to use the default"
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return   # created on first use; the directory is checked by whoever makes it
    except OSError as e:
        raise ConfigError(field, f"{p} cannot be used ({e.strerror})", fix) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(field, f"{p} is {kind_of(st.st_mode)}", fix)
    if st.st_size:
        fd = open_regular(p, field, fix)
        try:
            head = os.read(fd, len(SQLITE_MAGIC))
        finally:
            os.close(fd)
        if head != SQLITE_MAGIC:
            raise ConfigError(field, f"{p} is not a SQLite database", fix)
    if not os.access(p, os.R_OK | os.W_OK):
        raise ConfigError(field, f"{p} is read-only", "make it writable, or give another catalog path")
    d = os.path.dirname(os.path.abspath(p))
    if not os.access(d, os.W_OK | os.X_OK):
        raise ConfigError(field, f"{d} (the catalog's directory) is not writable: SQLite needs its -wal and -shm "
                          "files there", "make it writable, or give another catalog path")
