"""Sample order as a pure function of (seed, epoch, rank, world): no state, no global RNG.

Order = shard-level shuffle, then a sample shuffle inside *blocks*: consecutive shards of
the shuffled order grouped until a block holds at least ``shuffle_buffer`` samples.  A
block is the unit of work a loader worker reads (each shard exactly once per epoch) and
cuts into batches, so the delivered order does not depend on how many workers there are.
Shuffling a whole block is a full shuffle of a window at least as large as the buffer,
i.e. at least as strong as a streaming shuffle buffer of that size.  Batches never span
blocks: a block's last batch may be short.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_SHARD_STREAM = 0x5348   # keeps the shard and sample random streams of one seed apart
_SAMPLE_STREAM = 0x534D


@dataclass(frozen=True)
class Block:
    index: int                      # position within the epoch, for this rank
    shards: tuple[int, ...]         # manifest shard indices, in read order
    order: np.ndarray               # permutation of positions in the block's concatenated samples
    batch_sizes: tuple[int, ...]    # the block's samples cut into batches, in order

    @property
    def samples(self) -> int:
        return int(len(self.order))


@dataclass(frozen=True)
class EpochPlan:
    epoch: int
    blocks: tuple[Block, ...]

    @property
    def batches(self) -> int:
        return sum(len(b.batch_sizes) for b in self.blocks)

    @property
    def samples(self) -> int:
        return sum(b.samples for b in self.blocks)


def shard_order(n_shards: int, seed: int, epoch: int, rank: int = 0, world: int = 1,
                shuffle: bool = True) -> np.ndarray:
    """This rank's shards for the epoch: one seeded permutation, dealt round-robin to ranks."""
    order = np.arange(n_shards)
    if shuffle:
        order = np.random.default_rng([seed, _SHARD_STREAM, epoch]).permutation(n_shards)
    return order[rank::world]


def epoch_plan(shard_samples: list[int] | tuple[int, ...], batch_size: int, seed: int, epoch: int,
               rank: int = 0, world: int = 1, shuffle_buffer: int = 1000, shuffle: bool = True,
               drop_last: bool = False) -> EpochPlan:
    """The blocks, per-block sample permutations and batch cuts of one epoch on one rank."""
    if batch_size <= 0:
        raise ValueError("batch_size must be positive")
    blocks: list[Block] = []
    group: list[int] = []
    count = 0
    want = max(1, int(shuffle_buffer)) if shuffle else 1

    def close() -> None:
        nonlocal group, count
        if not group:
            return
        b = len(blocks)
        if shuffle and shuffle_buffer > 0:
            order = np.random.default_rng([seed, _SAMPLE_STREAM, epoch, rank, b]).permutation(count)
        else:
            order = np.arange(count)
        full, rest = divmod(count, batch_size)
        sizes = [batch_size] * full + ([rest] if rest and not drop_last else [])
        if drop_last and rest:
            order = order[: full * batch_size]
        blocks.append(Block(index=b, shards=tuple(group), order=order, batch_sizes=tuple(sizes)))
        group, count = [], 0

    for s in shard_order(len(shard_samples), seed, epoch, rank, world, shuffle):
        group.append(int(s))
        count += int(shard_samples[s])
        if count >= want:
            close()
    close()
    return EpochPlan(epoch=epoch, blocks=tuple(blocks))


def sample_order(shard_samples: list[int] | tuple[int, ...], first_sample: list[int] | tuple[int, ...],
                 batch_size: int, seed: int, epoch: int, rank: int = 0, world: int = 1,
                 shuffle_buffer: int = 1000, shuffle: bool = True) -> np.ndarray:
    """Global sample indices in delivery order (what the loader hands the consumer)."""
    plan = epoch_plan(shard_samples, batch_size, seed, epoch, rank, world, shuffle_buffer, shuffle)
    out = []
    for b in plan.blocks:
        ids = np.concatenate([np.arange(first_sample[s], first_sample[s] + shard_samples[s]) for s in b.shards])
        out.append(ids[b.order])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
