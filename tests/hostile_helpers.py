"""Shared pieces of the hostile suites (tests/test_hostile_io.py, tests/test_hostile_values.py).

A hostile row runs one command and asserts what every refused input must give: exit code 2,
exactly one line on stderr, no traceback, every victim file byte-identical, and an end within
seconds.  Two runners, same result type:

- ``run_inprocess``: ``iobench.cli.main`` in this process, stdout/stderr captured, a SIGALRM
  deadline (a blocked ``open`` of a FIFO or a wait on a queue is interrupted, and the row fails
  as a hang instead of blocking the suite).  Cheap: use it for refusals before work.
- ``run_subprocess``: ``python -m iobench.cli`` with a timeout; for rows that may start worker
  processes (a FIFO in place of a shard), where a hang must not leave anything behind.

Victims: ``snapshot(paths)`` hashes every regular file under the given paths (and records the
kind of everything else without opening it), so ``snapshot`` before == after proves nothing was
written, replaced, deleted or created there.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass

NON_UTF8 = b"gen:\n  seed: \xff\xfe\xc3\x28 1\n"        # invalid UTF-8 (not even a valid 2-byte sequence)
NON_SQLITE = b"this is not a SQLite database, just text\n" * 4


@dataclass(frozen=True)
class Run:
    rc: int | None          # None: it did not end within the deadline
    stdout: str
    stderr: str
    seconds: float

    @property
    def stderr_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def run_inprocess(argv: list[str], timeout_s: float = 10.0) -> Run:
    """``iobench.cli.main(argv)`` with stdout/stderr captured and a SIGALRM deadline."""
    from iobench.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    t0 = time.monotonic()
    rc: int | None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main([str(a) for a in argv])
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
                if e.code is not None and not isinstance(e.code, int):
                    err.write(str(e.code) + "\n")
    except Hang:
        rc = None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return Run(rc, out.getvalue(), err.getvalue(), time.monotonic() - t0)


def run_subprocess(argv: list[str], timeout_s: float = 20.0, cwd: str | None = None,
                   env: dict | None = None) -> Run:
    """``python -m iobench.cli argv`` with a timeout; a run past it is killed (its process group too)."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "iobench.cli", *map(str, argv)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=cwd, env=env, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
        return Run(p.returncode, out, err, time.monotonic() - t0)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return Run(None, out, err, time.monotonic() - t0)


def assert_refused(r: Run, field: str | None = None, within_s: float | None = None) -> None:
    """Exit 2, exactly one stderr line (naming ``field`` when given), no traceback, in time."""
    assert r.rc is not None, f"hung (no end within the deadline); stderr so far: {r.stderr[-500:]!r}"
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.rc == 2, f"rc {r.rc}, expected 2; stderr: {r.stderr[-1000:]!r}; stdout: {r.stdout[-500:]!r}"
    assert len(r.stderr_lines) == 1, f"expected one stderr line, got {r.stderr_lines!r}"
    if field is not None:
        assert field in r.stderr_lines[0], f"{field!r} not named in {r.stderr_lines[0]!r}"
    if within_s is not None:
        assert r.seconds < within_s, f"took {r.seconds:.1f} s (> {within_s} s)"


# ---- victims ------------------------------------------------------------------------------

def _hash(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def snapshot(*paths: str | os.PathLike) -> dict[str, str]:
    """path -> content hash (regular files) or kind (FIFOs, devices, sockets, symlinks: never
    opened), for every path given and everything below the directories among them."""
    out: dict[str, str] = {}

    def one(p: str) -> None:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            out[p] = "absent"
            return
        if stat.S_ISLNK(st.st_mode):
            out[p] = "symlink->" + os.readlink(p)
        elif stat.S_ISREG(st.st_mode):
            out[p] = _hash(p)
        elif stat.S_ISDIR(st.st_mode):
            out[p] = "dir"
            for name in sorted(os.listdir(p)):
                one(os.path.join(p, name))
        else:
            out[p] = f"special:{stat.S_IFMT(st.st_mode)}"

    for p in paths:
        one(os.fspath(p))
    return out


# ---- hostile files ------------------------------------------------------------------------

def make_fifo(path: str | os.PathLike) -> str:
    p = os.fspath(path)
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    os.mkfifo(p)
    return p


def make_non_utf8(path: str | os.PathLike) -> str:
    p = os.fspath(path)
    with open(p, "wb") as f:
        f.write(NON_UTF8)
    return p


def make_non_sqlite(path: str | os.PathLike) -> str:
    p = os.fspath(path)
    with open(p, "wb") as f:
        f.write(NON_SQLITE)
    return p


def make_user_file(path: str | os.PathLike, text: str = "the user's own work\n") -> str:
    p = os.fspath(path)
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    with open(p, "w") as f:
        f.write(text)
    return p
