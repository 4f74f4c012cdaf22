"""The set of cooperating ranks: one process by default, MPI ranks when started by mpirun/srun.

Every wait on other ranks is bounded.  MPI's own collectives block forever when a rank is
missing, so a barrier here is a non-blocking ``Ibarrier`` polled until a deadline; the
object collectives (gather, allgather, bcast) first pass such a barrier, so once they start
every rank is already there.  A rank that times out prints one line and aborts the job
(exit code 2): the other ranks would otherwise wait in their own collectives, or in
``MPI_Finalize``, for ever.  Errors that every rank raises together (``agree``, ``all_ok``)
are marked ``collective`` and end each rank normally with exit code 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from ..errors import ConfigError, IobenchError, UsageError

# Variables a launcher sets in every rank: Open MPI, PMI-1/2 (MPICH hydra, Slurm's srun
# --mpi=pmi2, Intel MPI), PMIx (Open MPI 5, srun --mpi=pmix).
_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
TIMEOUT_ENV = "IOBENCH_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0

T = TypeVar("T")


class WorldTimeout(UsageError):
    """A rank did not arrive at a collective within the deadline (a launch or cluster problem)."""


def _timeout_from_env() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise ConfigError(TIMEOUT_ENV, f"must be a positive number of seconds, got {raw!r}", "e.g. 600")
    return v


def config_digest(obj: Any) -> str:
    """A stable hash of a resolved config (JSON with sorted keys)."""
    raw = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b or a[k] != b[k]:
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
    return path or "(the whole config)"


@dataclass
class World:
    rank: int = 0
    size: int = 1
    hosts: list[str] = field(default_factory=lambda: [socket.gethostname()])
    timeout_s: float = DEFAULT_TIMEOUT_S
    _comm: Any = None
    # seconds spent per collective: "wait" for the last rank to arrive, "transfer" after that
    timings: dict = field(default_factory=dict)

    def _time(self, what: str, kind: str, seconds: float) -> None:
        t = self.timings.setdefault(what, {"calls": 0, "wait_s": 0.0, "transfer_s": 0.0})
        if kind == "wait_s":
            t["calls"] += 1
        t[kind] += seconds

    # ------------------------------------------------------------------ topology
    @property
    def is_mpi(self) -> bool:
        return self._comm is not None

    @property
    def hostname(self) -> str:
        return self.hosts[self.rank]

    @property
    def nodes(self) -> list[str]:
        """Distinct hosts in order of their lowest rank."""
        return list(dict.fromkeys(self.hosts))

    @property
    def local_rank(self) -> int:
        return sum(1 for h in self.hosts[:self.rank] if h == self.hostname)

    @property
    def local_size(self) -> int:
        return self.hosts.count(self.hostname)

    def describe(self) -> dict:
        out = {"rank": self.rank, "size": self.size, "transport": "mpi" if self.is_mpi else "none",
               "nodes": len(self.nodes), "ranks_per_node": {h: self.hosts.count(h) for h in self.nodes},
               "hosts": list(self.hosts)}
        if self.is_mpi:
            out["collective_timeout_s"] = self.timeout_s
        return out

    # ------------------------------------------------------------------ bounded collectives
    def barrier(self, what: str = "barrier", timeout: float | None = None, comm: Any = None) -> float:
        """Wait until every rank arrives; returns the seconds waited.  Raises WorldTimeout at the deadline."""
        comm = comm if comm is not None else self._comm
        if comm is None:
            return 0.0
        t0 = time.perf_counter()
        deadline = t0 + (self.timeout_s if timeout is None else timeout)
        req = comm.Ibarrier()
        pause = 20e-6
        while not req.Test():
            now = time.perf_counter()
            if now > deadline:
                # The request stays pending: this process must not finalize MPI normally (abort_on_error).
                raise WorldTimeout(f"mpi ({what})", f"rank {self.rank} on {self.hostname} waited "
                                   f"{now - t0:.0f} s for ranks that never arrived (one crashed, hangs, "
                                   "cannot reach storage, or runs another command)",
                                   f"check every rank's output; raise {TIMEOUT_ENV} if the ranks are only slow")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)   # sleep, not spin: oversubscribed ranks share cores
        waited = time.perf_counter() - t0
        self._time(what, "wait_s", waited)
        return waited

    def _timed(self, what: str, call):
        t0 = time.perf_counter()
        out = call()
        self._time(what, "transfer_s", time.perf_counter() - t0)
        return out

    def gather(self, obj: Any, what: str = "gather", comm: Any = None) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        comm = comm if comm is not None else self._comm
        if comm is None:
            return [obj]
        self.barrier(what, comm=comm)
        return self._timed(what, lambda: comm.gather(obj, root=0))

    def allgather(self, obj: Any, what: str = "allgather", comm: Any = None) -> list[Any]:
        comm = comm if comm is not None else self._comm
        if comm is None:
            return [obj]
        self.barrier(what, comm=comm)
        return self._timed(what, lambda: comm.allgather(obj))

    def bcast(self, obj: Any, what: str = "bcast", comm: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank."""
        comm = comm if comm is not None else self._comm
        if comm is None:
            return obj
        self.barrier(what, comm=comm)
        return self._timed(what, lambda: comm.bcast(obj, root=0))

    def channel(self) -> Any:
        """A private communicator (collective call) for a background thread's own collectives,
        so they never interleave with the main thread's (MPI matches collectives in call order)."""
        return None if self._comm is None else self._comm.Dup()

    # ------------------------------------------------------------------ launch checks
    def agree(self, field_name: str, resolved: Any) -> str:
        """Every rank must have resolved the same config: raise (on every rank) when they differ."""
        digest = config_digest(resolved)
        if self._comm is None:
            return digest
        digests = self.allgather(digest, what=f"{field_name} agreement")
        if len(set(digests)) == 1:
            return digest
        odd = next(r for r, d in enumerate(digests) if d != digests[0])
        # Only now move the (small) configs themselves, to name the first key that differs.
        configs = self.allgather(json.loads(json.dumps(resolved, default=str)), what=f"{field_name} diff")
        key = _first_difference(configs[0], configs[odd])
        err = ConfigError(field_name, f"ranks disagree on the resolved config: rank {odd} on {self.hosts[odd]} "
                                      f"differs from rank 0 at {key!r}",
                          "launch every rank with the same command line, workload file and environment")
        err.collective = True
        raise err

    def all_ok(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn`` on every rank; if it raised a usage error on any rank, raise it on every rank."""
        problem, value, own = None, None, None
        try:
            value = fn()
        except UsageError as e:
            problem, own = str(e), e
        if self._comm is None:
            if own is not None:
                raise own
            return value  # type: ignore[return-value]
        problems = self.allgather(problem, what=what)
        bad = [(r, p) for r, p in enumerate(problems) if p]
        if not bad:
            return value  # type: ignore[return-value]
        r, p = bad[0]
        err = ConfigError(what, f"rank {r} on {self.hosts[r]}: {p}"
                          + (f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""),
                          "every rank must see the same shared paths and endpoints")
        err.collective = True
        raise err

    # ------------------------------------------------------------------ failure
    def abort(self, code: int = 2) -> None:
        """End every rank of the job now (after this rank has said why)."""
        if self._comm is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            self._comm.Abort(code)
            os._exit(code)   # Abort may return before the launcher's kill arrives


_CURRENT: World | None = None


def detect_world() -> World:
    """MPI world if this process was started by an MPI launcher; else a single rank.

    The same World is returned for the rest of the process (its hosts list took one
    collective to build).
    """
    global _CURRENT
    if _CURRENT is not None:
        return _CURRENT
    if not any(k in os.environ for k in _MPI_ENV):
        _CURRENT = World()
        return _CURRENT
    timeout = _timeout_from_env()
    try:
        from mpi4py import MPI
    except ImportError:
        from ..errors import MissingDependencyError

        err = MissingDependencyError("running under mpirun", "mpi4py", extra="mpi")
        err.collective = True   # every rank fails the same way, and none has started MPI
        raise err from None
    comm = MPI.COMM_WORLD
    w = World(rank=comm.Get_rank(), size=comm.Get_size(), timeout_s=timeout, _comm=comm)
    w.hosts = [socket.gethostname()] * w.size   # placeholders until every rank has answered
    _CURRENT = w          # set first: a timeout in the allgather below must still abort the job
    w.hosts = w.allgather(socket.gethostname(), what="start")
    return w


def current_world() -> World | None:
    """The world ``detect_world`` built in this process, if any (for the CLI's error path)."""
    return _CURRENT


def abort_on_error(err: BaseException) -> None:
    """After a rank has printed its error: end the whole job unless every rank raised it together.

    A lone failing rank that simply exited would leave the others waiting at their next
    collective until the deadline, and a rank with a pending request must not finalize MPI.
    """
    w = _CURRENT
    if w is None or not w.is_mpi or w.size == 1 or getattr(err, "collective", False):
        return
    code = err.exit_code if isinstance(err, IobenchError) else 1
    w.abort(code)


def usable_cores() -> int:
    """CPUs this process may run on (its affinity, which a batch scheduler may narrow), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not on Linux
        return os.cpu_count() or 1


def default_parallelism(items: int) -> int:
    """Writers/copiers to run when the user names none: this process's cores, at most one per item.

    Ranks on one node share its cores: under MPI each gets its share (world.local_size).
    """
    cores = usable_cores()
    w = _CURRENT
    local = w.local_size if w is not None and w.is_mpi else 1
    return max(1, min(max(1, cores // max(1, local)), items))


__all__ = ["World", "default_parallelism", "usable_cores", "WorldTimeout", "detect_world", "current_world", "abort_on_error", "config_digest",
           "TIMEOUT_ENV"]
