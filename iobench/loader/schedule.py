"""Which batches one load makes, in what order, and which worker makes each (per access pattern).

A ``Schedule`` is built once in the parent from the manifest's shard sizes and the config
(pure: sampler functions of seed, epoch, rank, world — and W for ``stream``) and handed to
every worker, so that the consumer and the workers agree on batch ``k`` without talking.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bounds import memory_cap
from ..errors import ConfigError
from ..formats import get_format
from ..units import format_bytes
from .sampler import default_access, epoch_plan, map_epoch, order_of, stream_epoch

_MAX_EPOCHS = 100_000


@dataclass(frozen=True)
class Schedule:
    access: str
    plans: tuple                # per epoch: EpochPlan (block) | MapEpoch (map) | StreamEpoch (stream)
    total: int                  # batches the run makes
    owner: np.ndarray           # owner[k]: the worker that makes batch k
    shards: tuple[int, ...]     # manifest shards this rank reads

    @property
    def epochs(self) -> int:
        return len(self.plans)


def has_sample_ranges(manifest) -> bool:
    """Whether samples can be read by byte range (the map pattern): not in a zstd-compressed shard."""
    sh = manifest.shards[0] if manifest.shards else None
    return sh is None or not sh.samples or get_format(manifest.format).reader(manifest).sample_range(sh, 0) is not None


def resolve_access(access: str, fmt: str, manifest=None) -> str:
    """``auto``: the format's default; a map-default dataset without per-sample ranges streams instead.
    (``LoadConfig`` refused any other name than ``auto`` and ``ACCESS_PATTERNS``.)"""
    if access == "auto":
        d = default_access(fmt)
        return "stream" if d == "map" and manifest is not None and not has_sample_ranges(manifest) else d
    return access


def _epoch(cfg, access: str, shard_samples: list[int], epoch: int, rank: int, world: int):
    if access == "map":
        return map_epoch(sum(shard_samples), cfg.batch_size, cfg.seed, epoch, rank, world, cfg.shuffle, cfg.drop_last)
    if access == "stream":
        return stream_epoch(shard_samples, cfg.batch_size, cfg.seed, epoch, rank, world, max(1, cfg.workers),
                            cfg.shuffle_buffer, cfg.shuffle, cfg.drop_last)
    return epoch_plan(shard_samples, cfg.batch_size, cfg.seed, epoch, rank, world, cfg.shuffle_buffer,
                      cfg.shuffle, cfg.drop_last)


def _owners(access: str, plan, workers: int) -> np.ndarray:
    if access == "map":
        return np.arange(plan.batches, dtype=np.int32) % workers
    if access == "stream":
        return plan.sequence[:, 0].astype(np.int32)
    return np.concatenate([np.full(len(b.batch_sizes), b.index % workers, dtype=np.int32) for b in plan.blocks]) \
        if plan.blocks else np.zeros(0, dtype=np.int32)


def _shards(access: str, plan, starts: np.ndarray) -> set[int]:
    if access == "map":
        return set((np.searchsorted(starts, plan.ids, side="right") - 1).tolist())
    if access == "stream":
        return {s for w in plan.workers for s in w.shards}
    return {s for b in plan.blocks for s in b.shards}


def _check_schedule_fits(cfg, batches_per_epoch: int) -> None:
    """Refuse, from the first epoch's batch count, a schedule over ``_MAX_EPOCHS`` epochs or larger than
    memory (each scheduled sample holds an 8-byte id): ``--set load.steps=1e15`` once planned epoch
    after epoch for seconds (hours on a large dataset) before it was refused."""
    field = "load.steps" if cfg.steps else "load.epochs"
    epochs = -(-cfg.steps // batches_per_epoch) if cfg.steps else cfg.epochs
    if epochs > _MAX_EPOCHS:
        what = f"{cfg.steps} steps need {epochs} epochs" if cfg.steps else f"{epochs} epochs"
        raise ConfigError(field, f"{what}: more than {_MAX_EPOCHS}", "ask for fewer steps or epochs")
    need = epochs * batches_per_epoch * (8 * max(1, cfg.batch_size) + 4)
    if need > memory_cap() // 4:
        raise ConfigError(field, f"its schedule would take {format_bytes(need)} of memory, over a quarter of "
                          "this host's", "ask for fewer steps or epochs")


def build_schedule(cfg, manifest, rank: int = 0, world: int = 1) -> Schedule:
    """The epochs needed for ``cfg.steps`` (or ``cfg.epochs``), the batch count and the batch owners."""
    access = resolve_access(cfg.access, manifest.format, manifest)
    shard_samples = [s.samples for s in manifest.shards]
    starts = np.array([s.first_sample for s in manifest.shards], dtype=np.int64)
    order = order_of(access)   # memmap: map's order
    plans, owners = [], []
    shards: set[int] = set()
    total = epoch = 0
    while True:
        p = _epoch(cfg, order, shard_samples, epoch, rank, world)
        if p.batches == 0:
            raise ConfigError("load.batch_size", f"no full batch of {cfg.batch_size} on rank {rank}",
                              "lower --batch-size or drop --drop-last")
        if epoch == 0:
            _check_schedule_fits(cfg, p.batches)
        plans.append(p)
        owners.append(_owners(order, p, max(1, cfg.workers)))   # W=0: the consumer is the one producer
        shards |= _shards(order, p, starts)
        total += p.batches
        epoch += 1
        if cfg.steps and total >= cfg.steps:
            total = cfg.steps
            break
        if not cfg.steps and epoch >= cfg.epochs:
            break
        if epoch >= _MAX_EPOCHS:
            raise ConfigError("load.steps", f"{cfg.steps} steps need over {epoch} epochs", "ask for fewer steps")
    owner = np.concatenate(owners)[:total]
    return Schedule(access=access, plans=tuple(plans), total=total, owner=owner, shards=tuple(sorted(shards)))
