"""Checkpoint models: size from a state spec, storms, staging, async commit, interval, retention, SSD wear.

Pure functions in SI units (bytes, seconds, bytes/s, rates in 1/s).  The optimal interval
is the first-order Young/Daly result τ* = √(2c/λ) with the overhead
L(τ) = c/τ + λ(τ/2 + r); loss spikes that force a rollback add their rate to λ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Recipe names (bf16-mixed-adam, fp16-adam, ...) live in one place, the checkpoint engine's
# ``iobench.checkpointing.state.RECIPES``: the planner's params= path and its preset path
# read the same table, so a name means the same bytes per parameter everywhere.


def bytes_per_param(weights: float = 2, master: float = 4, optimizer: float = 8, grads: float = 0) -> float:
    """Bytes each parameter contributes to a checkpoint (defaults: BF16 weights, FP32 master, Adam m+v)."""
    return weights + master + optimizer + grads


def checkpoint_size(params: float, bytes_per_param_: float = 14.0) -> float:
    """Checkpoint bytes = parameters × bytes per parameter."""
    return params * bytes_per_param_


def zero_rank_bytes(params: float, ranks: int, stage: int, weights: float = 2, grads: float = 2,
                    optimizer: float = 12) -> float:
    """Per-rank training state under ZeRO stage 0–3 (stage k shards optimizer, then grads, then weights)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError("ZeRO stage must be 0, 1, 2 or 3")
    parts = (optimizer, grads, weights)   # sharded in this order as the stage grows
    total = 0.0
    for i, b in enumerate(parts):
        total += params * b / ranks if stage > i else params * b
    return total


@dataclass(frozen=True)
class Storm:
    total_bytes: float
    bytes_per_replica: float
    write_s: float


def checkpoint_storm(state_bytes: float, replicas: int, fabric_bytes_per_s: float, sharded: bool) -> Storm:
    """Every replica writes its full copy (replicated) or 1/R of it (sharded, e.g. ZeRO-3)."""
    per = state_bytes / replicas if sharded else state_bytes
    total = per * replicas
    return Storm(total, per, total / fabric_bytes_per_s)


@dataclass(frozen=True)
class StagedCheckpoint:
    shard_bytes: float               # per node
    local_write_s: float             # the pause training sees
    pfs_total_bytes: float
    pfs_drain_s: float               # background copy to the parallel file system
    pfs_bytes_per_s_per_node: float
    pause_overhead: float            # local write time / interval


def staged_checkpoint(ckpt_bytes: float, nodes: int, local_bytes_per_s: float, pfs_bytes_per_s: float,
                      interval_s: float) -> StagedCheckpoint:
    """Write each node's shard to local NVMe (blocking), then drain to the PFS in the background."""
    shard = ckpt_bytes / nodes
    t_local = shard / local_bytes_per_s
    return StagedCheckpoint(shard, t_local, shard * nodes, shard * nodes / pfs_bytes_per_s,
                            pfs_bytes_per_s / nodes, t_local / interval_s)


def write_time(nbytes: float, bytes_per_s: float) -> float:
    """Seconds to write ``nbytes`` at a bandwidth: the checkpoint cost c when the save blocks."""
    return nbytes / bytes_per_s


def pause_steps(write_s: float, step_s: float) -> float:
    """Training steps lost to a blocking checkpoint write."""
    return write_s / step_s


def average_write_rate(ckpt_bytes: float, interval_s: float) -> float:
    return ckpt_bytes / interval_s


@dataclass(frozen=True)
class Backlog:
    write_s: float
    demand_bytes_per_s: float      # checkpoint bytes per interval
    backlog: bool                  # commits fall behind: the queue grows without bound
    utilization: float             # demand / bandwidth


def async_backlog(ckpt_bytes: float, bytes_per_s: float, interval_s: float) -> Backlog:
    demand = ckpt_bytes / interval_s
    return Backlog(ckpt_bytes / bytes_per_s, demand, demand > bytes_per_s, demand / bytes_per_s)


@dataclass(frozen=True)
class CommitTimeline:
    snapshots_s: tuple[float, ...]
    commits_s: tuple[float, ...]          # when each snapshot's commit completes (commits are serial)
    recoverable_snapshot_s: float | None  # newest snapshot committed before the failure
    redo_s: float                         # work redone after the failure
    foreground_pause_s: float


def commit_timeline(ckpt_bytes: float, bytes_per_s: float, snapshots_s, copy_s: float, fail_s: float
                    ) -> CommitTimeline:
    """Async commit: snapshot (copy, blocking) then a serial background write; a failure at
    ``fail_s`` recovers the newest snapshot whose commit had completed, not the newest taken."""
    write = ckpt_bytes / bytes_per_s
    commits, busy_until = [], 0.0
    for t in snapshots_s:
        start = max(t + copy_s, busy_until)
        busy_until = start + write
        commits.append(busy_until)
    done = [t for t, c in zip(snapshots_s, commits) if c <= fail_s and t <= fail_s]
    rec = max(done) if done else None
    paused = copy_s * sum(1 for t in snapshots_s if t <= fail_s)
    return CommitTimeline(tuple(snapshots_s), tuple(commits), rec, fail_s - (rec or 0.0), paused)


