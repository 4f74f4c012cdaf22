"""Resharding N → M ranks by global offsets: every target box is filled from the source boxes
of the same tensor component that intersect it (bit-exact copies, no arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iobench.errors import IntegrityError

from .state import DTYPES, Shard, StateSpec, rank_shards


@dataclass(frozen=True)
class Piece:
    src_rank: int
    src: Shard
    src_slices: tuple[slice, ...]   # inside the source shard
    dst_slices: tuple[slice, ...]   # inside the target shard


def intersect(a: Shard, b: Shard) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """Slices of a and of b that cover their common global region, or None."""
    sa, sb = [], []
    for oa, na, ob, nb in zip(a.offsets, a.shape, b.offsets, b.shape):
        lo, hi = max(oa, ob), min(oa + na, ob + nb)
        if lo >= hi:
            return None
        sa.append(slice(lo - oa, hi - oa))
        sb.append(slice(lo - ob, hi - ob))
    return tuple(sa), tuple(sb)


def plan(sources: dict[int, list[Shard]], target: list[Shard]) -> list[tuple[Shard, list[Piece]]]:
    """For each target shard, the source pieces that fill it."""
    by_key: dict[str, list[tuple[int, Shard]]] = {}
    for r, shards in sources.items():
        for s in shards:
            by_key.setdefault(s.key, []).append((r, s))
    out = []
    for t in target:
        pieces = []
        for r, s in by_key.get(t.key, []):
            if s.global_shape != t.global_shape:
                raise IntegrityError(f"{t.key}: global shape {s.global_shape} in the checkpoint, {t.global_shape} wanted")
            hit = intersect(s, t)
            if hit is not None:
                pieces.append(Piece(r, s, hit[0], hit[1]))
        covered = sum(int(np.prod([sl.stop - sl.start for sl in p.dst_slices])) for p in pieces)
        if covered != t.numel:
            raise IntegrityError(f"{t.key}: the checkpoint covers {covered} of {t.numel} elements of the target box")
        out.append((t, pieces))
    return out


def reshard_plan(old: StateSpec, new: StateSpec) -> dict[int, list[tuple[Shard, list[Piece]]]]:
    sources = dict(enumerate(rank_shards(old)))
    return {r: plan(sources, shards) for r, shards in enumerate(rank_shards(new))}


def assemble(pieces_plan: list[tuple[Shard, list[Piece]]],
             source_arrays: dict[int, dict[tuple, np.ndarray]]) -> list[np.ndarray]:
    """Target arrays for one rank; ``source_arrays[rank][(key, offsets)]`` are the restored shards."""
    out = []
    for t, pieces in pieces_plan:
        dst = np.empty(t.shape, dtype=DTYPES[t.dtype][0])
        for p in pieces:
            dst[p.dst_slices] = source_arrays[p.src_rank][(p.src.key, p.src.offsets)][p.src_slices]
        out.append(dst)
    return out
