"""Recovery exposure of a measured checkpoint timeline (seed ch. 4).

The recovery point after a failure at time t is the newest save whose *commit* (durable
manifest) happened at or before t — not the newest snapshot.  The work redone is t minus
that save's snapshot time.  ``recovery_at`` applies this to a measured timeline.  The
closed forms (write time, backlog, Young/Daly interval, overhead, storm, staged
checkpoints) live in ``iobench.planner.checkpoint``, their one home; this module only asks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from iobench.planner.checkpoint import async_backlog


def has_backlog(size_bytes: float, bandwidth_bytes_per_s: float, interval_s: float) -> bool:
    """The commit queue grows without bound when S / interval exceeds the durable bandwidth."""
    return async_backlog(size_bytes, bandwidth_bytes_per_s, interval_s).backlog


@dataclass(frozen=True)
class Recovery:
    t_fail: float
    step: int | None          # recoverable step (None: nothing committed yet)
    snapshot_time: float | None
    redo_s: float             # work lost: t_fail - snapshot time of the recovered step (or t_fail)


def recovery_at(timeline: Iterable[tuple[int, float, float | None]], t_fail: float, t_start: float = 0.0) -> Recovery:
    """timeline: (step, snapshot time, commit time or None); the recovery point for a failure at t_fail."""
    best = None
    for step, t_snap, t_commit in timeline:
        if t_commit is not None and t_commit <= t_fail and (best is None or t_snap > best[1]):
            best = (step, t_snap)
    if best is None:
        return Recovery(t_fail, None, None, t_fail - t_start)
    return Recovery(t_fail, best[0], best[1], t_fail - best[1])
