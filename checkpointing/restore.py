"""Restore: the newest committed checkpoint whose files all verify, from the nearest tier.

Tiers are tried nearest first (local, then durable) for each step, newest step first.  A
step is taken only if its manifest parses and every rank file has the recorded size and
checksum; otherwise it is skipped with the reason (kept in ``Restored.skipped``).  Reads go
through one pluggable function, ``read_fn(backend, rel, dst)``, which fills the writable
buffer ``dst`` with the file's bytes — plain reads by default; a GPU-direct reader
(``read_into(dst, offset, nbytes)``) plugs in through ``reader_read_fn``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from iobench.errors import ConfigError, IntegrityError, NoCheckpointError
from iobench.gds.base import aligned_host
from iobench.io.copy import _plain_local
from iobench.paths import check_inside
from iobench.storage import Backend

from . import commit_point as cp
from .local_writer import RANK_ALGO, checksum
from .reshard import assemble, plan
from .snapshot import shard_array
from .state import Shard, StateSpec, rank_shards

ReadFn = Callable[[Backend, str, memoryview], None]


def plain_read(backend: Backend, rel: str, dst: memoryview) -> None:
    """The whole file into ``dst`` through ``Backend.cat_into``: local files are one ``preadv``
    straight into the buffer (a file object's ``readinto`` went through fsspec's buffered
    opener, about 3x slower on a cold 256 MiB rank file), objects one ranged GET."""
    n = len(dst)
    got = backend.cat_into(rel, 0, n, dst)
    if got != n:
        raise IntegrityError(f"{backend.url.rstrip('/')}/{rel}: short read ({got} of {n} bytes)")


HASH_CHUNK = 16 * 2**20


def read_hashing(path: str, url: str, dst: memoryview, algo: str) -> str:
    """A local file into ``dst`` in chunks, each hashed on a helper thread while the next is
    read; returns ``"<algo>:<hex>"`` of the bytes in ``dst``, the same digest one hash of
    the whole buffer after the read gives (streaming and one-shot xxh3 agree).  xxhash
    releases the GIL for large updates, so the hash runs beside the reads instead of after
    them (a cold 256 MiB rank file: ~45 ms of xxh3 behind ~170 ms of reads here)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from iobench.io.checksum import new_hasher

    n = len(dst)
    h = new_hasher(algo)
    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="iobench-restore-hash") as pool:
            pending = None
            pos = 0
            while pos < n:
                end = min(n, pos + HASH_CHUNK)
                got = pos
                while got < end:
                    k = os.preadv(fd, [dst[got:end]], got)
                    if k <= 0:
                        if pending is not None:
                            pending.result()
                        raise IntegrityError(f"{url}: short read ({got} of {n} bytes)")
                    got += k
                if pending is not None:
                    pending.result()   # in order: the hash is a stream
                pending = pool.submit(h.update, dst[pos:end])
                pos = end
            if pending is not None:
                pending.result()
    finally:
        os.close(fd)
    return f"{algo}:{h.hexdigest()}"


def reader_read_fn(open_reader: Callable[[str], object]) -> ReadFn:
    """Adapt a reader factory (local path → object with ``read_into(dst, offset, nbytes)``)."""
    def read(backend: Backend, rel: str, dst: memoryview) -> None:
        reader = open_reader(backend.local_path(rel))
        try:
            got = reader.read_into(dst, 0, len(dst))
        finally:
            close = getattr(reader, "close", None)
            if close is not None:
                close()
        if got is not None and got != len(dst):
            raise IntegrityError(f"{backend.url.rstrip('/')}/{rel}: short read ({got} of {len(dst)} bytes)")
    return read


