"""The steps every measuring command takes under MPI: agree, check, start together, collect.

``start`` runs before any work: every rank must have resolved the same config and be able to
reach its inputs, or every rank exits 2 with the same one line; then a barrier aligns the
start.  ``collect`` sends each rank's metrics to rank 0, which gets the world metrics and
the per-rank detail in one ``Results``.  With one process both are no-ops.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from .aggregate import tag_ranks
from .world import World


def start(world: World, command: str, resolved: Any, check: Callable[[], Any] | None = None) -> Any:
    """Config agreement, an all-ranks input check (its value is returned), then the start barrier."""
    value = None
    if world.is_mpi:
        world.agree(f"{command} config", resolved)
    if check is not None:
        value = world.all_ok(check, what=f"{command} inputs")
    world.barrier(f"{command} start")
    return value


def collect(world: World, results, metrics: dict, merge_fn: Callable[[list[dict], list[str]], dict],
            drop: tuple[str, ...] = ("series", "system"), merge_only: tuple[str, ...] = ()) -> bool:
    """Gather metrics on rank 0 and fill ``results`` there; True on the rank that writes and prints.

    ``merge_only``: keys of ``drop`` the merge still needs (a load's per-batch series, to
    recompute the world's intervals): gathered and handed to ``merge_fn``, kept out of
    ``results.per_rank``.
    """
    results.world = world.describe()
    if world.size == 1:
        results.metrics = metrics
        return True
    mine = {k: v for k, v in metrics.items() if k not in drop or k in merge_only}
    gathered = world.gather(mine, what=f"{results.command} results")
    if world.rank != 0:
        return False
    results.per_rank = tag_ranks([{k: v for k, v in m.items() if k not in merge_only} for m in gathered],
                                 world.hosts)
    t0 = time.perf_counter()
    merged = merge_fn(gathered, world.hosts)
    merge_s = time.perf_counter() - t0
    # Keys the merge does not define (configuration echoes, rank 0's own series) stay rank 0's.
    results.metrics = {**metrics, **merged}
    # What the launch model itself cost on rank 0: waits (ranks arriving) apart from transfers.
    results.metrics.setdefault("world", {})["collectives"] = {**world.timings, "merge": {"calls": 1, "wait_s": 0.0,
                                                                                       "transfer_s": merge_s}}
    return True


__all__ = ["start", "collect"]
