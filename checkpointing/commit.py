"""The save pipeline: snapshot → local write → (async) commit to the durable tier → retention.

``Checkpointer.save(step, live)`` pays only the snapshot (a copy into reused staging
buffers) in ``async`` mode; a writer thread then writes the rank files to the local tier
and publishes a local manifest, and an uploader thread copies them to the durable tier and
publishes the durable manifest last.  Between them sits a bounded queue.  When a save
arrives while ``queue_depth + 1`` earlier saves are still uncommitted, the policy decides:

  block     wait until there is room (the wait is reported)
  skip      do not save this step (reported as skipped)
  coalesce  save, and drop the oldest save not yet uploading (reported as coalesced)

A background error is never lost: it is kept, with the step, and the next ``save`` or
``wait`` raises the original exception.  ``sync`` mode runs the same stages inline.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from iobench.config import check_choice
from iobench.errors import ConfigError, StorageError
from iobench.storage import Backend

from . import commit_point as cp
from .hooks import crashpoint
from .local_writer import copy_file, copy_files_local, write_buffer, write_buffers_local
from .retention import RetentionPolicy, apply_retention
from .snapshot import LiveState, Staging
from .state import StateSpec
from iobench.io.ratelimit import RateLimiter

MODES = ("sync", "async")
POLICIES = ("block", "skip", "coalesce")


@dataclass(frozen=True)
class EngineConfig:
    mode: str = "async"
    policy: str = "block"
    queue_depth: int = 1
    fsync: bool = True
    keep_local: int = 2
    keep_durable: int = 3
    keep_every: int = 0
    durable_bw: float | None = None   # bytes/s cap on the upload (emulation)
    local_bw: float | None = None     # bytes/s cap on the local write (emulation)

    def __post_init__(self):
        check_choice("mode", self.mode, MODES)
        check_choice("policy", self.policy, POLICIES)
        if self.queue_depth < 0:
            raise ConfigError("queue_depth", f"must be 0 or more, got {self.queue_depth}", "use e.g. 1")
        RetentionPolicy(self.keep_local)
        RetentionPolicy(self.keep_durable, self.keep_every)
        for f in ("durable_bw", "local_bw"):
            v = getattr(self, f)
            if v is not None and v <= 0:
                raise ConfigError(f, f"must be positive, got {v}", "give e.g. 200MB")


@dataclass
class SaveRecord:
    """One save's timeline (perf_counter seconds) and outcome."""

    step: int
    t_call: float
    status: str = "pending"          # pending | committed | skipped | coalesced | failed
    backlog: int = 0                 # uncommitted saves when this one was called
    wait_s: float = 0.0              # waiting for staging or queue room (policy block)
    snapshot_s: float = 0.0
    blocking_s: float = 0.0          # what the training step paid
    local_write_s: float | None = None
    local_bytes: int = 0
    t_local_done: float | None = None
    upload_s: float | None = None
    t_durable: float | None = None
    error: str | None = None
    conditional_publish: bool | None = None
    commit_info: dict = field(default_factory=dict)
    deleted: list = field(default_factory=list)

    @property
    def commit_latency_s(self) -> float | None:
        return None if self.t_durable is None else self.t_durable - self.t_call

    def to_dict(self, t0: float = 0.0) -> dict:
        def rel(t):
            return None if t is None else t - t0
        return {"step": self.step, "status": self.status, "backlog": self.backlog, "wait_s": self.wait_s,
                "snapshot_s": self.snapshot_s, "blocking_s": self.blocking_s, "local_write_s": self.local_write_s,
                "local_bytes": self.local_bytes, "upload_s": self.upload_s,
                "commit_latency_s": self.commit_latency_s, "t_call": rel(self.t_call),
                "t_snapshot_done": rel(self.t_call + self.wait_s + self.snapshot_s),
                "t_local_done": rel(self.t_local_done), "t_durable": rel(self.t_durable), "error": self.error}


