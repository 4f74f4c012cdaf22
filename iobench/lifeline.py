"""Worker processes die with their parent.

A writer or loader worker whose parent was SIGKILLed must not go on writing (nor block for
ever on a pipe no one reads: the other workers, forked from the same parent, hold its read
end open).  ``die_with_parent()``, called first thing in a worker, asks Linux to send it
SIGKILL when its parent exits (``prctl(PR_SET_PDEATHSIG)``), then closes the race where the
parent died before the request: if the parent is already gone, the worker exits at once.
Elsewhere (no prctl) it is a no-op and the parent's own deadlines and liveness checks apply.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None) -> bool:
    """True when the parent-death signal is armed."""
    if not sys.platform.startswith("linux"):
        return False
    if parent_pid is None:
        parent = mp.parent_process()
        parent_pid = parent.pid if parent is not None else None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    # Under fork and spawn the parent is the process that started us; under forkserver it is
    # the fork server (which exits with the starting process), so ask whether the starting
    # process is still there rather than whether it is our parent.
    if parent_pid is not None and os.getppid() != parent_pid and not _alive(parent_pid):
        os._exit(1)   # the parent died before the signal was armed
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
