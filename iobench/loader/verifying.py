"""``load --verify-checksums``: every shard's manifest checksum checked as its bytes stream in.

``VerifyingSource`` wraps any shard source (the dataset's backend, a tiers source): whole
shards (``block``) are hashed when read; a streamed shard (``stream``) is hashed piece by
piece and checked once its hash has covered the whole shard -- no second read of what the
stream delivered.  Pieces may arrive out of order (a Parquet reader takes the footer first):
a piece ahead of the hash is kept (up to ``AHEAD_BYTES``) until the bytes before it arrive,
and bytes the stream never delivers (a tar's end-of-archive padding, a shard the run stopped
in) are read once when the shard is finished.  A mismatch fails the run (``IntegrityError``,
exit 1) naming the shard, instead of delivering a flipped byte silently.  The hashing time is
counted per worker and reported as ``metrics.verify_checksums`` (shards, bytes, seconds,
bytes_per_s), so the cost is known.  The ``map`` pattern reads single samples by byte range
and never sees a whole shard: with verification on it reads whole shards (verified, kept in
the worker's shard cache) and slices them, and the results say so.  Every shard's size is
checked against the manifest before the run (``check_sizes``, as ``iobench verify`` does):
bytes appended after the manifest's end are never read by a ranged stream, so only the size
shows them.  Checksums come from the one module, ``iobench.io.checksum``.
"""

from __future__ import annotations

import time

from ..errors import IntegrityError
from ..io.checksum import algo_of, matches, new_hasher
from .source import ShardSource

AHEAD_BYTES = 64 << 20   # pieces kept while the hash catches up; past it the gap is read at once


class _Open:
    """One shard being hashed: the hash covers [0, at); ``ahead`` holds pieces past ``at``."""

    __slots__ = ("shard", "hasher", "at", "ahead", "ahead_bytes")

    def __init__(self, shard) -> None:
        self.shard, self.hasher, self.at = shard, new_hasher(shard.checksum), 0
        self.ahead: dict[int, bytes | memoryview] = {}
        self.ahead_bytes = 0

    def take(self, start: int, data) -> None:
        """Hash what of [start, start + len) lies past ``at``, then any kept piece it reaches."""
        data = memoryview(data).cast("B")   # bytes, whatever the view's item type
        if start + len(data) > self.at:   # kept (a copy when it lies past the hash), hashed below once reached
            self.ahead[start] = bytes(data) if start > self.at else data
            self.ahead_bytes += len(data)
        # Every kept piece starts past ``at`` between calls, so this one is the only one that
        # may be reached at first; each piece hashed may reach the next.
        while (nxt := next((s for s in self.ahead if s <= self.at), None)) is not None:
            piece = self.ahead.pop(nxt)
            self.ahead_bytes -= len(piece)
            if nxt + len(piece) > self.at:
                self.hasher.update(memoryview(piece)[self.at - nxt:])
                self.at = nxt + len(piece)


