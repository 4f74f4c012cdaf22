"""MLPerf's step: the accelerator's sleep, then a barrier across every simulated accelerator.

DLIO (argonne-lcf/dlio_benchmark@mlperf_storage_v2.0, ``dlio_benchmark/main.py`` ``_train``) calls
``comm.barrier()`` after every step, "the barrier to simulate allreduce"; Submission_guidelines.md §9:
"a pool-wide common barrier to synchronize the transition from one step to the next".  So one
accelerator whose batch is late holds every other one back, as data-parallel training does.

The loader runs the step as a :class:`iobench.loader.compute.StepCallback` named ``STEP`` here;
each accelerator process arms it (:func:`arm`) with its step time and the node's barrier before
its loader starts.  The barrier's time is idle accelerator time: AU counts only the sleep.

``group``: a TFRecord workload's batch is cut from ``read_threads`` files read in parallel
(tf.data ``TFRecordDataset(num_parallel_reads=read_threads)`` then ``batch``: DLIO
``reader/tf_reader.py``), so one MLPerf step takes ``batch / read_threads`` samples from each
reader.  The loader then delivers one piece per worker, round-robin, and the accelerator's step
(sleep, barrier) runs on the last piece of each group of ``group`` loader steps.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..loader.compute import StepCallback, sleep_until

BARRIER_TIMEOUT_S = 600.0     # an accelerator that died must not hang the others for ever


class SyncedStep(StepCallback):
    def __init__(self) -> None:
        self.compute_s = 0.0
        self.barrier: Any = None        # multiprocessing Barrier shared by the node's accelerators
        self.group = 1                  # loader steps per MLPerf step
        self.sleep_s: list[float] = []  # per MLPerf step: measured sleeps (an overloaded host oversleeps)
        self.barrier_s: list[float] = []

    def arm(self, compute_s: float, barrier, group: int = 1) -> None:
        self.compute_s, self.barrier, self.group = float(compute_s), barrier, max(1, int(group))
        self.sleep_s, self.barrier_s = [], []

    def __call__(self, batch: Any, step: int, idle: Callable[[float], Any] | None = None) -> None:
        if (step + 1) % self.group:
            return                      # a piece of the step's batch: the step runs on the group's last
        t0 = time.perf_counter_ns()
        sleep_until(t0 + int(self.compute_s * 1e9), idle)
        t1 = time.perf_counter_ns()
        if self.barrier is not None:
            try:
                self.barrier.wait(timeout=BARRIER_TIMEOUT_S)
            except threading.BrokenBarrierError:
                raise RuntimeError("the step barrier broke: another simulated accelerator stopped") from None
        t2 = time.perf_counter_ns()
        self.sleep_s.append((t1 - t0) / 1e9)
        self.barrier_s.append((t2 - t1) / 1e9)


STEP = SyncedStep()
CALLBACK = f"{__name__}:STEP"


def arm(compute_s: float, barrier, group: int = 1) -> None:
    STEP.arm(compute_s, barrier, group)
