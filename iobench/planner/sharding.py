"""Shards: how many, what they save in metadata operations, and how often workers collide."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Collision:
    p_collision: float            # the domain models' birthday approximation 1 − exp(−n²/2k)
    p_collision_exact: float      # 1 − ∏(1 − i/k), i < n
    p_collision_pairs: float      # 1 − exp(−n(n−1)/2k)


def shard_collision(workers: int, shards: int) -> Collision:
    """Probability that at least two of ``workers`` pick the same shard out of ``shards`` at random."""
    n, k = workers, shards
    exact = 1.0
    for i in range(n):
        exact *= max(0.0, 1.0 - i / k)
    return Collision(1 - math.exp(-n * n / (2 * k)), 1 - exact, 1 - math.exp(-n * (n - 1) / (2 * k)))


@dataclass(frozen=True)
class MetadataReduction:
    containers: float            # shards (or tar files) holding the items
    items_per_container: float
    reduction: float             # opens per epoch: per item vs per container
    orders_of_magnitude: float


def metadata_reduction(items: float, containers: float | None = None, total_bytes: float | None = None,
                       container_bytes: float | None = None) -> MetadataReduction:
    """Opens saved by packing ``items`` into containers (given directly or as total / container size)."""
    if containers is None:
        if not total_bytes or not container_bytes:
            raise ValueError("give containers, or total_bytes and container_bytes")
        containers = total_bytes / container_bytes
    r = items / containers
    return MetadataReduction(containers, r, r, math.log10(r))


def open_overhead_cpu(open_s: float, files_per_s: float) -> float:
    """CPU-seconds per second spent only on opening files (metadata cost of small files)."""
    return open_s * files_per_s
