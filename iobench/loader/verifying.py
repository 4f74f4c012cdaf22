"""``load --verify-checksums``: every shard's manifest checksum checked as its bytes stream in.

``VerifyingSource`` wraps any shard source (the dataset's backend, a tiers source): whole
shards (``block``) are hashed when read; a streamed shard (``stream``) is hashed piece by
piece, in order, and checked when its last piece arrives -- no second read.  A mismatch
fails the run (``IntegrityError``, exit 1) naming the shard, instead of delivering a
flipped byte silently.  The hashing time is counted per worker and reported as
``metrics.verify_checksums`` (shards, bytes, seconds, bytes_per_s), so the cost is known.
The ``map`` pattern reads single samples by byte range and never sees a whole shard: with
verification on it reads whole shards (verified, kept in the worker's shard cache) and slices
them, and the results say so.  Checksums come from the one module, ``iobench.io.checksum``.
"""

from __future__ import annotations

import time

from ..errors import IntegrityError
from ..io.checksum import algo_of, matches, new_hasher
from .source import ShardSource


class VerifyingSource(ShardSource):
    """Wraps any ``ShardSource``; only whole-shard reads and in-order pieces reach the wrapped
    source (each hashed).  Its capability flags are its own: no range, record or in-place reads
    (the base class's defaults, built on the verified ``read_shard``, serve those), so the map
    pattern reads whole shards (verified) and slices them -- what a verify-grade run has to read
    anyway -- and a read method added to ``ShardSource`` later cannot bypass the check."""

    concurrent_reads = False   # its counters and open hashes are not guarded: one read at a time

    def __init__(self, inner: ShardSource) -> None:
        self.inner = inner
        self._open: dict = {}   # shard path -> (hasher, next expected offset, shard entry)
        self.shards = 0
        self.bytes = 0
        self.seconds = 0.0

    @property
    def supports_pieces(self) -> bool:   # type: ignore[override]
        return self.inner.supports_pieces

    @property
    def supports_odirect(self) -> bool:   # type: ignore[override]
        return self.inner.supports_odirect   # its whole-shard reads are the wrapped source's

    def open(self, worker_id: int = 0) -> None:
        self.inner.open(worker_id)

    def close(self) -> None:
        self.inner.close()

    def __getstate__(self) -> dict:
        return {"inner": self.inner}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["inner"])

    def _check(self, shard, data) -> None:
        if algo_of(shard.checksum) == "none":
            return
        t0 = time.perf_counter()
        h = new_hasher(shard.checksum)
        h.update(data)
        self._done(shard, h, len(data), t0)

    def _done(self, shard, h, n: int, t0: float) -> None:
        ok = matches(shard.checksum, h.hexdigest())
        self.seconds += time.perf_counter() - t0
        if not ok:
            raise IntegrityError(f"{shard.path}: checksum {algo_of(shard.checksum)}:{h.hexdigest()} does not match "
                                 f"the manifest's {shard.checksum} (corrupt shard; `iobench verify` locates the byte)")
        self.shards += 1
        self.bytes += n

    def read_shard(self, shard):
        data = self.inner.read_shard(shard)
        self._check(shard, data)
        return data

    def read_shards(self, shards):
        datas = self.inner.read_shards(shards)
        for s, d in zip(shards, datas):
            self._check(s, d)
        return datas

    def read_piece(self, shard, start: int, length: int, first: bool):
        if not self.inner.supports_pieces:   # whole shards (verified by read_shard), sliced
            return super().read_piece(shard, start, length, first)
        data = self.inner.read_piece(shard, start, length, first)
        if algo_of(shard.checksum) == "none":
            return data
        if first:
            self._finish_pending(keep=shard.path)
        t0 = time.perf_counter()
        if first or shard.path not in self._open:
            self._open[shard.path] = (new_hasher(shard.checksum), 0, shard)
        h, at, _ = self._open[shard.path]
        if start > at:   # a skipped header (raw shards stream from byte 64): read the gap once
            h.update(self._bytes(shard, at, start - at))
            at = start
        elif start != at:   # going back: this stream cannot be hashed in one pass
            self._open.pop(shard.path, None)
            raise IntegrityError(f"{shard.path}: pieces arrived out of order ({start} after {at}); "
                                 "cannot verify the checksum in one pass")
        h.update(data)
        at += len(data)
        self.seconds += time.perf_counter() - t0
        if at >= shard.bytes:
            self._open.pop(shard.path, None)
            self._done(shard, h, at, time.perf_counter())
        else:
            self._open[shard.path] = (h, at, shard)
        return data

    def _bytes(self, shard, start: int, length: int):
        return self.inner.read_range(shard, start, length)

    def _finish_pending(self, keep: str | None = None) -> None:
        """Shards whose stream stopped before their end (a tar's end-of-archive padding, the
        last samples of an epoch not taken): read the remaining bytes once and check."""
        for path in [p for p in self._open if p != keep]:
            h, at, shard = self._open.pop(path)
            t0 = time.perf_counter()
            rest = shard.bytes - at
            if rest > 0:
                h.update(self._bytes(shard, at, rest))
            self._done(shard, h, shard.bytes, t0)

    def stats(self) -> dict:
        self._finish_pending()
        out = dict(self.inner.stats())
        out["verify"] = {"shards": self.shards, "bytes": self.bytes, "seconds": self.seconds}
        return out

    def describe(self) -> dict:
        d = dict(self.inner.describe())
        d["verify_checksums"] = True
        return d


def merge_verify(per_worker_sources: list[dict]) -> dict | None:
    """``metrics.verify_checksums`` from the workers' source stats; None when verification was off."""
    parts = [s.get("verify") for s in per_worker_sources if s.get("verify") is not None]
    if not parts:
        return None
    shards = sum(p["shards"] for p in parts)
    nbytes = sum(p["bytes"] for p in parts)
    secs = sum(p["seconds"] for p in parts)
    return {"shards": shards, "bytes": nbytes, "seconds": secs,
            "bytes_per_s": nbytes / secs if secs > 0 else None,
            "note": "hashing time summed over workers (CPU seconds spent verifying, inside the batch I/O time)"}
