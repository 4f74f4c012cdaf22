"""The set of cooperating ranks: one process by default, MPI ranks when started by mpirun."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


@dataclass
class World:
    rank: int = 0
    size: int = 1
    _comm: Any = None

    def barrier(self) -> None:
        if self._comm is not None:
            self._comm.Barrier()

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        if self._comm is None:
            return [obj]
        return self._comm.gather(obj, root=0)

    def allgather(self, obj: Any) -> list[Any]:
        if self._comm is None:
            return [obj]
        return self._comm.allgather(obj)

    def describe(self) -> dict:
        return {"rank": self.rank, "size": self.size, "transport": "mpi" if self._comm is not None else "none"}


def detect_world() -> World:
    """MPI world if this process was started by mpirun and mpi4py is installed; else a single rank."""
    if not any(k in os.environ for k in _MPI_ENV):
        return World()
    try:
        from mpi4py import MPI
    except ImportError:
        from .errors import MissingDependencyError

        raise MissingDependencyError("running under mpirun", "mpi4py", extra="mpi") from None
    comm = MPI.COMM_WORLD
    return World(rank=comm.Get_rank(), size=comm.Get_size(), _comm=comm)


def default_parallelism(items: int) -> int:
    """Writers/copiers to run when the user names none: this process's cores, at most one per item.

    Under mpirun the ranks on one node share its cores (OMPI/MPICH say how many are local).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    local = next((int(os.environ[k]) for k in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
                  if os.environ.get(k, "").isdigit()), 1)
    return max(1, min(max(1, cores // max(1, local)), items))
