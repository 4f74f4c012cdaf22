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
        sizes = batch_sizes(count, batch_size, drop_last)
        blocks.append(Block(index=b, shards=tuple(group), order=order[:sum(sizes)], batch_sizes=sizes))
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
    return _cat([_ids(first_sample, shard_samples, b.shards)[b.order] for b in plan.blocks])


def _ids(first_sample, shard_samples, shards) -> np.ndarray:
    """The global sample indices of ``shards``, concatenated in that order."""
    return _cat([np.arange(first_sample[s], first_sample[s] + shard_samples[s]) for s in shards])


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


# ---------------------------------------------------------------------------------------
# Access patterns (``load.access``).  ``block`` is ``epoch_plan`` above.  ``map`` and
# ``stream`` follow the loaders people train with; their orders are pure functions too.

ACCESS_PATTERNS = ("map", "stream", "block", "memmap")
_MAP_STREAM = 0x4D50     # map: the one permutation of global sample indices per epoch
_BUF_STREAM = 0x4255     # stream: each worker's shuffle-buffer draws


def default_access(fmt: str) -> str:
    """What the field uses per format: indexable raw arrays and one file per sample (files, npz) → map;
    archives (tar, parquet, tfrecord) → stream."""
    return "map" if fmt in ("raw", "files", "npz") else "stream"


def order_of(access: str) -> str:
    """The pattern whose order ``access`` follows: ``memmap`` is map's order (a seeded permutation of
    the samples, batch j to worker j % W, as Megatron's GPTDataset shuffles its sample index); it
    differs in how a sample's bytes are read (sliced from a mapping, iobench.loader.memmap)."""
    return "map" if access == "memmap" else access


def batch_sizes(n: int, batch_size: int, drop_last: bool) -> tuple[int, ...]:
    full, rest = divmod(int(n), batch_size)
    return tuple([batch_size] * full + ([rest] if rest and not drop_last else []))


@dataclass(frozen=True)
class MapEpoch:
    """PyTorch map-style: a sampler's global sample indices for this rank, cut into batches.

    Batch ``j`` of the epoch goes to worker ``j % W`` (DataLoader deals batch indices
    round-robin and restarts the cycle at worker 0 each epoch).
    """

    epoch: int
    ids: np.ndarray                 # global sample indices in delivery order (this rank)
    batch_sizes: tuple[int, ...]

    @property
    def batches(self) -> int:
        return len(self.batch_sizes)


def map_indices(n_samples: int, seed: int, epoch: int, rank: int = 0, world: int = 1,
                shuffle: bool = True) -> np.ndarray:
    """One seeded permutation of all global indices per epoch, dealt ``rank::world``.

    Like ``DistributedSampler`` (seed + epoch, interleaved split) but without padding: padding
    repeats samples, and every sample is read exactly once per epoch here; ranks' counts
    differ by at most one.
    """
    order = np.arange(n_samples, dtype=np.int64)
    if shuffle:
        order = np.random.default_rng([seed, _MAP_STREAM, epoch]).permutation(n_samples).astype(np.int64)
    return order[rank::world]


def map_epoch(n_samples: int, batch_size: int, seed: int, epoch: int, rank: int = 0, world: int = 1,
              shuffle: bool = True, drop_last: bool = False) -> MapEpoch:
    ids = map_indices(n_samples, seed, epoch, rank, world, shuffle)
    sizes = batch_sizes(len(ids), batch_size, drop_last)
    return MapEpoch(epoch=epoch, ids=ids[:sum(sizes)], batch_sizes=sizes)


def buffer_shuffle(n: int, buffer: int, rng: np.random.Generator | None) -> tuple[np.ndarray, int]:
    """(output order, fill) of webdataset's shuffle buffer over a stream of ``n`` samples.

    Each incoming sample is appended; once the buffer holds ``buffer`` samples, a uniformly
    chosen one leaves (swapped to the end and popped): fill, then one out per one in; at the
    end of the stream the rest leave the same way.  Output ``j`` needs ``min(n, fill + j)``
    samples read in (``fill`` = the buffer size; 1 without shuffling).
    """
    if rng is None or buffer <= 1:
        return np.arange(n, dtype=np.int64), 1
    out = np.empty(n, dtype=np.int64)
    u = rng.random(n)
    # While the buffer is full, appending i, swapping slot k with the end and popping is: out = buf[k],
    # buf[k] = i (out = i when k is the end).  The slots k are known up front (the buffer then holds
    # ``buffer`` samples), so each output is the sample the previous step with the same slot wrote
    # there (slot k starts with sample k): one stable sort by slot instead of a Python step per
    # sample (a million samples: ~0.1 s instead of ~2 s), the same order.
    last = buffer - 1
    steady = max(0, n - last)
    ks = (u[:steady] * buffer).astype(np.int64)
    out[:steady] = np.arange(last, last + steady)           # k == last: the incoming sample leaves
    steps = np.flatnonzero(ks != last)
    by_slot = np.argsort(ks[steps], kind="stable")
    sk, so = ks[steps][by_slot], steps[by_slot]             # grouped by slot, each group in step order
    first = np.ones(len(sk), dtype=bool)
    first[1:] = sk[1:] != sk[:-1]
    wrote = np.empty_like(so)
    wrote[1:] = so[:-1] + last                             # the sample the previous step put in the slot
    out[so] = np.where(first, sk, wrote)
    slots = np.arange(min(n, last), dtype=np.int64)        # what the buffer holds when the stream ends
    final = np.ones(len(sk), dtype=bool)
    final[:-1] = sk[1:] != sk[:-1]
    slots[sk[final]] = so[final] + last
    buf: list[int] = slots.tolist()
    o = steady
    while buf:
        k = int(u[o] * len(buf))
        buf[k], buf[-1] = buf[-1], buf[k]
        out[o] = buf.pop()
        o += 1
    return out, int(buffer)