def _prepare_cache(backend: Backend, rel: str, cold: bool, pages: list[int]) -> None:
    """Drop a local file's pages when ``cold`` (iobench.io.pagecache: fdatasync, then DONTNEED) and add
    its measured (resident, total) pages, just before the read, to ``pages``; [-1] marks unmeasurable."""
    from iobench.io.pagecache import drop_pages, resident_pages

    base = backend.base
    if not base.is_local:
        pages[:] = [-1, -1]
        return
    path = base.local_path(rel)
    if cold:
        drop_pages(path)
    r = resident_pages(path) if pages[0] >= 0 else None
    if r is None:
        pages[:] = [-1, -1]
    else:
        pages[0] += r[0]
        pages[1] += r[1]


@dataclass
class Restored:
    step: int
    tier: str
    url: str
    spec: StateSpec
    arrays: dict[int, list[np.ndarray]]          # per target rank, in rank_shards order
    shards: dict[int, list[Shard]]
    bytes_read: int
    seconds: float                     # the restore itself; dropping and measuring the cache is not counted
    verified: bool
    cold: bool
    skipped: list[str] = field(default_factory=list)
    files_read: list[int] = field(default_factory=list)   # source ranks whose files were read
    resident_ratio: float | None = None    # measured (mincore) just before each file was read; None: not measurable

    @property
    def cache(self) -> dict:
        """Cache state as declared and as measured (measurement rule 3, "declared and measured cache state", docs/design.md)."""
        out: dict = {"declared": "cold" if self.cold else "as-is",
                     "method": "fdatasync + posix_fadvise(DONTNEED)" if self.cold else "none",
                     "measured_residency": self.resident_ratio}
        if self.resident_ratio is None:
            out["note"] = "residency not measurable here (not a local file system, or mincore failed)"
        elif self.cold and self.resident_ratio > 0.05:
            out["note"] = (f"{self.resident_ratio:.0%} of the files stayed in memory after DONTNEED "
                           "(tmpfs, or pages pinned elsewhere): not a cold-cache restore")
        return out

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_read / self.seconds if self.seconds > 0 else 0.0


def _candidates(tiers: list[tuple[str, Backend]]) -> list[int]:
    steps: set[int] = set()
    for _, b in tiers:
        steps.update(cp.list_steps(b))
    return sorted(steps, reverse=True)


def _load(backend: Backend, m: cp.CheckpointManifest, verify: bool, read_fn: ReadFn, cold: bool,
          only: set[int] | None = None, pages: list[int] | None = None, prep_s: list[float] | None = None):
    """Read (and verify) the step's rank files; ``only``: just these source ranks' files;
    ``pages`` accumulates the measured page-cache residency before each read, ``prep_s`` the seconds
    spent dropping and measuring the cache (the harness's doing, not the restore's)."""
    prep_s = prep_s if prep_s is not None else [0.0]
    d = cp.step_dir(m.step)
    missing = set(range(m.spec.ranks)) - {f.rank for f in m.files}
    if missing:
        raise IntegrityError(f"{d}: manifest lacks ranks {sorted(missing)[:8]} (incomplete commit)")
    bufs, total = {}, 0
    for f in m.files:
        if only is not None and f.rank not in only:
            continue
        rel = f"{d}/{f.path}"
        base = backend.base
        if base.is_local:
            try:
                check_inside(base.root, rel, "checkpoint manifest")
            except ConfigError as e:
                raise IntegrityError(f"{rel}: {e.problem}") from None
        try:
            size = backend.size(rel)
        except FileNotFoundError:
            raise IntegrityError(f"{rel}: missing") from None
        if size != f.bytes:
            raise IntegrityError(f"{rel}: {size} bytes, manifest says {f.bytes} (truncated or overwritten)")
        t_prep = time.perf_counter()
        _prepare_cache(backend, rel, cold, pages if pages is not None else [0, 0])
        prep_s[0] += time.perf_counter() - t_prep
        # A fresh anonymous mapping, not np.empty: numpy asks for transparent huge pages for large
        # arrays, and right after another process has freed its memory (a restarted job) faulting
        # huge pages in stalls on compaction: a cold 256 MiB restore just after a torch.load
        # process exited took 914 ms (704 ms in the kernel) with them, 482 ms with 4 KiB pages.
        buf = aligned_host(f.bytes)
        if verify and read_fn is plain_read and _plain_local(backend):   # read and hash overlapped
            digest = read_hashing(backend.local_path(rel), f"{backend.url.rstrip('/')}/{rel}", memoryview(buf),
                                  RANK_ALGO)
        else:
            read_fn(backend, rel, memoryview(buf))
            digest = checksum(memoryview(buf)) if verify else None
        total += f.bytes
        if verify and digest != f.checksum:
            raise IntegrityError(f"{rel}: checksum mismatch (corrupt)")
        bufs[f.rank] = buf
    return bufs, total


