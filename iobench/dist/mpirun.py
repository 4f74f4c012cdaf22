"""Start a command on N local ranks with whichever MPI is installed (tests and benchmarks).

The ``mpi`` extra brings MPICH's ``mpirun`` (hydra) from PyPI next to the Python
executable; a system Open MPI or MPICH on PATH works too.  Open MPI refuses to run as root
and to place more ranks than cores unless told, so those flags are added for it only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache

from ..errors import MissingDependencyError


@lru_cache(maxsize=1)
def find_mpirun() -> tuple[str, str]:
    """(path of mpirun, "openmpi" | "mpich" | "other"); the one beside this Python first."""
    here = os.path.join(os.path.dirname(sys.executable), "mpirun")
    path = here if os.access(here, os.X_OK) else shutil.which("mpirun") or shutil.which("mpiexec")
    if not path:
        raise MissingDependencyError("mpirun", "mpich", extra="mpi")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    kind = "openmpi" if "Open MPI" in out or "OpenRTE" in out else "mpich" if "HYDRA" in out.upper() else "other"
    return path, kind


def mpirun_argv(n: int, argv: list[str]) -> list[str]:
    path, kind = find_mpirun()
    extra = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) if kind == "openmpi" else []
    return [path, "-n", str(n), *extra, *argv]


def mpirun_env(env: dict | None = None) -> dict:
    out = dict(os.environ if env is None else env)
    # the rank processes import this iobench (a source checkout too)
    out["PATH"] = os.path.dirname(sys.executable) + os.pathsep + out.get("PATH", "")
    return out


def run_ranks(n: int, argv: list[str], timeout: float = 120, env: dict | None = None,
              **kw) -> subprocess.CompletedProcess:
    """``mpirun -n N argv`` with captured text output; the launcher is killed at ``timeout``."""
    return subprocess.run(mpirun_argv(n, argv), env=mpirun_env(env), capture_output=True, text=True,
                          timeout=timeout, **kw)


__all__ = ["find_mpirun", "mpirun_argv", "mpirun_env", "run_ranks"]
