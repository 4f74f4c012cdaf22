"""Accelerators sustained at scale, from runs measured at a few node counts (MLPerf Storage's
question on paper).

Model (every term is measured or given; nothing fitted beyond a median):

- d, bytes/s one accelerator needs at the AU threshold = median over the measured points of
  delivered bandwidth / (nodes x accelerators per node);
- A, accelerators one node can feed on its own (client CPU, NIC, its loader) = the largest
  accelerators-per-node any measured point sustained;
- shared storage: n nodes x a accelerators x d <= B (the probe's aggregate bandwidth), and
  n x a x m <= M (aggregate metadata ops/s, m = opens/s one accelerator needs);
- stragglers, if steps are synchronous (the domain models' tail at scale): a step is slow when any of
  the N = n x a ranks waits, P(N) = 1 - (1 - p)^N, so AU = c / (c + P(N) w) with c the
  compute per step, p the share of one rank's steps that wait and w their mean wait; AU >= the
  threshold caps N.

a(n) = min(A, floor(B / (n d)), floor(M / (n m)), floor(N_max / n)); the smallest term names
the limit.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .tail import tail_amplification


@dataclass(frozen=True)
class Point:
    nodes: int
    accelerators_per_node: int
    bytes_per_s: float          # delivered to all of them (aggregate)


def per_accelerator_demand(points: list[Point]) -> float:
    if not any(p.accelerators_per_node > 0 for p in points):
        from ..errors import ConfigError

        raise ConfigError("accelerators_per_node", "no measured point sustained an accelerator",
                          "measure with `iobench mlperf run --find-max` first")
    return statistics.median(p.bytes_per_s / (p.nodes * p.accelerators_per_node) for p in points
                             if p.accelerators_per_node > 0)


def straggler_cap(p_slow: float, slow_wait_s: float, compute_s: float, threshold: float) -> float:
    """Largest synchronous world N with AU >= threshold under tail amplification (inf if none)."""
    if p_slow <= 0 or slow_wait_s <= 0 or compute_s <= 0:
        return math.inf
    q = compute_s * (1 / threshold - 1) / slow_wait_s     # the largest P(N) the threshold allows
    if q >= 1:
        return math.inf
    if p_slow >= 1:
        return 0
    n = math.floor(math.log(1 - q) / math.log(1 - p_slow))
    # check with the domain models' formula itself (one home): P(n) <= q < P(n + 1)
    while n > 0 and tail_amplification(p_slow, n).p_step_slow > q:
        n -= 1
    return n


@dataclass(frozen=True)
class Sustained:
    nodes: int
    per_node: int
    total: int
    demand_bytes_per_s: float
    limit: str                  # node | bandwidth | metadata | stragglers


def sustained(nodes: int, node_cap: int, demand: float, aggregate_bytes_per_s: float,
              metadata_ops_per_s: float = 0.0, ops_per_accelerator: float = 0.0,
              world_cap: float = math.inf) -> Sustained:
    terms = {"node": node_cap,
             "bandwidth": math.floor(aggregate_bytes_per_s / (nodes * demand)) if demand > 0 else math.inf}
    if metadata_ops_per_s > 0 and ops_per_accelerator > 0:
        terms["metadata"] = math.floor(metadata_ops_per_s / (nodes * ops_per_accelerator))
    if world_cap != math.inf:
        terms["stragglers"] = math.floor(world_cap / nodes)
    limit = min(terms, key=lambda k: (terms[k], k != "node"))
    a = max(0, int(min(terms.values())))
    return Sustained(nodes, a, a * nodes, a * nodes * demand, limit)


def leave_one_out(points: list[Point], aggregate_bytes_per_s: float, metadata_ops_per_s: float = 0.0,
                  ops_per_byte: float = 0.0, world_cap: float = math.inf) -> list[dict]:
    """Predict each measured point from the others; the error says how far to trust the model."""
    out = []
    for i, p in enumerate(points):
        rest = points[:i] + points[i + 1:]
        if not rest:
            break
        d = per_accelerator_demand(rest)
        s = sustained(p.nodes, max(q.accelerators_per_node for q in rest), d, aggregate_bytes_per_s,
                      metadata_ops_per_s, ops_per_byte * d, world_cap)
        out.append({"nodes": p.nodes, "measured_per_node": p.accelerators_per_node, "predicted_per_node": s.per_node,
                    "error": s.per_node - p.accelerators_per_node,
                    "relative_error": (s.per_node - p.accelerators_per_node) / p.accelerators_per_node
                    if p.accelerators_per_node else None})
    return out


def parse_points(text: str, field: str = "points") -> list[Point]:
    """'NODES:ACCELERATORS_PER_NODE:BYTES_PER_S,...', e.g. '1:12:2.1GB/s,2:12:4.2GB/s'."""
    from ..errors import ConfigError
    from ..units import parse_size

    pts = []
    for item in [t for t in str(text).split(",") if t.strip()]:
        parts = item.strip().split(":")
        if len(parts) != 3:
            raise ConfigError(field, f"{item!r} is not NODES:ACCELERATORS:RATE", "e.g. 1:12:2.1GB/s")
        try:
            n, a = int(parts[0]), int(parts[1])
        except ValueError:
            raise ConfigError(field, f"{item!r}: nodes and accelerators must be integers", "e.g. 1:12:2.1GB/s") from None
        bw = float(parse_size(parts[2].strip().removesuffix("/s"), field))
        if n < 1 or a < 0:
            raise ConfigError(field, f"{item!r}: nodes >= 1 and accelerators >= 0", "e.g. 1:12:2.1GB/s")
        pts.append(Point(n, a, bw))
    return pts
