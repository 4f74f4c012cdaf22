"""A discrete-event model of the loader: W producers, bounded prefetch, one consumer.

Ground truth for ``iobench load`` computed another way (measurement rule 10, "ground truth", docs/design.md): given each
batch's storage/preparation time at its worker (recorded by a run, or drawn from a
distribution) and each step's compute time, the model replays the pipeline and predicts
every step's wait, hence the stall ratio, without any of the loader's code.

The pipeline, per access pattern (``SCHEDULES``):

- batch ``k`` is produced by worker ``owner[k]``; a worker produces its batches one at a
  time, in increasing ``k`` (PyTorch's index queue, webdataset's per-worker stream);
- a *gate* bounds how far ahead production runs: batch ``k`` may not pass its gate before
  batch ``k - lag`` has been *taken* by the consumer (``take``: PyTorch hands the next
  index to a worker when it returns a batch, ``lag = prefetch_factor × W``) or *released*
  after its step (``release``: a shared-memory slot ring of ``lag`` slots);
- the gate sits at the *start* of a batch (nothing is read before the index arrives) or at
  its *end* (the worker reads and prepares, then waits for a slot to write into);
- the consumer takes batch ``k`` once it is ready, computes ``compute[k]``, and moves on.
  Its wait is ``max(0, ready[k] - end of step k-1)``.

Stall ratio = Σ wait / Σ (wait + compute) over steps 1.. (step 0 excluded, as MLPerf
does), or over the steady window a replayed run recorded (``metrics.steady_window``).  The model charges nothing for hand-off (pipes, wake-ups): a
real loader's stall is at or slightly above it.
"""

from __future__ import annotations

from ..schema import STALL_RATIO
import math
import random
from dataclasses import dataclass
from typing import Sequence

GATE_ON = ("take", "release")
GATE_AT = ("start", "end")


@dataclass(frozen=True)
class Schedule:
    """How batches map to workers and how far ahead they may be produced."""

    owner: tuple[int, ...]   # worker of each batch
    lag: int                 # batch k waits for batch k - lag (taken or released)
    gate_on: str = "take"    # take | release
    gate_at: str = "start"   # start | end

    def __post_init__(self) -> None:
        if self.lag < 1:
            raise ValueError("lag must be at least 1")
        if self.gate_on not in GATE_ON or self.gate_at not in GATE_AT:
            raise ValueError(f"gate_on in {GATE_ON}, gate_at in {GATE_AT}")


def round_robin(n_batches: int, workers: int) -> tuple[int, ...]:
    return tuple(k % workers for k in range(n_batches))


def schedule_for(pattern: str, n_batches: int, workers: int, prefetch: int,
                 owner: Sequence[int] | None = None) -> Schedule:
    """The loader's schedule for an access pattern (``owner`` as recorded overrides the default deal).

    ``map`` and ``stream``: PyTorch DataLoader semantics, ``prefetch`` batches outstanding
    per worker, batches dealt round-robin, a worker starts a batch when its index arrives.
    ``block``: the shared ring of ``prefetch + 1`` slots (batch ``k`` uses slot ``k mod n``,
    free once batch ``k - n`` is released); a worker reads its block first and waits for
    the slot only to write the batch.
    """
    own = tuple(int(w) for w in owner) if owner is not None else round_robin(n_batches, workers)
    if pattern in ("map", "stream"):
        return Schedule(own, lag=prefetch * workers, gate_on="take", gate_at="start")
    if pattern == "block":
        return Schedule(own, lag=prefetch + 1, gate_on="release", gate_at="end")
    raise ValueError(f"unknown access pattern {pattern!r}")


@dataclass(frozen=True)
class SimResult:
    wait_s: tuple[float, ...]
    ready_s: tuple[float, ...]
    stall_ratio: float
    wall_s: float

    def as_dict(self) -> dict:
        return {STALL_RATIO: self.stall_ratio, "wall_s": self.wall_s, "steps": len(self.wait_s),
                "wait_s_total": sum(self.wait_s[1:])}