def needed_sources(m: cp.CheckpointManifest, target: StateSpec | None, ranks: list[int] | None) -> set[int] | None:
    """The source ranks whose files hold the boxes of target ``ranks`` (None: every file)."""
    if ranks is None:
        return None
    if target is None or target == m.spec:
        return set(ranks)
    layout = rank_shards(target)
    sources = {f.rank: [s for s, _ in f.shards] for f in m.files}
    return {p.src_rank for r in ranks for _, pieces in plan(sources, layout[r]) for p in pieces}


def restore(tiers: list[tuple[str, Backend]], *, target: StateSpec | None = None, ranks: list[int] | None = None,
            verify: bool = True, read_fn: ReadFn | None = None, cold: bool = True,
            max_step: int | None = None) -> Restored:
    """Load the newest committed, verified checkpoint; reshard to ``target`` when given.

    With ``ranks``, only those target ranks are assembled, and only the rank files that hold
    their boxes are read (one process of a multi-process restore).  ``max_step``: ignore newer steps.
    """
    tiers = [(n, b) for n, b in tiers if b is not None]
    read_fn = read_fn or plain_read
    skipped: list[str] = []
    for step in _candidates(tiers):
        if max_step is not None and step > max_step:
            continue
        found = False
        for name, backend in tiers:
            if not cp.is_committed(backend, step):
                continue
            found = True
            t0 = time.perf_counter()
            try:
                m = cp.load_manifest(backend, step)
                pages, prep_s = [0, 0], [0.0]
                bufs, total = _load(backend, m, verify, read_fn, cold, needed_sources(m, target, ranks), pages,
                                    prep_s)
            except (IntegrityError, OSError) as e:
                skipped.append(f"step {step} on {name}: {e}")
                continue
            src = {f.rank: dict(((s.key, s.offsets), shard_array(bufs[f.rank], off, s)) for s, off in f.shards)
                   for f in m.files if f.rank in bufs}
            if target is None or target == m.spec:
                spec = m.spec
                want = ranks if ranks is not None else [f.rank for f in m.files]
                shards = {f.rank: [s for s, _ in f.shards] for f in m.files if f.rank in want}
                arrays = {r: [src[r][(s.key, s.offsets)] for s in shards[r]] for r in shards}
            else:
                spec = target
                layout = rank_shards(target)
                want = ranks if ranks is not None else list(range(target.ranks))
                sources = {f.rank: [s for s, _ in f.shards] for f in m.files}
                try:
                    shards, arrays = {}, {}
                    for r in want:
                        p = plan(sources, layout[r])
                        shards[r] = [t for t, _ in p]
                        arrays[r] = assemble(p, src)
                except IntegrityError as e:
                    skipped.append(f"step {step} on {name}: cannot reshard ({e})")
                    continue
            return Restored(step=step, tier=name, url=backend.url, spec=spec, arrays=arrays, shards=shards,
                            bytes_read=total, seconds=time.perf_counter() - t0 - prep_s[0], verified=verify, cold=cold,
                            skipped=skipped, files_read=sorted(bufs),
                            resident_ratio=None if pages[0] < 0 else (pages[0] / pages[1] if pages[1] else 0.0))
        if not found:
            skipped.append(f"step {step}: no manifest on any tier (incomplete save)")
    where = ", ".join(b.url for _, b in tiers)
    detail = f"; skipped: {'; '.join(skipped)}" if skipped else ""
    raise NoCheckpointError(f"no committed checkpoint at {where}{detail}")
