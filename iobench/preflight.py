"""Refuse before work: every path a command will write or read is checked before it starts.

A benchmark that runs for an hour and then fails to write ``--json`` to a directory, or a
read-only file system, wastes the hour.  ``check_args`` runs in ``iobench.cli.main`` before
any command function, over the paths each command declared (``iobench.guard.declare``: every
output, input file, work directory, ``--local``/``--durable``); commands with more paths of
their own call the helpers below.  Each failure is a
``ConfigError`` (exit 2, one line) that names the flag and says the real cause: missing,
wrong kind, permission, or a read-only file system.

Only local paths are checked here: a URL (``s3://``, ``memory://``) is checked by
``Backend.check_reachable`` when the backend opens.
"""

from __future__ import annotations

import os
import stat
import tempfile

from .errors import ConfigError


def is_local(path: str) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def _local(path: str) -> str:
    path = str(path)
    return os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)


def _kind(path: str) -> str:
    """'a file', 'a FIFO (named pipe)', 'a device'... for messages about a path of the wrong kind."""
    from .io.inputs import kind_of

    st = os.stat(path)
    return "a file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)


def _read_only_fs(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _existing_ancestor(path: str) -> str:
    p = path
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _check_writable_dir(d: str, flag: str, what: str) -> None:
    if not os.path.isdir(d):
        raise ConfigError(flag, f"{d} is not a directory, so {what} cannot be created there",
                          "give a path under an existing directory")
    if _read_only_fs(d):
        raise ConfigError(flag, f"{d} is on a read-only file system", "give a path on a writable file system")
    if not os.access(d, os.W_OK | os.X_OK):
        raise ConfigError(flag, f"no permission to write in {d}", "fix its permissions or give another path")
    # The only proof: create (and at once remove) a file there -- /proc, FUSE mounts and dropped
    # capabilities all pass the checks above and still refuse the write at the end of a run.
    try:
        fd, probe = tempfile.mkstemp(prefix=".iobench-write-check-", dir=d)
    except OSError as e:
        raise ConfigError(flag, f"cannot create files in {d} ({e.strerror or type(e).__name__})",
                          "give a path on a writable local file system") from None
    os.close(fd)
    os.unlink(probe)


def _check_creatable(p: str, flag: str, path: str, fix: str) -> None:
    """``p`` (absent or a directory) can be created: its nearest existing ancestor is a writable directory."""
    anc = _existing_ancestor(p)
    if anc != p and not os.path.isdir(anc):
        raise ConfigError(flag, f"{anc} is a file, so {path} cannot be created", fix)
    _check_writable_dir(anc, flag, path)


def output_file(path: str, flag: str) -> None:
    """``path`` can be written as a file (created or replaced): else ConfigError naming ``flag``."""
    if not is_local(path) or path == "-":   # "-": standard output
        return
    p = _local(path)
    if str(path).endswith(os.sep) or os.path.isdir(p):
        raise ConfigError(flag, f"{path} is a directory", "give a file path, e.g. results.json")
    if os.path.lexists(p):
        st = os.stat(p) if os.path.exists(p) else None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise ConfigError(flag, f"{path} exists and is not a regular file", "give a file path")
    _check_name_length(p, flag, path, _TEMP_NAME_EXTRA)
    _check_creatable(os.path.dirname(p), flag, path, "give a path under a directory")


# an output file is written under a temp name first (iobench.io.atomic): '.' + name + '.<host>-<pid>-<start>-<rand>.tmp'
_TEMP_NAME_EXTRA = 48


def _check_name_length(p: str, flag: str, path: str, extra: int = 0) -> None:
    """Each component of ``p`` fits the file system's name limit (with ``extra`` bytes for a temp name)."""
    try:
        limit = os.pathconf(_existing_ancestor(os.path.dirname(p) or "."), "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    parts = [c for c in p.split(os.sep) if c]
    for n, part in enumerate(parts):
        room = limit - (extra if n == len(parts) - 1 else 0)
        if len(part.encode(errors="surrogateescape")) > room:
            raise ConfigError(flag, f"a name in {path[:60]}... is {len(part.encode(errors='surrogateescape'))} bytes, "
                              f"over the {room} this file system allows there", "give a shorter name")


def output_dir(path: str, flag: str) -> None:
    """``path`` is, or can be created as, a writable directory."""
    if not is_local(path):
        return
    p = _local(path)
    if os.path.exists(p):
        if not os.path.isdir(p):
            raise ConfigError(flag, f"{path} is {_kind(p)}, not a directory", "give a directory path")
        _check_writable_dir(p, flag, "files")
        return
    _check_name_length(p, flag, path)
    _check_creatable(p, flag, path, "give a directory path")


def input_file(path: str, flag: str) -> None:
    """``path`` is an existing, readable regular file (never a FIFO that would block a read)."""
    if not is_local(path):
        return
    p = _local(path)
    if not os.path.exists(p):
        raise ConfigError(flag, f"{path} does not exist", "give the path of an existing file")
    st = os.stat(p)
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(flag, f"{path} is a directory", "give a file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(flag, f"{path} is not a regular file (FIFO, device or socket)", "give a regular file")
    try:
        os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))
    except PermissionError:
        raise ConfigError(flag, f"{path} is not readable (permission denied)", "fix its permissions") from None


def input_dir(path: str, flag: str) -> None:
    """``path`` is an existing, readable directory (nothing is created)."""
    if not is_local(path):
        return
    p = _local(path)
    if not os.path.exists(p):
        raise ConfigError(flag, f"{path} does not exist", "give an existing directory")
    if not os.path.isdir(p):
        raise ConfigError(flag, f"{path} is {_kind(p)}, not a directory", "give a directory")
    if not os.access(p, os.R_OK | os.X_OK):
        raise ConfigError(flag, f"{path} is not readable (permission denied)", "fix its permissions")


def same_place(a: str, b: str) -> bool:
    return is_local(a) and is_local(b) and os.path.realpath(_local(a)) == os.path.realpath(_local(b))


def looks_like_file(value: str) -> bool:
    return os.sep in str(value) or str(value).endswith((".yaml", ".yml", ".json"))


def check_args(args) -> None:
    """The up-front kind checks over every path a command declared (``iobench.guard.declare``):
    outputs can be written, input files exist and are regular, work directories are writable.
    ``iobench.guard.check`` then checks how the paths relate (an output over an input, overlapping
    roots, a file iobench did not write)."""
    from .guard import Role

    for pf in getattr(args, "io_paths", None) or ():
        if pf.role is not Role.NOT_A_PATH and getattr(args, pf.dest, None) == "":
            # `--json ''` (an unset shell variable): asked for a file, would silently get none
            raise ConfigError(pf.flag, "is an empty path", "give a path")
        for x in pf.paths(args):
            if pf.role is Role.OUT_FILE:
                output_file(x, pf.flag)
            elif pf.role in (Role.OUT_DIR, Role.WORK) or (pf.role is Role.ROOT and getattr(args, "command", "") != "ckpt"):
                output_dir(x, pf.flag)   # (ckpt's roots: _check_ckpt, since restore only reads them)
            elif pf.role in (Role.IN_FILE, Role.IN_TIERS) and pf.must_exist:
                if pf.dest == "workload" and not looks_like_file(x):
                    continue   # a workload name, not a file
                input_file(x, pf.flag)
    if getattr(args, "command", None) == "ckpt":
        _check_ckpt(args)


def _check_ckpt(args) -> None:
    local, durable = getattr(args, "local", None), getattr(args, "durable", None)
    if getattr(args, "action", None) == "restore":
        # restore reads: a tier that does not exist is a typo, and must not be created
        for v, flag in ((local, "--local"), (durable, "--durable")):
            if v:
                input_dir(v, flag)
        return
    for v, flag in ((local, "--local"), (durable, "--durable")):
        if v:
            output_dir(v, flag)
