"""TierManager: stages shards between tiers, evicts by policy, pins shards in use.

Copies of a dataset on a cache tier live at ``<tier url>/<dataset id>/<shard path>``; the
dataset itself (its *origin*, the source of truth) stays where it was generated and is
never evicted.  Every placement decision goes through the SQLite catalog
(``iobench.tiers.catalog``), so threads and processes can stage and read at once.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from concurrent.futures import wait as wait_any
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..errors import ConfigError, StorageError
from ..manifest import Manifest, ShardEntry, read_manifest
from ..metrics import LatencyHistogram, now_ns
from ..storage import Backend, open_backend
from .catalog import Catalog
from .config import TiersConfig, TierSpec
from .policies import get_policy
from ..io.atomic import final_name_of, writer_alive
from ..io.copy import copy_verified, fetch_verified, write_copy

SOURCE_TIER = "source"   # the pseudo-tier of a dataset that lives outside every configured tier
STAGING_MODES = ("prestage", "ondemand", "stream")


@dataclass(frozen=True)
class DatasetRef:
    id: str
    url: str
    origin_tier: str
    manifest: Manifest

    def shard(self, path: str) -> ShardEntry:
        for s in self.manifest.shards:
            if s.path == path:
                return s
        raise KeyError(path)


@dataclass
class ReadInfo:
    result: str            # hit | miss (copied into the hot tier) | bypass (not admitted) | stream
    tier: str              # the tier the shard was meant to be read from
    source: str            # the tier its bytes came from
    bytes: int
    seconds: float
    evicted: int = 0
    refetches: int = 0


@dataclass
class StageReport:
    dataset: str
    to: str
    shards: int = 0
    staged: int = 0
    present: int = 0
    not_admitted: int = 0
    bytes: int = 0
    seconds: float = 0.0
    refetches: int = 0
    retries: int = 0
    evictions: int = 0
    concurrency: int = 0                  # parallel copies used
    bytes_by_pair: Counter = field(default_factory=Counter)
    copy_latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    def metrics(self) -> dict:
        return {"shards": self.shards, "staged_shards": self.staged, "already_present_shards": self.present,
                "not_admitted_shards": self.not_admitted, "bytes": self.bytes, "seconds": self.seconds,
                "bytes_per_s": self.bytes / self.seconds if self.seconds > 0 else 0.0,
                "refetches": self.refetches, "retries": self.retries, "evictions": self.evictions,
                "concurrency": self.concurrency, "bytes_by_tier_pair": dict(self.bytes_by_pair), "copy_latency_s": self.copy_latency.summary()}


def _norm_url(url: str) -> str:
    if "://" not in url:
        return os.path.abspath(url).rstrip("/")
    if url.startswith("file://"):
        return os.path.abspath(url[len("file://"):]).rstrip("/")
    return url.rstrip("/")


def dataset_id(url: str, manifest: Manifest) -> str:
    """Stable per (location, content): a regenerated dataset gets a new id, so stale copies are never read."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", _norm_url(url).rsplit("/", 1)[-1]) or "dataset"
    h = hashlib.sha1(_norm_url(url).encode())
    for s in manifest.shards:
        h.update(f"\0{s.path}\0{s.bytes}\0{s.checksum}".encode())
    return f"{base[:40]}-{h.hexdigest()[:12]}"