def failure_rate(job_mtbf_s: float | None = None, per_accelerator_mtbf_s: float | None = None,
                 accelerators: int = 1, spike_rate: float = 0.0) -> float:
    """λ in failures per second: from the job's MTBF, or accelerators / per-accelerator MTBF;
    rollbacks for loss spikes add ``spike_rate``."""
    if job_mtbf_s:
        lam = 1.0 / job_mtbf_s
    elif per_accelerator_mtbf_s:
        lam = accelerators / per_accelerator_mtbf_s
    else:
        raise ValueError("give job_mtbf_s or per_accelerator_mtbf_s")
    return lam + spike_rate


def per_accelerator_mtbf(job_mtbf_s: float, accelerators: int) -> float:
    """A job of N accelerators fails N times as often as one of them."""
    return job_mtbf_s * accelerators


def optimal_interval(cost_s: float, rate: float) -> float:
    """First-order (Young/Daly) τ* = √(2c/λ); the recovery time r does not enter."""
    return math.sqrt(2 * cost_s / rate)


@dataclass(frozen=True)
class Overhead:
    interval_s: float
    save: float        # c/τ
    redo: float        # λτ/2: half an interval of lost work per failure
    recover: float     # λr
    total: float


def checkpoint_overhead(cost_s: float, rate: float, recovery_s: float, interval_s: float) -> Overhead:
    """L(τ) = c/τ + λτ/2 + λr, as fractions of wall time."""
    save, redo, rec = cost_s / interval_s, rate * interval_s / 2, rate * recovery_s
    return Overhead(interval_s, save, redo, rec, save + redo + rec)


def overhead_table(cost_s: float, rate: float, recovery_s: float, intervals_s) -> list[Overhead]:
    return [checkpoint_overhead(cost_s, rate, recovery_s, t) for t in intervals_s]


def poisson_optimal_interval(cost_s: float, rate: float) -> float:
    """τ* minimising (e^{λ(τ+c)} − 1)/τ: failures may also strike during the save."""
    # d/dτ = 0  ⇔  g(τ) = λτ·e^{λ(τ+c)} − e^{λ(τ+c)} + 1 = 0; g < 0 near 0 and grows, so bisect.
    def g(t: float) -> float:
        e = math.exp(rate * (t + cost_s))
        return rate * t * e - e + 1

    lo, hi = 1e-12, max(1.0, optimal_interval(cost_s, rate))
    while g(hi) < 0:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if g(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Completion:
    base_s: float          # iterations × step time
    finish_s: float        # start offset + base × (1 + L)


def completion_time(iterations: int, step_s: float, overhead: float, start_s: float = 0.0) -> Completion:
    base = iterations * step_s
    return Completion(base, start_s + base * (1 + overhead))


def step_budget(train_s: float, iterations: int, overhead: float) -> float:
    """The longest step that still finishes ``iterations`` within ``train_s`` with checkpoint overhead L."""
    return train_s / (iterations * (1 + overhead))


@dataclass(frozen=True)
class Retention:
    checkpoints: int
    total_written_bytes: float
    footprint_bytes: float          # the newest keep_last checkpoints on the fast tier
    archived: int
    archive_bytes: float
    written_to_data_ratio: float | None


def retention(run_s: float, interval_s: float, ckpt_bytes: float, keep_last: int, archive_every: int = 0,
              archive_extra_bytes: float = 0.0, epoch_bytes: float | None = None) -> Retention:
    """What a run writes in checkpoints, what a keep-last-K policy holds, and what an archive keeps."""
    n = int(math.floor(run_s / interval_s + 1e-9))   # one per *completed* interval: a partial one writes none
    archived = n // archive_every if archive_every else 0
    total = n * ckpt_bytes
    return Retention(n, total, min(keep_last, n) * ckpt_bytes, archived, archived * ckpt_bytes + archive_extra_bytes,
                     total / epoch_bytes if epoch_bytes else None)


@dataclass(frozen=True)
class Endurance:
    daily_budget_bytes: float          # capacity × DWPD
    lifetime_bytes: float
    checkpoint_bytes_per_day: float
    fraction_of_budget: float
    lifetime_years_at_checkpoint_rate: float


def ssd_endurance(capacity_bytes: float, dwpd: float, warranty_years: float, bytes_per_checkpoint: float,
                  interval_s: float) -> Endurance:
    """How much of an SSD's rated write endurance local checkpoints consume."""
    daily = capacity_bytes * dwpd
    lifetime = daily * 365 * warranty_years
    per_day = bytes_per_checkpoint * 86400 / interval_s
    return Endurance(daily, lifetime, per_day, per_day / daily, lifetime / per_day / 365 if per_day else math.inf)
