"""Recovery exposure and checkpoint-cost models (seed ch. 4), as pure functions.

The recovery point after a failure at time t is the newest save whose *commit* (durable
manifest) happened at or before t — not the newest snapshot.  The work redone is t minus
that save's snapshot time.  ``recovery_at`` applies this to a measured timeline;
the closed forms below reproduce the seed's worked examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence


def write_time_s(size_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """T_write = S / BW."""
    return size_bytes / bandwidth_bytes_per_s


def demand_bytes_per_s(size_bytes: float, interval_s: float) -> float:
    """Bandwidth an async committer needs to keep up: S / interval."""
    return size_bytes / interval_s


def has_backlog(size_bytes: float, bandwidth_bytes_per_s: float, interval_s: float) -> bool:
    """The commit queue grows without bound when S / interval exceeds the durable bandwidth."""
    return demand_bytes_per_s(size_bytes, interval_s) > bandwidth_bytes_per_s


def commit_times(snap_times: Sequence[float], copy_s: float, size_bytes: float, bandwidth: float) -> list[float]:
    """commit_i = t_i + copy + S/BW, each upload starting when the previous one ends (serial committer)."""
    out, free_at = [], -math.inf
    for t in snap_times:
        start = max(t + copy_s, free_at)
        free_at = start + size_bytes / bandwidth
        out.append(free_at)
    return out


@dataclass(frozen=True)
class Recovery:
    t_fail: float
    step: int | None          # recoverable step (None: nothing committed yet)
    snapshot_time: float | None
    redo_s: float             # work lost: t_fail - snapshot time of the recovered step (or t_fail)


def recovery_at(timeline: Iterable[tuple[int, float, float | None]], t_fail: float, t_start: float = 0.0) -> Recovery:
    """timeline: (step, snapshot time, commit time or None); the recovery point for a failure at t_fail."""
    best = None
    for step, t_snap, t_commit in timeline:
        if t_commit is not None and t_commit <= t_fail and (best is None or t_snap > best[1]):
            best = (step, t_snap)
    if best is None:
        return Recovery(t_fail, None, None, t_fail - t_start)
    return Recovery(t_fail, best[0], best[1], t_fail - best[1])


def young_daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """τ* = sqrt(2 c / λ) with λ = 1 / MTBF (first order)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


@dataclass(frozen=True)
class Overhead:
    save: float      # c / τ
    redo: float      # λ τ / 2
    recover: float   # λ r
    total: float


def overhead(checkpoint_s: float, interval_s: float, failure_rate_per_s: float, restart_s: float) -> Overhead:
    """L(τ) = c/τ + λτ/2 + λr, as fractions of wall time."""
    save = checkpoint_s / interval_s
    redo = failure_rate_per_s * interval_s / 2.0
    rec = failure_rate_per_s * restart_s
    return Overhead(save, redo, rec, save + redo + rec)


def storm_write_s(replicas: int, per_replica_bytes: float, fabric_bytes_per_s: float, zero3: bool = False) -> float:
    """Checkpoint storm: R × per-replica state / BW; with ZeRO-3 the replicas write one copy between them."""
    total = per_replica_bytes if zero3 else replicas * per_replica_bytes
    return total / fabric_bytes_per_s


@dataclass(frozen=True)
class Staged:
    shard_bytes: float
    local_write_s: float
    durable_total_bytes: float
    durable_write_s: float
    durable_bw_per_node: float
    pause_fraction: float


def staged_checkpoint(total_bytes: float, nodes: int, local_bw: float, durable_bw: float, interval_s: float) -> Staged:
    """Two-phase staging: each node writes its shard locally (the exposed pause), then copies it out."""
    shard = total_bytes / nodes
    t_local = shard / local_bw
    return Staged(shard, t_local, shard * nodes, shard * nodes / durable_bw, durable_bw / nodes, t_local / interval_s)
