"""Retention: which checkpoints a tier may delete once a newer one is durable.

Rules (the failures DCP/Orbax users reported are exactly their violations):
  * run only after the new commit is durable (the engine calls it after publishing);
  * never delete the newest committed checkpoint, nor any step still in flight;
  * keep the newest ``keep_last`` committed steps, plus every ``keep_every``-th step;
  * uncommitted leftovers (a crashed save) older than the newest commit are garbage.
  * only iobench's own files go (``commit_point.written_here``); a user's file or ``manifest.json``
    in a ``step-NNNNNNNNNNNN`` directory stays, and so does the directory around it.
Deleting removes the manifest first (commit_point.delete_step).
"""

from __future__ import annotations

from dataclasses import dataclass

from iobench.errors import ConfigError
from iobench.storage import Backend

from .commit_point import delete_step, holds_own_manifest, list_steps


@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int = 2
    keep_every: int = 0        # also keep steps divisible by this (0 = none)

    def __post_init__(self):
        if self.keep_last < 1:
            raise ConfigError("keep_last", f"must be at least 1, got {self.keep_last}",
                              "keep at least the newest checkpoint")
        if self.keep_every < 0:
            raise ConfigError("keep_every", f"must be 0 or more, got {self.keep_every}", "use 0 to disable")


def plan_deletions(committed: list[int], present: list[int], protect: set[int], policy: RetentionPolicy) -> list[int]:
    """Pure: the steps to delete, given committed steps, all step dirs present and protected steps."""
    committed = sorted(set(committed))
    if not committed:
        return []
    newest = committed[-1]
    keep = set(committed[-policy.keep_last:]) | {newest} | set(protect)
    if policy.keep_every:
        keep |= {s for s in committed if s % policy.keep_every == 0}
    doomed = [s for s in committed if s not in keep]
    doomed += [s for s in present if s not in committed and s < newest and s not in protect]
    return sorted(set(doomed))


def apply_retention(backend: Backend, policy: RetentionPolicy, protect: set[int] | frozenset = frozenset()) -> list[int]:
    present = list_steps(backend)
    # Committed by iobench's own manifest: a step directory holding someone else's manifest.json is no
    # checkpoint of ours, and must not make iobench's newest commit look old (keep_last would delete it).
    committed = [s for s in present if holds_own_manifest(backend, s)]
    doomed = plan_deletions(committed, present, set(protect), policy)
    for s in doomed:
        delete_step(backend, s)
    return doomed