class TierManager:
    """Staging, eviction and pins over the tiers of ``config``; usable from many threads and processes."""

    def __init__(self, config: TiersConfig, *, fsync: bool = True):
        self.config = config
        self.fsync = fsync
        self.catalog = Catalog(config.catalog)
        self._backends: dict[str, Backend] = {}
        self._sources: dict[str, Backend] = {}
        self._datasets: dict[str, DatasetRef] = {}
        self._lock = threading.Lock()
        self._opened = False
        self.bytes_by_pair: Counter = Counter()
        self.evictions = 0
        self.refetches = 0
        self.retries = 0

    def __getstate__(self) -> dict:
        return {"config": self.config, "fsync": self.fsync}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["config"], fsync=state["fsync"])

    # ---- setup ---------------------------------------------------------------------------
    def open(self) -> "TierManager":
        if not self._opened:
            for t in self.config.tiers:
                self.catalog.ensure_tier(t.name, t.capacity_bytes)
            self._opened = True
        return self

    def close(self) -> None:
        self.catalog.close()

    def backend(self, tier: str) -> Backend:
        with self._lock:
            b = self._backends.get(tier)
            if b is None:
                spec = self.config.tier(tier, "tier")
                b = open_backend(spec.url, endpoint_url=spec.endpoint_url, storage_options=spec.storage_options or None,
                                 field_name=f"tiers.{spec.name}.url",
                                 client_attempts=1)   # copies retry under config.retries (iobench.io.retry)
                if b.is_local:
                    os.makedirs(b.root, exist_ok=True)
                if spec.emulation != "none":
                    from ..wrappers import EmulatedBackend

                    b = EmulatedBackend(b, spec.emulation)
                self._backends[tier] = b
            return b

    def spec(self, tier: str) -> TierSpec:
        return self.config.tier(tier, "tier")

    def origin_tier_of(self, url: str) -> TierSpec | None:
        n = _norm_url(url)
        for t in self.config.tiers:
            root = _norm_url(t.url)
            if n == root or n.startswith(root + "/"):
                return t
        return None

    def register(self, url: str, manifest: Manifest | None = None, backend: Backend | None = None, *,
                 endpoint_url: str | None = None, storage_options: dict | None = None) -> DatasetRef:
        """Make a dataset known to the catalog (idempotent); its source copies become the origin."""
        self.open()
        origin = self.origin_tier_of(url)
        if backend is None:
            ep = endpoint_url or (origin.endpoint_url if origin else None)
            so = storage_options or (origin.storage_options if origin else None) or None
            backend = open_backend(url, endpoint_url=ep, storage_options=so, field_name="dataset", client_attempts=1)
            if origin is not None and origin.emulation != "none":
                from ..wrappers import EmulatedBackend

                backend = EmulatedBackend(backend, origin.emulation)
        if manifest is None:
            manifest = read_manifest(backend)
        ds = DatasetRef(id=dataset_id(url, manifest), url=url,
                        origin_tier=origin.name if origin else SOURCE_TIER, manifest=manifest)
        self.catalog.register_dataset(ds.id, url, ds.origin_tier,
                                      [(s.path, s.bytes, s.checksum) for s in manifest.shards])
        with self._lock:
            self._sources[ds.id] = backend
            self._datasets[ds.id] = ds
        return ds

    def source_backend(self, ds: DatasetRef) -> Backend:
        return self._sources[ds.id]

    @staticmethod
    def copy_rel(ds: DatasetRef, shard: str) -> str:
        return f"{ds.id}/{shard}"

    def check_fits(self, ds: DatasetRef, to: str, shards: Iterable[ShardEntry] | None = None,
                   whole: bool = False) -> None:
        """Fail fast when the tier cannot hold one shard (or, with ``whole``, all of ``shards``)."""
        spec = self.spec(to)
        cap = spec.capacity_bytes
        if cap is None:
            return
        sel = list(shards if shards is not None else ds.manifest.shards)
        if not sel:
            return
        biggest = max(s.bytes for s in sel)
        if biggest > cap:
            raise ConfigError(f"tiers.{to}.capacity", f"{cap} bytes is smaller than one shard ({biggest} bytes)",
                              f"give tier {to!r} at least {biggest} bytes")
        total = sum(s.bytes for s in sel)
        if whole and total > cap:
            raise ConfigError(f"tiers.{to}.capacity", f"{total} bytes to pre-stage do not fit in {cap} bytes",
                              "raise the capacity, stage fewer shards, or use --mode ondemand or stream")

    # ---- staging -------------------------------------------------------------------------
    def _source_for(self, ds: DatasetRef, shard: str, exclude: str) -> tuple[str, int | None]:
        """The fastest ready copy other than on ``exclude``, pinned while it is read: (tier, pin id)."""
        order = [t.name for t in self.config.tiers if t.name != exclude]
        found = self.catalog.find_and_pin(ds.id, shard, order)
        if found is not None:
            return found
        return ds.origin_tier, None

    def _read_backend(self, ds: DatasetRef, tier: str) -> tuple[Backend, Callable[[str], str]]:
        if tier == ds.origin_tier:
            return self.source_backend(ds), (lambda p: p)
        return self.backend(tier), (lambda p: self.copy_rel(ds, p))

    def _delete_victims(self, to: str, victims) -> None:
        b = self.backend(to)
        for v in victims:
            ref = self._datasets.get(v.dataset)
            rel = f"{v.dataset}/{v.shard}" if ref is None else self.copy_rel(ref, v.shard)
            try:
                b.rm(rel)
            except FileNotFoundError:
                pass
        with self._lock:
            self.evictions += len(victims)

    def _on_retry(self, attempt: int, err: BaseException) -> None:
        with self._lock:
            self.retries += 1

    def stage_shard(self, ds: DatasetRef, shard: ShardEntry, to: str, *, wait: bool = True,
                    wait_timeout_s: float = 600.0, report: StageReport | None = None) -> str:
        """Copy one shard into ``to``: 'staged', 'present' (already there) or 'full' (not admitted)."""
        spec = self.spec(to)
        policy = get_policy(spec.policy, f"tiers.{to}.policy")
        deadline = time.monotonic() + wait_timeout_s
        while True:
            r = self.catalog.reserve(ds.id, shard.path, to, shard.bytes, shard.checksum, spec.capacity_bytes, policy)
            if r.status == "ready":
                if report is not None:
                    report.present += 1
                return "present"
            if r.status == "full":
                if report is not None:
                    report.not_admitted += 1
                return "full"
            if r.status == "busy":
                if not wait:
                    return "busy"
                if time.monotonic() > deadline:
                    raise StorageError(f"{shard.path} on tier {to} has been staging by {r.detail} "
                                       f"for over {wait_timeout_s:.0f}s")
                time.sleep(0.05)
                continue
            break
        self._delete_victims(to, r.victims)
        src_tier, pin = self._source_for(ds, shard.path, exclude=to)
        res = self._copy_reserved(ds, shard, to, src_tier, pin)
        self.catalog.commit_copy(ds.id, shard.path, to)
        self._count_staged(report, f"{src_tier}->{to}", res, len(r.victims))
        return "staged"

    def _copy_reserved(self, ds: DatasetRef, shard: ShardEntry, to: str, src_tier: str, pin: int | None):
        """Copy a reserved shard from ``src_tier`` (pinned by ``pin``) into ``to``; the reservation is
        released on failure, the pin always.  The caller commits the copy."""
        try:
            src, rel = self._read_backend(ds, src_tier)
            return copy_verified(src, rel(shard.path), self.backend(to), self.copy_rel(ds, shard.path), shard.bytes,
                                 shard.checksum, retries=self.config.retries,
                                 backoff_s=float(self.config.retry_backoff), verify=self.config.verify,
                                 fsync=self.fsync, on_retry=self._on_retry)
        except BaseException:
            self.catalog.abort_copy(ds.id, shard.path, to)
            raise
        finally:
            if pin is not None:
                self.catalog.unpin(pin)

    def _count_staged(self, report: StageReport | None, pair: str, res, evicted: int) -> None:
        with self._lock:
            self.bytes_by_pair[pair] += res.bytes
            self.refetches += res.refetches
            if report is not None:
                report.staged += 1
                report.bytes += res.bytes
                report.refetches += res.refetches
                report.retries += res.attempts - 1
                report.evictions += evicted
                report.bytes_by_pair[pair] += res.bytes
                report.copy_latency.record_s(res.seconds)

    def prestage(self, ds: DatasetRef, to: str, shards: Iterable[ShardEntry] | None = None, *,
                 concurrency: int | None = None, progress: bool = False,
                 on_shard: Callable[[ShardEntry, str], None] | None = None) -> StageReport:
        """Copy ``shards`` (default: the whole dataset) into ``to`` before the first step.

        The calling thread keeps the catalog: it reserves a window of shards in one
        transaction, finds each one's source, hands the copies to ``concurrency`` threads and
        commits each copy as it finishes.  The copier threads only copy: when each of them
        also took the catalog's write lock twice per shard, they queued on it and on the GIL
        for a third of a local prestage's time.  The window (8 shards per copier) keeps them
        busy without holding reservations far ahead, which another process staging the same
        dataset would wait on.
        """
        sel = list(shards if shards is not None else ds.manifest.shards)
        self.check_fits(ds, to, sel, whole=True)
        self.remove_dead_temps(ds, to)
        rep = StageReport(dataset=ds.id, to=to, shards=len(sel))
        from ..dist.world import default_parallelism

        n = concurrency or self.config.concurrency or default_parallelism(len(sel))
        rep.concurrency = max(1, min(n, len(sel)))
        spec = self.spec(to)
        policy = get_policy(spec.policy, f"tiers.{to}.policy")
        t0 = now_ns()
        prog = task = None
        if progress:
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            prog = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                            TransferSpeedColumn(), transient=True)
            prog.start()
            task = prog.add_task(f"staging to {to}", total=sum(s.bytes for s in sel))

        def done(s: ShardEntry, status: str) -> None:
            if prog is not None:
                prog.advance(task, s.bytes)
            if on_shard is not None:
                on_shard(s, status)

        pending = list(reversed(sel))
        unsubmitted: list[ShardEntry] = []    # reserved in this batch, not yet handed to a copier
        # One copier goes shard by shard (each shard's on_shard runs before the next copy starts);
        # several keep copies queued (8 each), so none waits while this thread, sharing the GIL
        # with them, gets round to reserving more; 2 each left the copiers idle a sixth of the time.
        window = 1 if rep.concurrency == 1 else 8 * rep.concurrency
        # future -> (shard, source tier, reservation, pin); source tier None: stage_shard's own path (busy shards)
        inflight: dict = {}
        first_error: BaseException | None = None
        def release(cancel) -> None:
            """Drop the reservation and the source pin of each queued copy that ``cancel`` stops."""
            for f, (s, src_tier, _, pin) in list(inflight.items()):
                if src_tier is not None and cancel(f):
                    del inflight[f]
                    self.catalog.abort_copy(ds.id, s.path, to)
                    if pin is not None:
                        self.catalog.unpin(pin)

        pool = ThreadPoolExecutor(max_workers=rep.concurrency, thread_name_prefix="iobench-stage")
        try:
            while inflight or (pending and first_error is None):
                if pending and first_error is None and len(inflight) < window:
                    batch = [pending.pop() for _ in range(min(len(pending), window - len(inflight)))]
                    rs = self.catalog.reserve_many(ds.id, [(s.path, s.bytes, s.checksum) for s in batch], to,
                                                   spec.capacity_bytes, policy)
                    unsubmitted = [s for s, r in zip(batch, rs) if r.status == "reserved"]
                    for s, r in zip(batch, rs):
                        if r.status == "ready":
                            rep.present += 1
                            done(s, "present")
                        elif r.status == "full":
                            rep.not_admitted += 1
                            done(s, "full")
                        elif r.status == "busy":   # another process is copying it: wait for it there
                            inflight[pool.submit(self.stage_shard, ds, s, to, report=rep)] = (s, None, r, None)
                        else:
                            self._delete_victims(to, r.victims)
                            src_tier, pin = self._source_for(ds, s.path, exclude=to)
                            f = pool.submit(self._copy_reserved, ds, s, to, src_tier, pin)
                            inflight[f] = (s, src_tier, r, pin)
                            unsubmitted.remove(s)
                    continue
                finished, _ = wait_any(list(inflight), return_when=FIRST_COMPLETED)
                ok = []
                for f in finished:
                    s, src_tier, r, _ = inflight.pop(f)
                    try:
                        res = f.result()
                    except BaseException as e:  # keep the first error, let the running copies finish
                        if first_error is None:
                            first_error = e
                        continue
                    if src_tier is None:
                        done(s, res)
                    else:
                        ok.append((s, src_tier, r, res))
                if first_error is not None:
                    release(lambda f: f.cancel())   # copies not started yet: never start them
                if ok:
                    self.catalog.commit_copies(ds.id, [s.path for s, *_ in ok], to)
                    for s, src_tier, r, res in ok:
                        self._count_staged(rep, f"{src_tier}->{to}", res, len(r.victims))
                        done(s, "staged")
        finally:
            # Interrupted (or a progress callback failed): release what never started; a copy still
            # running keeps its reservation until this process exits (then reconcile drops it).
            release(lambda f: f.cancel())
            for s in unsubmitted:
                self.catalog.abort_copy(ds.id, s.path, to)
            pool.shutdown(wait=True)
            if prog is not None:
                prog.stop()
        if first_error is not None:
            raise first_error
        rep.seconds = (now_ns() - t0) / 1e9
        return rep

    # ---- reading (the loader's path) -----------------------------------------------------
    def read(self, ds: DatasetRef, shard: ShardEntry, to: str, mode: str = "ondemand") -> tuple[bytes, ReadInfo]:
        """The shard's bytes, from the hottest copy; on a miss in ``ondemand`` mode, also copy it into ``to``."""
        t0 = now_ns()
        if mode == "stream" or ds.origin_tier == to:
            data = self.source_backend(ds).cat(shard.path)
            return data, ReadInfo("stream" if mode == "stream" else "hit", to, ds.origin_tier, len(data),
                                  (now_ns() - t0) / 1e9)
        order = [to] + [t.name for t in self.config.tiers if t.name != to]
        found = self.catalog.find_and_pin(ds.id, shard.path, order)
        if found is not None and found[0] == to:
            try:
                data = self.backend(to).cat(self.copy_rel(ds, shard.path))
            except FileNotFoundError:
                data = None  # the catalog outlived the file (deleted by hand, lost in a crash): a miss
            finally:
                self.catalog.unpin(found[1])
            if data is not None:
                return data, ReadInfo("hit", to, to, len(data), (now_ns() - t0) / 1e9)
            self.catalog.drop_copy(ds.id, shard.path, to, force=True)
            found = self.catalog.find_and_pin(ds.id, shard.path, order[1:])
        src_tier = found[0] if found is not None else ds.origin_tier
        try:
            src, rel = self._read_backend(ds, src_tier)
            data, attempts, refetches = fetch_verified(src, rel(shard.path), shard.bytes, shard.checksum,
                                                       retries=self.config.retries,
                                                       backoff_s=float(self.config.retry_backoff),
                                                       verify=self.config.verify, on_retry=self._on_retry)
        finally:
            if found is not None:
                self.catalog.unpin(found[1])
        info = ReadInfo("bypass", to, src_tier, len(data), 0.0, refetches=refetches)
        with self._lock:
            self.refetches += refetches
        spec = self.spec(to)
        if shard.bytes <= (spec.capacity_bytes or shard.bytes):
            r = self.catalog.reserve(ds.id, shard.path, to, shard.bytes, shard.checksum, spec.capacity_bytes,
                                     get_policy(spec.policy, f"tiers.{to}.policy"))
            if r.status == "reserved":
                self._delete_victims(to, r.victims)
                try:
                    write_copy(self.backend(to), self.copy_rel(ds, shard.path), data, fsync=self.fsync)
                except BaseException:
                    self.catalog.abort_copy(ds.id, shard.path, to)
                    raise
                self.catalog.commit_copy(ds.id, shard.path, to)
                info.result, info.evicted = "miss", len(r.victims)
                with self._lock:
                    self.bytes_by_pair[f"{src_tier}->{to}"] += len(data)
        info.seconds = (now_ns() - t0) / 1e9
        return data, info

    # ---- eviction, promotion, demotion ---------------------------------------------------
    def evict(self, tier: str, ds: DatasetRef | None = None, shards: Iterable[str] | None = None,
              force_unpinned_only: bool = True) -> dict:
        """Drop cache copies from ``tier``; pinned, in-use, origin and last copies stay.  Returns counts by outcome."""
        out: Counter = Counter()
        rows = self.catalog.copies(dataset=ds.id if ds else None, tier=tier)
        wanted = set(shards) if shards is not None else None
        b = self.backend(tier)
        for row in rows:
            if wanted is not None and row["shard"] not in wanted:
                continue
            status = self.catalog.drop_copy(row["dataset"], row["shard"], tier)
            out[status] += 1
            if status == "dropped":
                try:
                    b.rm(f"{row['dataset']}/{row['shard']}")
                except FileNotFoundError:
                    pass
        return dict(out)

    def demote(self, ds: DatasetRef, shard: ShardEntry, frm: str, to: str) -> str:
        """Move a copy from ``frm`` down to ``to``: copy, verify, record, then drop it from ``frm``."""
        status = self.stage_shard(ds, shard, to)
        if status == "full":
            return "full"
        dropped = self.catalog.drop_copy(ds.id, shard.path, frm)
        if dropped == "dropped":
            try:
                self.backend(frm).rm(self.copy_rel(ds, shard.path))
            except FileNotFoundError:
                pass
        return dropped

    def pin(self, ds: DatasetRef, shard: str, tier: str) -> bool:
        return self.catalog.pin(ds.id, shard, tier) is not None

    def unpin(self, ds: DatasetRef, shard: str, tier: str) -> int:
        return self.catalog.unpin_copy(ds.id, shard, tier)

    def remove_dead_temps(self, ds: DatasetRef, tier: str) -> int:
        """Temp files a killed stage left in this dataset's copy directory on a local tier (their
        writers are dead: ``iobench.io.atomic.writer_alive``); a live stager's stay."""
        base = self.backend(tier).base
        if not base.is_local:
            return 0
        removed = 0
        top = os.path.join(base.root, ds.id)
        # a temp file stands for one of the dataset's files, or is not ours
        shards = {p for s in ds.manifest.shards for p in (s.path, s.index_path) if p}
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                stands_for = final_name_of(name)
                rel = os.path.relpath(os.path.join(dirpath, stands_for or name), top).replace(os.sep, "/")
                if stands_for is not None and rel in shards and not writer_alive(name):
                    try:
                        os.unlink(os.path.join(dirpath, name))
                        removed += 1
                    except OSError:
                        pass
        return removed

    def reconcile(self, tier: str) -> dict:
        """Clean up after crashed stagers on a local tier: forget their reservations and remove
        files the catalog does not know (orphans, temp files) — but only inside the copy
        directories the catalog created (``<tier>/<dataset id>/``).  Anything else on the tier
        (a dataset that lives there, with or without registration; the user's own files; the
        catalog) is never touched.  Safe while others stage: the directory is listed *before*
        the catalog is read, and temp files of live stagers stay."""
        b = self.backend(tier)
        base = b.base
        if not base.is_local:
            return {"removed_files": 0}
        root = base.root
        ids = {d["id"] for d in self.catalog.datasets()}
        origins = [_norm_url(d["source_url"]) for d in self.catalog.datasets() if d["source_url"]]
        seen = []
        for dirpath, dirs, files in os.walk(root):
            if dirpath == root:
                dirs[:] = [d for d in dirs if d in ids]   # descend only into copy directories we made
                continue
            for name in files:
                full = os.path.join(dirpath, name)
                if any(full == o or full.startswith(o + "/") for o in origins):
                    continue   # an origin inside a copy directory's name space: never ours to delete
                if full.startswith(self.config.catalog):
                    continue
                seen.append(os.path.relpath(full, root))
        with self.catalog.tx() as c:
            self.catalog._drop_stale(c, tier)
        keep = {f"{r['dataset']}/{r['shard']}" for r in self.catalog.copies(tier=tier, state=None)}
        # what a stager writes in a copy directory: the dataset's shards (the origin's rows name every
        # one) and temp files standing for them.  Anything else there is not ours (a user's notes beside
        # the copies): ownership by record, not by place.
        shards = {f"{r['dataset']}/{r['shard']}" for r in self.catalog.copies(state=None, include_origin=True)}
        removed = 0
        for rel in seen:
            head, name = os.path.split(rel)
            final = rel
            stands_for = final_name_of(name)
            if stands_for is not None:   # a stager's temp file: kept while its writer runs, else a leftover
                if os.path.join(head, stands_for) not in shards or writer_alive(name):
                    continue
            elif final in keep or final not in shards:
                continue
            try:
                b.rm(rel)   # Backend.rm: refuses a path that a symlink leads out of the tier
                removed += 1
            except FileNotFoundError:
                pass
        return {"removed_files": removed}

    def owned_paths(self, tier: str) -> tuple[set[str], list[str]]:
        """What on ``tier`` belongs to someone else's bookkeeping: (copy directories the catalog
        created, absolute roots of registered origins).  Lifecycle leaves both alone."""
        ds = self.catalog.datasets()
        return {d["id"] for d in ds}, [_norm_url(d["source_url"]) for d in ds if d["source_url"]]

    def usage(self) -> dict:
        return {t.name: self.catalog.usage(t.name) for t in self.config.tiers}

    def counters(self) -> dict:
        with self._lock:
            return {"bytes_by_tier_pair": dict(self.bytes_by_pair), "evictions": self.evictions,
                    "refetches": self.refetches, "retries": self.retries}
