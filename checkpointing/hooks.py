"""Named crash points for the crash-safety harness.

``crashpoint("before_manifest")`` does nothing unless the environment variable
``IOBENCH_CKPT_CRASH_AT`` names that point (``point`` or ``point:N`` for the N-th time it is
reached); then the process SIGKILLs itself there, as a power cut or OOM kill would.
Tests in the same process can install a callable with ``set_hook`` instead (e.g. to raise
an error inside the background committer).
"""

from __future__ import annotations

import os
import signal
from typing import Callable

ENV = "IOBENCH_CKPT_CRASH_AT"
POINTS = ("before_shard_write", "mid_shard_write", "before_local_manifest", "mid_upload", "before_manifest",
          "mid_manifest_publish", "after_commit", "mid_retention")

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
    target = os.environ.get(ENV)
    if not target:
        return
    point, _, nth = target.partition(":")
    if point != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
