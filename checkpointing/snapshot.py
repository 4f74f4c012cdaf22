"""Live training state (numpy stand-ins for accelerator tensors) and the staging snapshot.

The snapshot copies every live tensor into one preallocated host buffer per rank; that copy
is the blocking pause a training step pays.  The buffers are allocated once and reused by
every save, so memory stays flat across saves.  With torch or cupy present the buffers
would be pinned; here they are plain (page-aligned) host memory, and results say so.
"""

from __future__ import annotations

import numpy as np

from iobench.metrics import now_ns

from .state import DTYPES, Shard, StateSpec, shards_of_rank


def local_ranks(spec: StateSpec, world_rank: int = 0, world_size: int = 1) -> list[int]:
    """The checkpoint ranks this process emulates: every world_size-th one."""
    return [r for r in range(spec.ranks) if r % world_size == world_rank]


def _aligned_empty(nbytes: int, align: int = 4096) -> np.ndarray:
    raw = np.empty(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes]


def shard_array(buf: np.ndarray, offset: int, shard: Shard) -> np.ndarray:
    """A typed view of ``shard`` inside a flat uint8 buffer."""
    dt = np.dtype(DTYPES[shard.dtype][0])
    return buf[offset:offset + shard.nbytes].view(dt).reshape(shard.shape)


class LiveState:
    """Per rank, one array per shard: what the training job holds between saves."""

    def __init__(self, spec: StateSpec, ranks: list[int]):
        self.spec = spec
        self.ranks = list(ranks)
        self.shards = {r: shards_of_rank(spec, r) for r in self.ranks}
        self.arrays: dict[int, list[np.ndarray]] = {}
        for r in self.ranks:
            self.arrays[r] = [np.zeros(s.shape, dtype=DTYPES[s.dtype][0]) for s in self.shards[r]]
        # flat byte views of the same memory, made once: the snapshot copies through them
        self.flat = {r: [a.reshape(-1).view(np.uint8) for a in self.arrays[r]] for r in self.ranks}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for arrs in self.arrays.values() for a in arrs)

    def fill(self, seed: int, step: int) -> None:
        """Deterministic contents for (seed, step): tests regenerate them to check restores."""
        for r in self.ranks:
            for i, a in enumerate(self.arrays[r]):
                a.view(np.uint8).reshape(-1)[:] = expected_bytes(seed, step, r, i, a.nbytes)

    def touch(self, step: int) -> None:
        """A cheap change per training step (the first bytes of each tensor), like an optimizer update."""
        for arrs in self.arrays.values():
            for a in arrs:
                flat = a.view(np.uint8).reshape(-1)
                flat[:8] = np.frombuffer(int(step).to_bytes(8, "little"), dtype=np.uint8)[: flat.size]


def expected_bytes(seed: int, step: int, rank: int, index: int, nbytes: int) -> np.ndarray:
    rng = np.random.default_rng([seed, step, rank, index])
    return rng.integers(0, 256, size=nbytes, dtype=np.uint8)


class Staging:
    """One reusable, contiguous host buffer per rank with a typed view per shard."""

    def __init__(self, spec: StateSpec, ranks: list[int]):
        self.spec = spec
        self.ranks = list(ranks)
        self.shards = {r: shards_of_rank(spec, r) for r in self.ranks}
        self.buffers: dict[int, np.ndarray] = {}
        self.offsets: dict[int, list[int]] = {}
        for r in self.ranks:
            total = sum(s.nbytes for s in self.shards[r])
            self.buffers[r] = _aligned_empty(total)
            offs, o = [], 0
            for s in self.shards[r]:
                offs.append(o)
                o += s.nbytes
            self.offsets[r] = offs
        self._dst = {r: [self.buffers[r][o:o + s.nbytes] for o, s in zip(self.offsets[r], self.shards[r])]
                     for r in self.ranks}
        self.kind = "host"  # pinned memory would need torch or cupy

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())

    def snapshot(self, live: LiveState) -> int:
        """Copy the live state into the staging buffers; returns the pause in nanoseconds."""
        t0 = now_ns()
        copy = np.copyto
        for r in self.ranks:
            for dst, src in zip(self._dst[r], live.flat[r]):
                copy(dst, src)
        return now_ns() - t0
