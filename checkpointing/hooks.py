"""Named crash points for the crash-safety harness.

``crashpoint("before_manifest")`` does nothing unless the environment variable
``IOBENCH_CKPT_CRASH_AT`` names that point (``point`` or ``point:N`` for the N-th time it is
reached; ``…@R`` only on MPI rank R); then the process SIGKILLs itself there, as a power cut
or OOM kill would.  ``IOBENCH_CKPT_DELAY_AT=point:SECONDS@R`` makes rank R pause there
instead: a straggler, for the multi-rank commit tests.
Tests in the same process can install a callable with ``set_hook`` instead (e.g. to raise
an error inside the background committer).
"""

from __future__ import annotations

import os
import signal
from typing import Callable

ENV = "IOBENCH_CKPT_CRASH_AT"
DELAY_ENV = "IOBENCH_CKPT_DELAY_AT"
POINTS = ("before_shard_write", "mid_shard_write", "before_local_manifest", "mid_upload", "before_manifest",
          "mid_manifest_publish", "after_commit", "mid_retention")
# reached only in multi-process saves (checkpointing.world): a process's files are durable, not yet reported
WORLD_POINTS = ("before_rank_report",)


def _launcher_rank() -> int:
    for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if k in os.environ:
            return int(os.environ[k])
    return 0


def _split_rank(value: str) -> tuple[str, int | None]:
    body, at, rank = value.partition("@")
    return body, (int(rank) if at else None)

_counts: dict[str, int] = {}
_hook: Callable[[str], None] | None = None


def set_hook(fn: Callable[[str], None] | None) -> None:
    global _hook
    _hook = fn


def reset() -> None:
    _counts.clear()


def crashpoint(name: str) -> None:
    if _hook is not None:
        _hook(name)
    delay = os.environ.get(DELAY_ENV)
    if delay:
        body, rank = _split_rank(delay)
        point, _, secs = body.partition(":")
        if point == name and rank in (None, _launcher_rank()):
            import time

            time.sleep(float(secs or 1))
    target = os.environ.get(ENV)
    if not target:
        return
    target, rank = _split_rank(target)
    if rank is not None and rank != _launcher_rank():
        return
    point, _, nth = target.partition(":")
    if point != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