class Checkpointer:
    """Saves a ``LiveState`` to a local tier and/or a durable tier; see the module docstring."""

    def __init__(self, spec: StateSpec, ranks: list[int], local: Backend | None, durable: Backend | None,
                 config: EngineConfig = EngineConfig(), on_commit: Callable[[SaveRecord], None] | None = None,
                 commit: Callable[..., dict] | None = None, retain_durable: bool = True):
        """``commit(tier, manifest, fsync=)`` publishes the durable tier's manifest (default
        ``commit_point.publish``); several processes saving one checkpoint pass one that first
        gathers every process's files (checkpointing.world).  ``retain_durable`` False leaves
        the durable tier's retention to another process."""
        if local is None and durable is None:
            raise ConfigError("--durable", "no tier to save to", "give --local and/or --durable")
        if local is not None and durable is not None:
            from iobench.paths import Held, check_disjoint, root_key

            # Nested tiers: rotation on one deletes the other's committed steps.
            check_disjoint([Held("--durable", "durable", root_key(durable.base.url), durable.base.url),
                            Held("--local", "local", root_key(local.base.url), local.base.url)],
                           "the local and durable tiers must be different places, neither inside the other")
        self.spec, self.ranks, self.local, self.durable, self.config = spec, list(ranks), local, durable, config
        self.on_commit = on_commit
        self.commit = commit or cp.publish
        self.retain_durable = retain_durable
        self.staging = Staging(spec, ranks)
        self.records: list[SaveRecord] = []
        self.first = local if local is not None else durable
        self._cv = threading.Condition()
        self._inflight: dict[int, SaveRecord] = {}
        self._staging_busy = False
        self._uploads: deque[tuple[SaveRecord, cp.CheckpointManifest]] = deque()
        self._writes: deque[SaveRecord] = deque()
        self._error: BaseException | None = None
        self._error_step: int | None = None
        self._closed = False
        self._local_throttle = RateLimiter(config.local_bw) if config.local_bw else None
        self._durable_throttle = RateLimiter(config.durable_bw) if config.durable_bw else None
        self._threads: list[threading.Thread] = []
        for tier in (local, durable):
            if tier is not None:
                tier.makedirs("")
        if config.mode == "async":
            self._threads.append(threading.Thread(target=self._writer_loop, name="ckpt-writer", daemon=True))
            if local is not None and durable is not None:
                self._threads.append(threading.Thread(target=self._uploader_loop, name="ckpt-uploader", daemon=True))
            for t in self._threads:
                t.start()

    # ------------------------------------------------------------------ public API
    def save(self, step: int, live: LiveState) -> SaveRecord:
        self._raise_pending()
        if self.records and int(step) <= self.records[-1].step:
            raise ConfigError("step", f"{step} is not after the previous save's step {self.records[-1].step}",
                              "save with increasing step numbers")
        rec = SaveRecord(step=int(step), t_call=time.perf_counter())
        self.records.append(rec)
        if self.config.mode == "sync":
            return self._save_sync(rec, live)
        cfg = self.config
        with self._cv:
            rec.backlog = len(self._inflight)
            full = len(self._inflight) >= cfg.queue_depth + 1
            if cfg.policy == "skip" and (full or self._staging_busy):
                rec.status = "skipped"
                return rec
            while self._staging_busy or (cfg.policy == "block" and len(self._inflight) >= cfg.queue_depth + 1):
                if self._error is not None:
                    break
                self._cv.wait(0.05)
            rec.wait_s = time.perf_counter() - rec.t_call
            if self._error is not None:
                rec.status, rec.error = "failed", f"not taken: step {self._error_step} failed first"
            self._raise_pending_locked()
            self._staging_busy = True
            self._inflight[rec.step] = rec
        rec.snapshot_s = self.staging.snapshot(live) / 1e9
        rec.blocking_s = rec.wait_s + rec.snapshot_s
        with self._cv:
            self._writes.append(rec)
            self._cv.notify_all()
        return rec

    def wait(self) -> None:
        """Block until every accepted save is committed (or failed); raise a background error."""
        with self._cv:
            while self._inflight and self._error is None:
                self._cv.wait(0.05)
        self._raise_pending()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            for t in self._threads:
                t.join(timeout=30)

    def abort(self, timeout_s: float = 30.0) -> None:
        """Stop (Ctrl-C, SIGTERM): queued saves are dropped, never started, a throttled save in progress is
        cut short (its step discarded), and the threads are joined, so a clean-up after this sees every file they will ever write."""
        with self._cv:
            self._writes.clear()
            self._uploads.clear()
            self._closed = True
            self._cv.notify_all()
        for throttle in (self._local_throttle, self._durable_throttle):
            if throttle is not None:
                throttle.cancel()   # a throttled save in progress stops now (its step is discarded, never committed)
        for t in self._threads:
            t.join(timeout=timeout_s)

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            with self._cv:
                self._closed = True
                self._cv.notify_all()

    @property
    def inflight_steps(self) -> set[int]:
        with self._cv:
            return set(self._inflight)

    # ------------------------------------------------------------------ errors
    def _raise_pending(self) -> None:
        with self._cv:
            self._raise_pending_locked()

    def _raise_pending_locked(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _fail(self, rec: SaveRecord, err: BaseException) -> None:
        rec.status = "failed"
        rec.error = f"{type(err).__name__}: {err}"
        with self._cv:
            if self._error is None:
                self._error, self._error_step = err, rec.step
            self._inflight.pop(rec.step, None)
            # Saves queued behind a failed one are dropped, never committed.
            while self._uploads:
                r, _ = self._uploads.popleft()
                r.status, r.error = "failed", f"dropped after the failure of step {rec.step}"
                self._inflight.pop(r.step, None)
            self._cv.notify_all()
        self._discard(self.first, rec.step)

    @staticmethod
    def _discard(tier: Backend | None, step: int) -> None:
        if tier is None:
            return
        try:
            if not cp.is_committed(tier, step):
                cp.remove_own_files(tier, step)   # only what iobench wrote there (cp.written_here)
        except Exception:  # best effort: leftovers are uncommitted and retention removes them later
            pass

    # ------------------------------------------------------------------ stages
    def _write_first_tier(self, rec: SaveRecord) -> cp.CheckpointManifest:
        """Staging → rank files on the first tier, then that tier's manifest."""
        tier = self.first
        d = cp.step_dir(rec.step)
        _refuse_committed(tier, rec.step)
        tier.makedirs(d)
        throttle = self._local_throttle if tier is self.local else self._durable_throttle
        if throttle is not None:
            throttle.start()
        t0 = time.perf_counter()
        items = [(f"{d}/{cp.rank_file(r)}", self.staging.buffers[r]) for r in self.ranks]
        if tier.is_local:
            digests = write_buffers_local(tier, items, fsync=self.config.fsync, throttle=throttle)
        else:
            digests = [write_buffer(tier, rel, buf, fsync=self.config.fsync, throttle=throttle)[0]
                       for rel, buf in items]
        files = []
        for r, digest in zip(self.ranks, digests):
            buf = self.staging.buffers[r]
            shards = tuple(zip(self.staging.shards[r], self.staging.offsets[r]))
            files.append(cp.RankFile(rank=r, path=cp.rank_file(r), bytes=int(buf.nbytes), checksum=digest,
                                     shards=shards))
            rec.local_bytes += int(buf.nbytes)
        manifest = cp.CheckpointManifest(step=rec.step, spec=self.spec, files=tuple(files))
        crashpoint("before_local_manifest")
        publish = self.commit if tier is self.durable else cp.publish
        t_files = time.perf_counter()
        info = publish(tier, manifest, fsync=self.config.fsync)
        rec.commit_info = info
        # A shared commit waits for the other processes: that wait is commit latency, not this
        # process's write time.
        rec.local_write_s = (t_files if publish is not cp.publish else time.perf_counter()) - t0
        rec.t_local_done = time.perf_counter()
        if tier is self.durable:
            rec.conditional_publish = info.get("conditional")
        return manifest

    def _upload(self, rec: SaveRecord, manifest: cp.CheckpointManifest) -> None:
        """Local rank files → durable tier, then the durable manifest (the commit point)."""
        if self._durable_throttle is not None:
            self._durable_throttle.start()
        t0 = time.perf_counter()
        info = upload_step(self.local, self.durable, manifest, fsync=self.config.fsync,
                           throttle=self._durable_throttle, publish=self.commit)
        rec.commit_info = info
        rec.conditional_publish = info.get("conditional")
        rec.upload_s = time.perf_counter() - t0

    def _committed(self, rec: SaveRecord) -> None:
        rec.t_durable = time.perf_counter()
        rec.status = "committed"
        crashpoint("after_commit")
        with self._cv:
            self._inflight.pop(rec.step, None)
            protect = set(self._inflight)
            self._cv.notify_all()
        # Retention runs only now that this step is durable; in-flight steps are protected.
        try:
            if self.durable is not None and self.retain_durable:
                rec.deleted += apply_retention(self.durable, RetentionPolicy(self.config.keep_durable,
                                                                             self.config.keep_every), protect)
            if self.local is not None:
                rec.deleted += apply_retention(self.local, RetentionPolicy(self.config.keep_local), protect)
        except Exception as e:  # the step stays committed; the error still reaches the caller
            rec.error = f"retention: {type(e).__name__}: {e}"
            with self._cv:
                if self._error is None:
                    self._error, self._error_step = e, rec.step
        if self.on_commit is not None:
            self.on_commit(rec)

    def _save_sync(self, rec: SaveRecord, live: LiveState) -> SaveRecord:
        rec.snapshot_s = self.staging.snapshot(live) / 1e9
        with self._cv:
            self._inflight[rec.step] = rec
        try:
            manifest = self._write_first_tier(rec)
            if self.local is not None and self.durable is not None:
                self._upload(rec, manifest)
            self._committed(rec)
        except BaseException as e:
            self._fail(rec, e)
            with self._cv:
                self._error = None
            raise
        finally:
            rec.blocking_s = time.perf_counter() - rec.t_call
        return rec

    # ------------------------------------------------------------------ threads
    def _writer_loop(self) -> None:
        while True:
            with self._cv:
                while not self._writes and not self._closed:
                    self._cv.wait(0.1)
                if not self._writes and self._closed:
                    return
                rec = self._writes.popleft()
            try:
                manifest = self._write_first_tier(rec)
            except BaseException as e:
                with self._cv:
                    self._staging_busy = False
                self._fail(rec, e)
                continue
            with self._cv:
                self._staging_busy = False
                self._cv.notify_all()
            if self.local is None or self.durable is None:
                try:
                    self._committed(rec)
                except BaseException as e:
                    self._fail(rec, e)
                continue
            with self._cv:
                if self.config.policy == "coalesce":
                    while len(self._uploads) >= max(1, self.config.queue_depth):
                        old, _ = self._uploads.popleft()
                        old.status = "coalesced"
                        self._inflight.pop(old.step, None)
                self._uploads.append((rec, manifest))
                self._cv.notify_all()

    def _uploader_loop(self) -> None:
        while True:
            with self._cv:
                while not self._uploads and not self._closed:
                    self._cv.wait(0.1)
                if not self._uploads and self._closed:
                    return
                rec, manifest = self._uploads.popleft()
            try:
                self._upload(rec, manifest)
                self._committed(rec)
            except BaseException as e:
                self._fail(rec, e)
                if self.durable is not None:
                    self._discard(self.durable, rec.step)


def _refuse_committed(tier: Backend, step: int) -> None:
    # Writing rank files of a committed step would corrupt a good checkpoint before the manifest
    # publish could refuse it; check first.
    if cp.is_committed(tier, step):
        raise StorageError(f"{tier.url.rstrip('/')}/{cp.step_dir(step)}: step already committed")


def upload_step(local: Backend, durable: Backend, manifest: cp.CheckpointManifest, fsync: bool = True,
                throttle: RateLimiter | None = None, publish: Callable[..., dict] = cp.publish) -> dict:
    """Copy a locally committed step's rank files to ``durable``, then publish its manifest there."""
    d = cp.step_dir(manifest.step)
    _refuse_committed(durable, manifest.step)
    durable.makedirs(d)
    if durable.supports_bulk_transfer and throttle is None and len(manifest.files) > 1:
        # One bulk put: s3fs uploads the files concurrently (multipart where large), like a plain put.
        try:
            durable.fs.put([local.local_path(f"{d}/{f.path}") for f in manifest.files],
                           [durable.path(f"{d}/{f.path}") for f in manifest.files])
        except OSError as e:
            raise StorageError(f"{durable.url.rstrip('/')}/{d}: upload failed ({e})") from e
        crashpoint("mid_upload")
    elif durable.is_local:
        copy_files_local(local, durable, [f"{d}/{f.path}" for f in manifest.files], fsync=fsync, throttle=throttle)
    else:
        for f in manifest.files:
            copy_file(local, f"{d}/{f.path}", durable, f"{d}/{f.path}", fsync=fsync, throttle=throttle)
    return publish(durable, manifest, fsync=fsync)


def _probe_tcp(endpoint_url: str, field_name: str) -> None:
    """A refused connection fails at once, instead of after the S3 client's retries."""
    import socket
    from urllib.parse import urlparse

    from iobench.errors import EndpointError

    u = urlparse(endpoint_url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname, port), timeout=5).close()
    except OSError as e:
        raise EndpointError(field_name, f"cannot reach {endpoint_url} ({e.strerror or type(e).__name__})",
                            "check --endpoint-url and that the server is running") from e


def check_durable(backend: Backend, field_name: str = "--durable") -> None:
    """Fail fast (exit 2) when the durable tier cannot be reached."""
    if backend.speaks_s3 and backend.endpoint_url:
        _probe_tcp(backend.endpoint_url, field_name)
    backend.check_reachable(field_name)
    if backend.is_local:
        import os

        try:
            os.makedirs(backend.root, exist_ok=True)
        except OSError as e:
            raise ConfigError(field_name, f"cannot create {backend.root} ({e.strerror})",
                              "give a writable directory") from e


__all__ = ["Checkpointer", "EngineConfig", "SaveRecord", "MODES", "POLICIES", "check_durable", "upload_step"]
