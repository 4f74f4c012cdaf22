"""World metrics from per-rank metrics (measurement rule 5, "ranks merged, not averaged", docs/design.md), the one home for rank merging.

Ranks start together (a barrier) and the job is done when the slowest rank is, so:

- durations are the maximum over ranks;
- counts and bytes are summed;
- rates are the summed total over the slowest rank's duration (with a barrier-aligned
  start that is total / (last finish − first start));
- latency histograms are merged from their HDR encodings — the world P99 is the P99 of
  every rank's samples, never an average of per-rank percentiles;
- per-rank figures that do not add up (stall ratio, utilisation, each rank's own rate)
  are reported as min / mean / max with the rank of each extreme;
- a straggler line names the slowest rank, its host and how far behind the fastest it is;
- ranks sharing a host are also summed per node.

Each area says which of its metrics are which in a ``MergeSpec``; ``merge`` does the rest.
Keys may be dotted (``throughput.bytes_per_s``) to reach into nested dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..metrics import LatencyHistogram


@dataclass(frozen=True)
class MergeSpec:
    duration: str                                   # each rank's elapsed seconds for its share
    sums: tuple[str, ...] = ()                      # added up over ranks
    maxes: tuple[str, ...] = ()                     # worst over ranks (other durations, peaks)
    spreads: tuple[str, ...] = ()                   # reported as min/mean/max (and kept per rank)
    hists: dict[str, str] = field(default_factory=dict)   # summary key -> HDR encoding key
    rates: dict[str, str] = field(default_factory=dict)   # rate key -> summed key: total / slowest duration


def get(d: dict, key: str, default: Any = None) -> Any:
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return default
        d = d[part]
    return d


def put(d: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    for part in parts[:-1]:
        d = d.setdefault(part, {})
    d[parts[-1]] = value


def add(a: Any, b: Any) -> Any:
    """a + b for numbers, and key by key for (nested) dicts of numbers (e.g. calls per operation)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: add(a.get(k), b.get(k)) for k in {**a, **b}}
    return a + b


def total(values: list[Any]) -> Any:
    out = None
    for v in values:
        out = add(out, v)
    return 0 if out is None else out


def spread(values: list[float | None]) -> dict:
    """min / mean / max of per-rank values, with the ranks of the extremes (None values skipped)."""
    pairs = [(v, r) for r, v in enumerate(values) if v is not None]
    if not pairs:
        return {"min": None, "mean": None, "max": None, "min_rank": None, "max_rank": None, "by_rank": list(values)}
    lo, hi = min(pairs), max(pairs)
    return {"min": lo[0], "mean": sum(v for v, _ in pairs) / len(pairs), "max": hi[0], "min_rank": lo[1],
            "max_rank": hi[1], "by_rank": list(values)}


def merge_hists(encodings: list[str | None]) -> LatencyHistogram:
    h = LatencyHistogram()
    for e in encodings:
        if e:
            h.merge(LatencyHistogram.decode(e))
    return h


def straggler(durations: list[float], hosts: list[str] | None = None) -> dict:
    """The slowest rank and the spread between the fastest and the slowest."""
    if not durations:
        return {}
    slow = max(range(len(durations)), key=lambda r: durations[r])
    fast = min(range(len(durations)), key=lambda r: durations[r])
    gap = durations[slow] - durations[fast]
    rel = gap / durations[fast] if durations[fast] > 0 else None
    host = hosts[slow] if hosts and slow < len(hosts) else None
    line = (f"slowest rank {slow}" + (f" on {host}" if host else "") + f": {durations[slow]:.3f} s, "
            f"{gap:.3f} s" + (f" ({rel:.1%})" if rel is not None else "") + f" behind the fastest (rank {fast})")
    return {"slowest_rank": slow, "slowest_host": host, "slowest_s": durations[slow], "fastest_rank": fast,
            "fastest_s": durations[fast], "spread_s": gap, "spread_ratio": rel, "line": line}


def per_node(per_rank: list[dict], hosts: list[str], spec: MergeSpec) -> list[dict]:
    """Sums and rates per host, for hosts that run several ranks (and every host once there are several)."""
    out = []
    for host in dict.fromkeys(hosts):
        ranks = [r for r, h in enumerate(hosts) if h == host]
        dur = max(get(per_rank[r], spec.duration, 0.0) or 0.0 for r in ranks)
        node: dict = {"host": host, "ranks": ranks, "duration_s": dur}
        for key in spec.sums:
            put(node, key, total([get(per_rank[r], key) for r in ranks]))
        for rate, summed in spec.rates.items():
            put(node, rate, (get(node, summed, 0) / dur) if dur > 0 else None)
        out.append(node)
    return out


def merge(per_rank: list[dict], spec: MergeSpec, hosts: list[str] | None = None) -> dict:
    """World metrics from every rank's metrics (rank order); see the module docstring."""
    ranks = [m or {} for m in per_rank]
    durations = [float(get(m, spec.duration, 0.0) or 0.0) for m in ranks]
    out: dict = {}
    put(out, spec.duration, max(durations) if durations else 0.0)
    for key in spec.sums:
        put(out, key, total([get(m, key) for m in ranks]))
    for key in spec.maxes:
        vals = [get(m, key) for m in ranks if get(m, key) is not None]
        put(out, key, max(vals) if vals else None)
    slowest = max(durations) if durations else 0.0
    for rate, summed in spec.rates.items():
        put(out, rate, (get(out, summed, 0) / slowest) if slowest > 0 else None)
    for name, enc_key in spec.hists.items():
        encs = [get(m, enc_key) for m in ranks]
        if any(encs):
            h = merge_hists(encs)
            put(out, name, h.summary())
            put(out, enc_key, h.encode())
    world: dict = {"ranks": len(ranks), "duration_s": slowest, "duration": "max over ranks",
                   "rates": "summed totals / the slowest rank's duration", "histograms": "merged (HDR)",
                   "spread": {key: spread([get(m, key) for m in ranks]) for key in (spec.duration, *spec.spreads)},
                   "straggler": straggler(durations, hosts)}
    if hosts and len(set(hosts)) < len(hosts) or hosts and len(set(hosts)) > 1:
        world["per_node"] = per_node(ranks, hosts, spec)
    out["world"] = world
    return out


def tag_ranks(per_rank: list[dict], hosts: list[str]) -> list[dict]:
    """Per-rank detail for ``results.per_rank``: each rank's metrics with its rank and host first."""
    return [{"rank": r, "host": hosts[r] if r < len(hosts) else None, **(m or {})} for r, m in enumerate(per_rank)]


__all__ = ["MergeSpec", "merge", "merge_hists", "spread", "straggler", "per_node", "tag_ranks", "get", "put"]
