"""Replay an access trace against eviction policies at several capacities (pure, in memory).

The same admission and eviction rules as the TierManager: a shard larger than the
capacity is never admitted; ``lru``/``fifo`` evict in their order until the new shard
fits; ``pin-once-full`` admits while there is room and never evicts.  ``belady`` (evict
the shard whose next use is furthest away; clairvoyant, optimal when shards are the same
size) is a reference, not a tier policy.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import ConfigError
from ..units import parse_size

SIM_POLICIES = ("lru", "fifo", "pin-once-full", "belady")


@dataclass(frozen=True)
class SimResult:
    policy: str
    capacity_bytes: int
    accesses: int
    hits: int
    hit_bytes: int
    total_bytes: int
    evictions: int
    admitted: int

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    @property
    def byte_hit_ratio(self) -> float:
        return self.hit_bytes / self.total_bytes if self.total_bytes else 0.0

    def to_dict(self) -> dict:
        return {"policy": self.policy, "capacity_bytes": self.capacity_bytes, "accesses": self.accesses,
                "hits": self.hits, "hit_ratio": self.hit_ratio, "byte_hit_ratio": self.byte_hit_ratio,
                "evictions": self.evictions, "admitted": self.admitted,
                "bytes_from_below": self.total_bytes - self.hit_bytes}


def simulate(accesses: Sequence[tuple[str, int]], policy: str, capacity_bytes: int) -> SimResult:
    """Hit ratio of ``policy`` with ``capacity_bytes`` over ``accesses`` [(shard, bytes), ...]."""
    if policy not in SIM_POLICIES:
        from ..config import nearest

        raise ConfigError("--policies", f"unknown policy {policy!r}", nearest(policy, SIM_POLICIES))
    cache: OrderedDict[str, int] = OrderedDict()
    used = hits = hit_bytes = total = evictions = admitted = 0
    next_use: list[int] = []
    if policy == "belady":
        last: dict[str, int] = {}
        next_use = [len(accesses)] * len(accesses)
        for i in range(len(accesses) - 1, -1, -1):
            k = accesses[i][0]
            next_use[i] = last.get(k, len(accesses) + 1)
            last[k] = i
        upcoming: dict[str, int] = {}
    for i, (key, nbytes) in enumerate(accesses):
        total += nbytes
        if key in cache:
            hits += 1
            hit_bytes += nbytes
            if policy == "lru":
                cache.move_to_end(key)
            if policy == "belady":
                upcoming[key] = next_use[i]
            continue
        if nbytes > capacity_bytes:
            continue
        if used + nbytes > capacity_bytes:
            if policy == "pin-once-full":
                continue
            if policy == "belady":
                # Not worth admitting if this shard is needed later than everything cached.
                if next_use[i] > len(accesses) or all(upcoming[k] < next_use[i] for k in cache):
                    continue
                order = sorted(cache, key=lambda k: -upcoming[k])
            else:
                order = list(cache)
            for victim in order:
                if used + nbytes <= capacity_bytes:
                    break
                used -= cache.pop(victim)
                evictions += 1
                if policy == "belady":
                    upcoming.pop(victim, None)
        cache[key] = nbytes
        used += nbytes
        admitted += 1
        if policy == "belady":
            upcoming[key] = next_use[i]
    return SimResult(policy, capacity_bytes, len(accesses), hits, hit_bytes, total, evictions, admitted)


def read_trace(path: str) -> tuple[list[dict], list[dict]]:
    """(headers, reads) from a JSON-lines trace; reads sorted by time."""
    from ..io.inputs import loads_json, read_lines

    headers, reads = [], []
    for lineno, line in read_lines(path, "TRACE", "trace written by a load run"):
        line = line.strip()
        if not line:
            continue
        try:
            rec = loads_json(line)
        except ValueError:
            raise ConfigError("TRACE", f"{path}:{lineno} is not JSON", "give a trace written by a load run") \
                from None
        if not isinstance(rec, dict):
            raise ConfigError("TRACE", f"{path}:{lineno} is not a trace record", "give a trace written by a "
                              "load run")
        if rec.get("type") == "header":
            headers.append(rec)
        elif rec.get("type") == "read":
            if not isinstance(rec.get("t"), (int, float)) or not isinstance(rec.get("bytes"), int) \
                    or "shard" not in rec or "result" not in rec:
                raise ConfigError("TRACE", f"{path}:{lineno} is a read record without t, shard, bytes and "
                                  "result", "give a trace written by a load run")
            reads.append(rec)
    if not reads:
        raise ConfigError("TRACE", f"{path} holds no read records", "give a trace written by a load run")
    reads.sort(key=lambda r: (r["t"], r.get("pid", 0)))
    return headers, reads


def parse_capacities(items: Iterable[str], dataset_bytes: int) -> list[int]:
    """'25%' (of the dataset's distinct bytes) or a size ('64MiB')."""
    out = []
    for item in items:
        item = str(item).strip()
        if item.endswith("%"):
            try:
                frac = float(item[:-1]) / 100
            except ValueError:
                raise ConfigError("--capacities", f"cannot read {item!r}", "use e.g. 25% or 64MiB") from None
            if frac <= 0:
                raise ConfigError("--capacities", f"{item!r} must be positive", "use e.g. 25%")
            out.append(max(1, int(dataset_bytes * frac)))
        else:
            out.append(parse_size(item, "--capacities"))
    return out


def compare(accesses: Sequence[tuple[str, int]], policies: Iterable[str], capacities: Iterable[int]) -> list[SimResult]:
    return [simulate(accesses, p, c) for c in capacities for p in policies]


def distinct_bytes(accesses: Sequence[tuple[str, int]]) -> int:
    return sum(dict(accesses).values())
