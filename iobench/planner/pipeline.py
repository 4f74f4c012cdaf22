"""Data-pipeline models (seed chapter 4, Eq. 4.1–4.3)."""

from __future__ import annotations

import math
from dataclasses import dataclass


def required_bandwidth(n_accelerators: int, eta_target: float, batch_bytes: float, step_s: float) -> float:
    """Eq. 4.1: bytes/s the pipeline must deliver so N accelerators reach utilization η."""
    return n_accelerators * eta_target * batch_bytes / step_s


@dataclass(frozen=True)
class StallModel:
    step_s: float
    stall_ratio: float


def data_stall(compute_s: float, io_s: float, pipelined: bool) -> StallModel:
    """Eq. 4.2: serial T_step = compute + io; pipelined T_step = max(compute, io)."""
    step = max(compute_s, io_s) if pipelined else compute_s + io_s
    return StallModel(step_s=step, stall_ratio=(step - compute_s) / step if step > 0 else 0.0)


@dataclass(frozen=True)
class PrefetchPlan:
    depth_min: int             # ceil(P99 I/O / compute), at least 1
    depth_recommended: int     # depth_min plus the safety margin
    host_bytes_per_consumer: float
    host_bytes_total: float


def prefetch_depth(p99_io_s: float, compute_s: float, batch_bytes: float = 0.0, consumers: int = 1,
                   margin: int = 2) -> PrefetchPlan:
    """Eq. 4.3: Q_min = ceil(P99 I/O time / compute time); memory = depth × batch bytes × consumers."""
    if compute_s <= 0:
        raise ValueError("compute time must be positive to size a prefetch queue")
    # A hair of tolerance so that 0.4000000001 / 0.2 does not round up to 3.
    q = max(1, math.ceil(p99_io_s / compute_s - 1e-9))
    rec = q + max(0, margin)
    per = rec * batch_bytes
    return PrefetchPlan(depth_min=q, depth_recommended=rec, host_bytes_per_consumer=per,
                        host_bytes_total=per * consumers)
