"""Where the loader's workers get shard bytes from.

The loader never opens storage itself: it asks a ``ShardSource``.  The default reads
from the dataset's backend; the tiers package supplies one that stages shards through
faster tiers (``iobench.tiers.loader_source``).  A source is created in the parent,
pickled into each worker process, and must open connections lazily (``open()`` runs in
the worker before the first read).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from iobench.manifest import ShardEntry


@runtime_checkable
class ShardSource(Protocol):
    def open(self) -> None:
        """Called once in each worker process before the first read."""

    def read_shard(self, shard: ShardEntry) -> "bytes | memoryview":
        """The whole shard's contents; bytes read are counted by the source's backend."""

    def close(self) -> None:
        """Called once in each worker process after the last read."""

    def describe(self) -> dict:
        """JSON-able description for results['environment'] (no secrets)."""