@dataclass(frozen=True)
class StreamWorker:
    """One worker's part of a streaming epoch: its shards in order, its buffer's output order."""

    worker: int
    shards: tuple[int, ...]         # manifest shard indices, read in this order
    order: np.ndarray               # positions in the worker's concatenated stream, in output order
    fill: int                       # samples read in before the first one leaves
    batch_sizes: tuple[int, ...]
    n: int = 0                      # samples in the worker's stream (all read, even with drop_last)

    def need(self, j: int) -> int:
        """Samples read in before output ``j`` can leave the buffer."""
        return min(self.n, self.fill + j) if self.fill > 1 else j + 1


@dataclass(frozen=True)
class StreamEpoch:
    """webdataset / tf.data streaming on one rank: ``sequence[k] = (worker, its batch r)``."""

    epoch: int
    workers: tuple[StreamWorker, ...]
    sequence: np.ndarray            # (batches, 2): which worker's which batch the consumer gets k-th

    @property
    def batches(self) -> int:
        return int(len(self.sequence))


def stream_epoch(shard_samples: list[int] | tuple[int, ...], batch_size: int, seed: int, epoch: int,
                 rank: int = 0, world: int = 1, workers: int = 1, shuffle_buffer: int = 1000,
                 shuffle: bool = True, drop_last: bool = False) -> StreamEpoch:
    """Shards dealt to ranks (``rank::world``) then to workers (``worker::W``), as
    ``split_by_node`` / ``split_by_worker`` do; each worker streams its shards in order through
    its own shuffle buffer and cuts batches as samples leave (a short last batch per worker
    unless ``drop_last``).  The consumer takes the workers' batches round-robin, skipping
    workers that have run dry (DataLoader over an IterableDataset).  The order depends on
    W and the buffer size as well as (seed, epoch, rank, world) — as it does in those loaders.
    """
    mine = shard_order(len(shard_samples), seed, epoch, rank, world, shuffle)
    plans = []
    for w in range(workers):
        shards = tuple(int(s) for s in mine[w::workers])
        n = sum(int(shard_samples[s]) for s in shards)
        rng = np.random.default_rng([seed, _BUF_STREAM, epoch, rank, w]) if shuffle and shuffle_buffer > 1 else None
        order, fill = buffer_shuffle(n, shuffle_buffer, rng)
        sizes = batch_sizes(n, batch_size, drop_last)
        plans.append(StreamWorker(worker=w, shards=shards, order=order[:sum(sizes)], fill=fill, batch_sizes=sizes,
                                 n=n))
    rounds = max((len(w.batch_sizes) for w in plans), default=0)
    seq = [(w.worker, r) for r in range(rounds) for w in plans if r < len(w.batch_sizes)]
    return StreamEpoch(epoch=epoch, workers=tuple(plans),
                       sequence=np.array(seq, dtype=np.int64).reshape(-1, 2))


def delivery_order(access: str, shard_samples: list[int] | tuple[int, ...], batch_size: int, seed: int, epoch: int,
                   rank: int = 0, world: int = 1, workers: int = 1, shuffle_buffer: int = 1000,
                   shuffle: bool = True, drop_last: bool = False) -> np.ndarray:
    """Global sample indices in the order the consumer receives them, for any access pattern."""
    first = np.concatenate([[0], np.cumsum(shard_samples)]).astype(np.int64)
    access = order_of(access)
    if access == "map":
        return map_epoch(int(first[-1]), batch_size, seed, epoch, rank, world, shuffle, drop_last).ids
    if access == "block":
        return sample_order(shard_samples, first[:-1].tolist(), batch_size, seed, epoch, rank, world,
                            shuffle_buffer, shuffle)
    ep = stream_epoch(shard_samples, batch_size, seed, epoch, rank, world, workers, shuffle_buffer, shuffle, drop_last)
    # each worker's batches, in its buffer's output order; the consumer takes them as ``sequence`` says
    cut = [np.split(_ids(first, shard_samples, wp.shards)[wp.order], np.cumsum(wp.batch_sizes)[:-1])
           for wp in ep.workers]
    return _cat([cut[w][r] for w, r in ep.sequence])