class VerifyingSource(ShardSource):
    """Wraps any ``ShardSource``; only whole-shard reads and pieces reach the wrapped source
    (each hashed).  Its capability flags are its own: no range, record or in-place reads (the
    base class's defaults, built on the verified ``read_shard``, serve those), so the map
    pattern reads whole shards (verified) and slices them -- what a verify-grade run has to
    read anyway -- and a read method added to ``ShardSource`` later cannot bypass the check."""

    concurrent_reads = False   # its counters and open hashes are not guarded: one read at a time

    def __init__(self, inner: ShardSource) -> None:
        self.inner = inner
        # the wrapped source's flags where its reads are the wrapped source's (a source's flags are
        # fixed when it is made)
        self.supports_pieces = inner.supports_pieces
        self.supports_odirect = inner.supports_odirect
        self._open: dict[str, _Open] = {}   # shard path -> its hash in progress
        self.shards = 0
        self.bytes = 0
        self.seconds = 0.0

    def open(self, worker_id: int = 0) -> None:
        self.inner.open(worker_id)

    def close(self) -> None:
        self.inner.close()

    def __getstate__(self) -> dict:
        return {"inner": self.inner}

    def __setstate__(self, state: dict) -> None:
        VerifyingSource.__init__(self, state["inner"])

    def _check(self, shard, data) -> None:
        if algo_of(shard.checksum) == "none":
            return
        t0 = time.perf_counter()
        n = memoryview(data).nbytes
        if n != shard.bytes:
            raise IntegrityError(f"{shard.path}: read {n} bytes, the manifest says {shard.bytes}")
        h = new_hasher(shard.checksum)
        h.update(data)
        self._done(shard, h, n, t0)

    def _done(self, shard, h, n: int, t0: float) -> None:
        ok = matches(shard.checksum, h.hexdigest())
        self.seconds += time.perf_counter() - t0
        if not ok:
            raise IntegrityError(f"{shard.path}: checksum {algo_of(shard.checksum)}:{h.hexdigest()} does not match "
                                 f"the manifest's {shard.checksum} (corrupt shard; `iobench verify` locates the byte)")
        self.shards += 1
        self.bytes += n

    def read_shard(self, shard):
        return self.read_shards([shard])[0]

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
        if first:   # a new request: whatever was open (this shard's last epoch included) is finished now
            self.finish()
        t0 = time.perf_counter()
        st = self._open.get(shard.path)
        if st is None:
            st = self._open[shard.path] = _Open(shard)
        if st.ahead_bytes + len(data) > AHEAD_BYTES and start > st.at:
            st.take(st.at, self.inner.read_range(shard, st.at, start - st.at))   # too much kept: read the gap once
        st.take(start, data)
        self.seconds += time.perf_counter() - t0
        if st.at >= shard.bytes:
            del self._open[shard.path]
            self._done(shard, st.hasher, shard.bytes, time.perf_counter())
        return data

    def finish(self) -> None:
        """Check the shards whose stream stopped before their end (a tar's end-of-archive padding,
        the last samples of an epoch not taken): the bytes the stream did not deliver are read once.
        The worker calls it after its last read, before ``close`` (a corrupt shard fails the run)."""
        while self._open:
            _path, st = self._open.popitem()
            t0 = time.perf_counter()
            while st.at < st.shard.bytes:   # the gap before the next kept piece (all lie past ``at``)
                nxt = min(st.ahead, default=st.shard.bytes)
                st.take(st.at, self.inner.read_range(st.shard, st.at, nxt - st.at))
            self._done(st.shard, st.hasher, st.shard.bytes, t0)

    def stats(self) -> dict:
        return {**self.inner.stats(), "verify": {"shards": self.shards, "bytes": self.bytes, "seconds": self.seconds,
                                                 "unfinished": len(self._open)}}

    def describe(self) -> dict:
        return {**self.inner.describe(), "verify_checksums": True}


def check_sizes(backend, shards) -> None:
    """Every shard's stored size against the manifest's, before the run (as ``iobench verify``):
    a ranged read stops at the manifest's end, so bytes appended to a shard show only here."""
    for shard in shards:
        try:
            size = backend.size(shard.path)
        except FileNotFoundError:
            raise IntegrityError(f"{shard.path}: listed in the manifest but not found "
                                 "(`iobench verify` checks the whole dataset)") from None
        if size != shard.bytes:
            raise IntegrityError(f"{shard.path}: {size} bytes, the manifest says {shard.bytes} "
                                 "(`iobench verify` checks the whole dataset)")


def merge_verify(per_worker_sources: list[dict]) -> dict | None:
    """``metrics.verify_checksums`` from the workers' source stats; None when verification was off."""
    parts: list[dict] = [s["verify"] for s in per_worker_sources if s.get("verify") is not None]
    if not parts:
        return None
    total = {k: sum(p[k] for p in parts) for k in ("shards", "bytes", "seconds")}
    return {**total, "bytes_per_s": total["bytes"] / total["seconds"] if total["seconds"] > 0 else None,
            "unfinished": sum(p.get("unfinished", 0) for p in parts),
            "note": "hashing time summed over workers (CPU seconds spent verifying, inside the batch I/O time)"}