def simulate(schedule: Schedule, io_s: Sequence[float], compute_s: Sequence[float],
             start_s: Sequence[float] | None = None, window: tuple[int, int] | None = None) -> SimResult:
    """Replay the pipeline; ``io_s[k]`` is batch k's time at its worker, ``compute_s[k]`` step k's compute.

    ``start_s[w]``: when worker w may start (default 0, the consumer's clock start).
    ``window``: the steps ``[from, to)`` the stall is counted over (default: all but step 0).
    """
    n = len(io_s)
    if len(compute_s) < n or len(schedule.owner) < n:
        raise ValueError("need a compute time and an owner for every batch")
    workers = max(schedule.owner[:n], default=0) + 1
    free = [0.0] * workers if start_s is None else [float(start_s[w]) for w in range(workers)]
    take = [0.0] * n
    release = [0.0] * n
    ready = [0.0] * n
    wait = [0.0] * n
    gate_times = take if schedule.gate_on == "take" else release
    lag = schedule.lag
    t = 0.0  # the consumer's clock: end of the previous step
    # Batch k's gate depends on batch k - lag >= ... of the consumer, which only depends on
    # batches < k: produce k, then consume k (the consumer takes batches in order).
    for k in range(n):
        w = schedule.owner[k]
        # No gate for the first `lag` batches (not even the clock start: workers may begin before it).
        gate = gate_times[k - lag] if k >= lag else -math.inf
        if schedule.gate_at == "start":
            done = max(free[w], gate) + io_s[k]
        else:
            done = max(free[w] + io_s[k], gate)
        free[w] = done
        ready[k] = done
        take[k] = max(t, done)
        wait[k] = take[k] - t
        t = take[k] + compute_s[k]
        release[k] = t
    k0, k1 = window if window is not None else (1, n)
    total = sum(wait[k] + compute_s[k] for k in range(k0, k1))
    stall = sum(wait[k0:k1]) / total if total > 0 else 0.0
    return SimResult(wait_s=tuple(wait), ready_s=tuple(ready), stall_ratio=stall, wall_s=t)


def predict_from_run(metrics: dict, pattern: str, workers: int, prefetch: int) -> SimResult:
    """The model fed a load's recorded per-batch I/O times, owners and consumer times (``metrics.series``).

    The consumer's time per step is what it spent not waiting: the step's compute plus its
    own bookkeeping (releasing the slot, taking the next message), from the step start times.
    Workers start when they really did (they open storage at different moments, some before
    the consumer's clock starts): the ready time of a worker's first batch less its time.
    """
    s = metrics["series"]
    io = s.get("service_s") or s["io_s"]   # service_s: storage + prep (+ buffer fill) at the worker
    n = len(io)
    sch = schedule_for(pattern, n, workers, prefetch, owner=s.get("worker"))
    # the stall over the run's own steady window (iobench.loader.stability), so like is compared with like
    win = metrics.get("steady_window") or {}
    window = (win["from_step"], win["to_step"]) if win else None
    return simulate(sch, io, consumer_busy_s(s)[:n], start_s=worker_starts(s, sch, workers), window=window)


def worker_starts(series: dict, schedule: Schedule, workers: int) -> list[float] | None:
    ready = series.get("ready_s")
    if not ready or any(r is None for r in ready):
        return None
    out: list[float | None] = [None] * workers
    for k, w in enumerate(schedule.owner[:len(ready)]):
        if out[w] is None:
            out[w] = ready[k] - (series.get("service_s") or series["io_s"])[k]
    # (A first batch that waited for its gate makes this start late; the replay of that batch is the same.)
    return [0.0 if v is None else v for v in out]


def consumer_busy_s(series: dict) -> list[float]:
    """Per step: step duration − wait (the last step, whose end is not in the series: its compute)."""
    t, wait, comp = series["t_s"], series["wait_s"], series["compute_s"]
    out = [max(comp[k], t[k + 1] - t[k] - wait[k]) for k in range(len(t) - 1)]
    if comp:
        out.append(comp[len(out)])
    return out


# ---------------------------------------------------------------------------------------
# Service times drawn from a storage spec (no run needed): the model on its own.

def draw_io(spec, requests: Sequence[Sequence[int]], rng: random.Random) -> list[float]:
    """Per-batch time at the worker: for each request (its byte count), a latency draw + bytes / bandwidth.

    ``spec`` is an ``iobench.wrappers.EmulationSpec``; ``requests[k]`` lists the byte counts
    of the requests batch k's worker issues for it, one after another.
    """
    out = []
    for reqs in requests:
        out.append(sum(spec.sample_latency(rng) + spec.transfer_s(nb) for nb in reqs))
    return out


def expected_stall(schedule: Schedule, spec, requests: Sequence[Sequence[int]], compute_s: Sequence[float],
                   draws: int = 20, seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of the model's stall over ``draws`` independent draws of the storage."""
    rng = random.Random(seed)
    vals = [simulate(schedule, draw_io(spec, requests, rng), compute_s).stall_ratio for _ in range(draws)]
    mean = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / max(1, len(vals) - 1))
    return mean, sd


def bandwidth_stall(compute_s: float, batch_bytes: float, bytes_per_s: float) -> float:
    """Steady-state stall when storage bandwidth is the bottleneck: 1 − compute / (batch bytes / bandwidth).

    Producers that share one device share its bandwidth, so W and Q do not change it:
    deep prefetch hides latency, never a bandwidth deficit.  Zero when compute covers the transfer.
    """
    if bytes_per_s <= 0 or batch_bytes <= 0:
        return 0.0
    transfer = batch_bytes / bytes_per_s
    return max(0.0, 1.0 - compute_s / transfer)
