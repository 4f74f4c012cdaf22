"""Eviction policies, shared by the TierManager (as SQL order) and the simulator (in memory).

- ``lru``: evict the copy read least recently.
- ``fifo``: evict the copy staged earliest (what webdataset's cache does, by creation time).
- ``pin-once-full``: admit until full, then never evict; later misses are read from the
  source without caching.  On a uniformly shuffled multi-epoch workload it guarantees a hit
  ratio of capacity / dataset after the first epoch, where LRU and FIFO can fall to zero
  (seed ch. 4: "LRU ... on uniformly accessed data reaches a 0% hit rate").
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import check_choice


@dataclass(frozen=True)
class Policy:
    name: str
    evicts: bool
    order_column: str          # catalog column giving eviction order, oldest first


POLICIES: dict[str, Policy] = {
    "lru": Policy("lru", True, "last_access_seq"),
    "fifo": Policy("fifo", True, "created_seq"),
    "pin-once-full": Policy("pin-once-full", False, "created_seq"),
}


def get_policy(name: str, field: str = "policy") -> Policy:
    return POLICIES[check_choice(field, name, POLICIES)]
