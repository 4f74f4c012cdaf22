"""One measurement driver: generate or index, then load, then judge.

Every door that asks "can this storage feed my training step?" — ``iobench check``, smoke's
read, the default suite's loads, ``iobench load`` and MLPerf's ``--find-max`` — goes through
here, so the same question gets the same answer from each:

1. **The data** (``prepare``): a synthetic dataset generated under a target (removed at the
   end), or the user's own; one without a manifest is indexed here (format detected, the
   manifest written to the cache directory, never into the user's data).
2. **The host's ceiling** (``host_ceiling``): the same pipeline (format, access, workers,
   batch) on a copy of a few shards in memory (tmpfs), storage out of the way — what this
   host's read path can deliver.  Calibrated once per host and batch shape, cached.
3. **The load** (``iobench.loader.core.run_load``), cold by default: the dataset's pages are
   dropped and the residency measured before and after (``environment.cache``); a cold run
   stops at the end of one pass, because a second pass would read the page cache.
4. **The judgement** (``judge``): what storage delivered, counting every byte read — a
   stream's shuffle-buffer fill included — over the workers' busy time; what training needs;
   whether the host, not the storage, was the limit (within ``HOST_BOUND`` of the ceiling);
   warm-up when it is a material share of the run; and the cause a remedy must address.
"""

from __future__ import annotations

from .schema import STALL_RATIO
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterator

from .errors import ConfigError
from .units import format_bytes, format_rate, format_seconds

if TYPE_CHECKING:   # the loader (numpy, multiprocessing) loads when a measurement runs, not with the CLI
    from .loader.core import LoadConfig, LoadRun

HOST_BOUND = 0.8            # storage delivered >= 80% of the host's ceiling: the host may be the limit
WARMUP_MATERIAL = 0.10      # warm-up named in the verdict above this share of the run's wall clock
CEILING_MAX_AGE_S = 24 * 3600.0
CONTENDED = 0.25           # workers runnable but waiting for a CPU this share of their busy time: the host
CAUSES = ("none", "storage bandwidth", "per-request latency", "CPU preparation", "the host's read path",
          "CPU contention", "hand-over", "slow tail")


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class Synthetic:
    """A synthetic token dataset generated under ``target`` in a fresh prefix (removed afterwards)."""

    target: str
    format: str = "raw"
    sample_bytes: int = 128 * 1024
    samples: int | None = None        # default: enough for the time cap at the step's need, within max_bytes
    max_bytes: int = 2 << 30          # 2 GiB: 64 batches of 256 x 128 KiB, more than min_steps

    def __post_init__(self) -> None:
        if self.sample_bytes <= 0:
            raise ConfigError("--sample-size", f"must be positive, got {self.sample_bytes}", "e.g. 128KiB")
        if self.samples is not None and self.samples <= 0:
            raise ConfigError("--samples", f"must be positive, got {self.samples}", "give a number above zero")


@dataclass(frozen=True)
class DriveConfig:
    """One measurement: the load (its ``dataset`` is the user's URL, or ignored with ``synthetic``),
    where the data comes from, and how the host's ceiling is obtained."""

    load: LoadConfig
    synthetic: Synthetic | None = None
    host_ceiling: str = "cached"      # cached (calibrate once per host and batch shape) | measure | off
    one_pass_when_cold: bool = True   # a cold run stops at the end of the first pass (a second reads RAM)
    ceiling_time_s: float = 3.0       # how long a calibration of the host's ceiling reads

    def __post_init__(self) -> None:
        if self.host_ceiling not in ("cached", "measure", "off"):
            raise ConfigError("host_ceiling", f"unknown mode {self.host_ceiling!r}", "use cached, measure or off")

    @property
    def step_s(self) -> float:
        return self.load.compute_model().nominal_s


# ---------------------------------------------------------------------------------------------
# Outcome


@dataclass(frozen=True)
class Dataset:
    url: str
    format: str
    generated: bool = False
    indexed_to: str | None = None     # where the manifest this run made went (None: the dataset had one)


@dataclass(frozen=True)
class Rates:
    """Bytes per second.  ``capacity``: every byte the workers read (buffer fills included) over
    their busy time, summed over workers — what storage + loader delivered.  ``need``: batch
    bytes / step time.  ``delivered``: what the training loop received over the steady window."""

    capacity_bytes_per_s: float | None
    need_bytes_per_s: float
    delivered_bytes_per_s: float | None
    compute_s: float | None           # the mean emulated step over the steady window
    bytes_read: int
    # the samples' bytes the workers produced over their busy time: what ``need`` is compared with
    # (a format that reads each sample's bytes more than once delivers fewer samples than bytes read)
    payload_bytes_per_s: float | None = None

    @property
    def read_amplification(self) -> float | None:
        """Bytes read per byte of samples produced (1.0: each sample read once)."""
        if not self.capacity_bytes_per_s or not self.payload_bytes_per_s:
            return None
        return self.capacity_bytes_per_s / self.payload_bytes_per_s


@dataclass(frozen=True)
class Warmup:
    startup_s: float                  # worker start and storage connections, before the clock
    first_batch_s: float              # the first step's wait
    fill_s_per_worker: float          # shuffle-buffer fill (stream), mean per worker
    wall_s: float                     # the run's whole wall clock, start-up included
    share: float                      # (start-up + first batch + fill per worker) / wall, at most 1
    material: bool


@dataclass(frozen=True)
class HostCeiling:
    """What this host's read path delivers when storage is not the limit (same pipeline, data in memory)."""

    bytes_per_s: float
    samples_per_s: float
    cores: int
    key: str
    measured_at: float                # time.time()
    cached: bool
    how: str = "the same pipeline on a copy of the first shards in memory (tmpfs): no storage in the way"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Judgement:
    bound: str                        # "keeps up" | "storage" | "host" (the read path, CPU preparation, hand-over)
    cause: str                        # one of CAUSES
    advice: str                       # the remedy that addresses the cause ("" when nothing to do)


@dataclass(frozen=True)
class Outcome:
    dataset: Dataset
    run: LoadRun
    rates: Rates
    warmup: Warmup
    ceiling: HostCeiling | None
    judgement: Judgement
    cache: dict                       # environment.cache: declared, residency found / at start / after

    @property
    def metrics(self) -> dict:
        return self.run.metrics

    @property
    def environment(self) -> dict:
        return self.run.environment

    @property
    def warnings(self) -> list[str]:
        return self.run.warnings

    def to_dict(self) -> dict:
        """The driver's block of a results file (``metrics.drive``)."""
        return {"dataset": asdict(self.dataset), "rates": asdict(self.rates), "warmup": asdict(self.warmup),
                "host_ceiling": self.ceiling.to_dict() if self.ceiling else None,
                "judgement": asdict(self.judgement), "cache": self.cache}


# ---------------------------------------------------------------------------------------------
# 1. The data


def default_host_ceiling() -> str:
    """``$IOBENCH_HOST_CEILING`` (cached | measure | off), else cached: the test suite turns it off
    for the loads that do not ask about it, so that each new batch shape does not calibrate."""
    v = os.environ.get("IOBENCH_HOST_CEILING", "cached")
    return v if v in ("cached", "measure", "off") else "cached"


def cache_dir() -> str:
    """Where iobench keeps what it derives (manifests of indexed datasets, host ceilings)."""
    d = os.environ.get("IOBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "iobench")
    os.makedirs(d, exist_ok=True)
    return d


def _read_cache(path: str):
    """A JSON file of the cache directory, or None when it is absent or unusable (damaged, a FIFO: read
    through the input reader, which never blocks): a cache entry is rebuilt, never trusted or waited on."""
    from .io.inputs import read_json

    if not os.path.lexists(path):
        return None
    try:
        return read_json(path, "cache", what="cache file")
    except (OSError, ConfigError):
        return None


def _indexed_manifest(backend, url: str, say: Callable[[str], None]):
    """Index a dataset that has no manifest; the manifest goes to the cache directory, keyed by URL,
    and is reused while the dataset's file list and sizes are unchanged."""
    from .index import IndexOptions, detect_format, index_dataset
    from .manifest import INDEX_VERSION, Manifest

    fmt = detect_format(backend)   # a dataset of several formats is refused here, naming them
    listing = sorted((f, backend.fs.size(f)) for f in backend.fs.find(backend.root))
    # keyed on INDEX_VERSION too: a manifest an older scan cached is indexed again, not reused
    key = hashlib.sha256(json.dumps([url, listing, INDEX_VERSION]).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir(), "manifests", f"{key}.json")
    cached = _read_cache(path)
    if cached is not None:
        try:
            manifest = Manifest.from_dict(cached)
        except ConfigError:
            manifest = None   # a cache entry of an older iobench, or damaged: index again
        if manifest is not None:
            say(f"{url} has no manifest: detected {manifest.format}, using the index cached at {path}")
            return manifest, path
    say(f"{url} has no manifest: detected {fmt}; indexing it (the manifest goes to {path}, your data is untouched)")
    try:
        manifest = index_dataset(backend, IndexOptions(format=fmt))
    except ConfigError as e:
        raise ConfigError("--dataset", f"{url} has no manifest and indexing it as {fmt} failed ({e.problem})",
                          f"index it yourself: iobench index {url} --format FORMAT (docs/index.md)") from None
    from .io.atomic import atomic_write_bytes

    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_bytes(path, manifest.to_json(), fsync=False)
    return manifest, path


def _synthetic_samples(cfg: DriveConfig, syn: Synthetic) -> int:
    """Enough samples for the run: steps x batch when fixed, else the time cap at the step's need and
    at least min_steps (a cold run stops at the end of one pass), within ``max_bytes``; at least 4 batches."""
    b = cfg.load.batch_size
    if syn.samples:
        return syn.samples
    if cfg.load.steps:
        want = b * (cfg.load.steps + 2)
    else:
        step = max(cfg.step_s, 1e-3)
        want = max(int(b * (cfg.load.max_time_s / step + 2)), b * (cfg.load.min_steps + 2))
    return max(b * 4, min(want, syn.max_bytes // syn.sample_bytes))


@contextmanager
def prepare(cfg: DriveConfig, storage_options: dict | None = None, progress: bool = False,
            say: Callable[[str], None] = print) -> Iterator[tuple[Dataset, object]]:
    """The dataset the load reads, and its manifest; a generated one is removed on exit."""
    from .manifest import read_manifest
    from .storage import open_backend

    lc = cfg.load
    if cfg.synthetic is None:
        from .index import dataset_manifest, resolve_dataset_url

        ref = resolve_dataset_url(lc.dataset)
        if ref.only is not None:   # a brace range or one shard: those files, under their directory
            backend = open_backend(ref.root, endpoint_url=lc.endpoint_url, storage_options=storage_options,
                                   field_name="--dataset", check=True)
            manifest = dataset_manifest(backend, ref.only)
            yield Dataset(url=ref.root, format=manifest.format), manifest   # the load reads this manifest
            return
        backend = open_backend(lc.dataset, endpoint_url=lc.endpoint_url, storage_options=storage_options,
                               field_name="--dataset", check=True)
        from .manifest import MANIFEST_NAME, check_dataset_root

        check_dataset_root(backend, "--dataset")
        if backend.exists(MANIFEST_NAME):
            manifest = read_manifest(backend)
            yield Dataset(url=lc.dataset, format=manifest.format), manifest
        else:
            manifest, path = _indexed_manifest(backend, lc.dataset, say)
            yield Dataset(url=lc.dataset, format=manifest.format, indexed_to=path), manifest
        return
    from .generate import GenSpec, generate

    syn = cfg.synthetic
    base = open_backend(syn.target, endpoint_url=lc.endpoint_url, storage_options=storage_options,
                        field_name="TARGET", check=True)
    name = f"iobench-check-{secrets.token_hex(4)}"
    url = f"{syn.target.rstrip('/')}/{name}"
    n = _synthetic_samples(cfg, syn)
    spec = GenSpec.from_mapping({"format": syn.format, "modality": "tokens", "num_samples": n,
                                 "seq_len": max(1, syn.sample_bytes // 2), "token_dtype": "uint16",
                                 "vocab_size": 50257})
    if base.is_local:   # refuse a target nothing can be written under (/proc, read-only) before saying "generating"
        try:
            os.mkdir(base.path(name))
        except OSError as e:
            raise ConfigError("TARGET", f"cannot write a scratch dataset under {syn.target} ({e.strerror})",
                              "give a writable directory on the storage to check") from None
    try:
        say(f"generating {n} samples ({format_bytes(n * syn.sample_bytes)}) under {url} (removed afterwards)")
        manifest = generate(spec, url, endpoint_url=lc.endpoint_url, storage_options=storage_options,
                            progress=progress)
        yield Dataset(url=url, format=syn.format, generated=True), manifest
    finally:
        try:
            if base.fs.exists(base.path(name)):
                base.fs.rm(base.path(name), recursive=True)
        except Exception as e:  # noqa: BLE001 - say what is left; do not hide the run's own error
            say(f"warning: could not remove {url} ({type(e).__name__}); remove it by hand")


# ---------------------------------------------------------------------------------------------
# 2. The host's ceiling


def _ceiling_key(load: LoadConfig, manifest) -> str:
    from .dist.world import usable_cores

    shape = {"host": os.uname().nodename, "cores": usable_cores(), "format": manifest.format,
             "modality": manifest.modality, "compression": manifest.compression,
             "sample_bytes": manifest.total_bytes // max(1, manifest.total_samples),
             "access": load.access, "workers": load.workers, "prefetch": load.prefetch,
             "batch_size": load.batch_size, "decode": load.decode, "read_ahead": load.read_ahead,
             "odirect": load.odirect, "shuffle_buffer": load.shuffle_buffer}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def _memory_dir(need_bytes: int) -> str:
    """tmpfs when it has room (a container's /dev/shm is often 64 MB), else the temp directory: the
    copy is read right after it is written, from the page cache either way."""
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
        if os.access(shm, os.W_OK) and st.f_bavail * st.f_frsize > 2 * need_bytes:
            return shm
    except OSError:
        pass
    return tempfile.gettempdir()


def _copy_subset(manifest, backend, dest: str, want_bytes: int, workers: int = 1):
    """The first shards (at least ``want_bytes``, at least one per worker) copied to ``dest``, and their manifest."""
    from .manifest import write_manifest
    from .storage import open_backend

    from .io.pagecache import drop_pages, file_residency

    shards, total, first = [], 0, 0
    for s in manifest.shards:
        if total >= want_bytes and len(shards) >= max(2, workers):
            break
        for rel in (s.path, s.index_path):
            if rel:
                out = os.path.join(dest, rel)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                # the copy must not change the cache state the load is then measured in (`--cache as-is`)
                src = backend.local_path(rel) if backend.is_local else None
                before = file_residency(src) if src else None
                with open(out, "wb") as f:
                    f.write(backend.cat(rel))
                if src and before is not None and before < 0.05:
                    drop_pages(src)
        shards.append(replace(s, first_sample=first))
        first += s.samples
        total += s.bytes
    sub = replace(manifest, shards=tuple(shards))
    write_manifest(open_backend(dest), sub)
    return sub


def host_ceiling(load: LoadConfig, manifest, storage_options: dict | None = None, *, mode: str = "cached",
                 time_s: float = 3.0) -> HostCeiling:
    """What this host's read path delivers for this batch shape when storage is not the limit.

    The same loader (format, access, workers, prefetch, batch, decode) reads a copy of the
    dataset's first shards held in memory (tmpfs), compute 0, for about ``time_s``; the rate is
    the same one the driver reports for storage (bytes read over the workers' busy time).
    ``mode="cached"`` reuses a calibration of this host and shape under a day old."""
    from .loader.core import run_load
    from .storage import open_backend

    key = _ceiling_key(load, manifest)
    path = os.path.join(cache_dir(), "host-ceiling.json")
    table = _read_cache(path)
    if not isinstance(table, dict):
        table = {}
    hit = table.get(key)
    if mode == "cached" and hit and time.time() - hit.get("measured_at", 0) < CEILING_MAX_AGE_S:
        return HostCeiling(**{**hit, "cached": True})
    from .dist.world import usable_cores

    backend = open_backend(load.dataset, endpoint_url=load.endpoint_url, storage_options=storage_options,
                           field_name="dataset", check=True)
    batch_bytes = manifest.total_bytes / max(1, manifest.total_samples) * load.batch_size
    want = int(min(256 << 20, max(32 << 20, batch_bytes * load.workers * 8)))
    tmp = tempfile.mkdtemp(prefix="iobench-ceiling-", dir=_memory_dir(want + int(manifest.total_bytes /
                                                                              max(1, len(manifest.shards)))))
    try:
        sub = _copy_subset(manifest, backend, tmp, want, load.workers)
        cfg = replace(load, dataset=tmp, endpoint_url=None, compute="0ms", compute_mode="sleep", cache="warm",
                      emulate="none", error_rate=0.0, timeout_rate=0.0, verify_checksums=False, epochs=1,
                      until_stable=True, min_steps=20, max_time_s=time_s, steps=0,
                      batch_size=min(load.batch_size, sub.total_samples))
        run = run_load(cfg, manifest=sub)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cap = capacity_bytes_per_s(run.metrics) or 0.0
    per_sample = (run.metrics.get("bytes_read") or 0) / max(1, run.metrics.get("samples") or 1)
    out = HostCeiling(bytes_per_s=cap, samples_per_s=cap / per_sample if per_sample else 0.0, cores=usable_cores(),
                      key=key, measured_at=time.time(), cached=False)
    table[key] = {k: v for k, v in out.to_dict().items() if k != "cached"}
    from .io.atomic import atomic_write_bytes

    atomic_write_bytes(path, json.dumps(table, indent=1).encode(), fsync=False)
    return out


# ---------------------------------------------------------------------------------------------
# 3 + 4. Load and judge


def capacity_bytes_per_s(metrics: dict) -> float | None:
    """Every byte the workers read over the time they were busy reading and preparing — fill
    included — summed over workers (each is a producer of its own).  A stream's shuffle-buffer
    fill is storage's work too: leaving it out (as a steady-window service time did) claimed
    1.2 GiB/s for a run whose workers spent 30 s each filling their buffers."""
    total = 0.0
    for w in metrics.get("per_worker") or ():
        if w.get("busy_s") and w.get("bytes_read"):
            total += w["bytes_read"] / w["busy_s"]
    return total or None


def payload_bytes_per_s(metrics: dict, batch_size: int, buffered: int = 0, share: int | None = None) -> float | None:
    """The samples' bytes each worker read over its busy time, summed over workers: the samples it
    produced plus those still in its shuffle buffer (``buffered``, at most its ``share`` of the data)."""
    per_sample = (metrics.get("batch_bytes") or 0) / max(1, batch_size)
    total = 0.0
    for w in metrics.get("per_worker") or ():
        if w.get("busy_s") and w.get("samples"):
            n = w["samples"] + buffered
            if share is not None:
                n = max(w["samples"], min(n, share))
            total += n * per_sample / w["busy_s"]
    return total or None


def _delivered(metrics: dict) -> tuple[float | None, float | None]:
    """``(delivered, compute_s)`` over the steady window: batch bytes x steps / Σ step time — what
    the training loop received, each batch's hand-over included — and the mean emulated step."""
    s = metrics.get("series") or {}
    win = metrics.get("steady_window") or {}
    k0, k1 = win.get("from_step"), win.get("to_step")
    if not s.get("step_s") or k0 is None or k1 is None or k1 <= k0:
        return None, None
    bb = metrics.get("batch_bytes") or 0
    steps_w, comp_w = s["step_s"][k0:k1], s["compute_s"][k0:k1]
    return (bb * len(steps_w) / sum(steps_w) if sum(steps_w) > 0 else None), sum(comp_w) / len(comp_w)


def rates(metrics: dict, step_s: float, load: LoadConfig | None = None, manifest=None) -> Rates:
    delivered, compute_s = _delivered(metrics)
    batch_size = load.batch_size if load is not None else 1
    buffered, share = 0, None
    if load is not None and manifest is not None:
        share = -(-manifest.total_samples // max(1, load.workers))   # W=0: the consumer is the one producer
        if metrics.get("access") == "stream" and load.shuffle:
            buffered = load.shuffle_buffer
    return Rates(capacity_bytes_per_s=capacity_bytes_per_s(metrics),
                 need_bytes_per_s=(metrics.get("batch_bytes") or 0) / step_s if step_s > 0 else 0.0,
                 delivered_bytes_per_s=delivered, compute_s=compute_s, bytes_read=int(metrics.get("bytes_read") or 0),
                 payload_bytes_per_s=payload_bytes_per_s(metrics, batch_size, buffered, share))


def warmup(metrics: dict, workers: int) -> Warmup:
    startup = metrics.get("startup_s") or 0.0
    first = metrics.get("time_to_first_batch_s") or 0.0
    fill = (metrics.get("fill_io_s_total") or 0.0) / max(1, workers)
    wall = metrics.get("wall_s_with_startup") or metrics.get("wall_s") or 0.0
    # the first batch's wait includes the fill of the worker that made it: count the longer of the two
    share = min(1.0, (startup + max(first, fill)) / wall) if wall > 0 else 0.0
    return Warmup(startup_s=startup, first_batch_s=first, fill_s_per_worker=fill, wall_s=wall, share=share,
                  material=share > WARMUP_MATERIAL)


def judge(metrics: dict, environment: dict, r: Rates, ceiling: HostCeiling | None, workers: int) -> Judgement:
    """The bound (keeps up / storage / host) and the cause a remedy must address."""
    stall = metrics.get(STALL_RATIO) or 0.0
    cap = r.capacity_bytes_per_s
    host_bound = bool(ceiling and cap and ceiling.bytes_per_s > 0 and cap >= HOST_BOUND * ceiling.bytes_per_s)
    if stall <= 0.01:
        return Judgement("host" if host_bound else "keeps up", "none", "")
    contention = cpu_contention(metrics)
    if contention is not None and contention > CONTENDED:
        return Judgement("host", "CPU contention",
                         f"the workers waited {contention:.0%} of their busy time for a CPU (other processes on "
                         "this host): the storage number is a lower bound; measure on a quieter host, or with "
                         "cores to spare")
    if host_bound:
        return Judgement("host", "the host's read path",
                         f"this host's {ceiling.cores} core{'s' if ceiling.cores != 1 else ''} read no faster "
                         f"({format_rate(ceiling.bytes_per_s)} from memory): faster storage would not help here; "
                         "more cores, or fewer per-batch copies, would")
    feed = r.payload_bytes_per_s or cap      # the samples' bytes, what the need is counted in
    if feed and feed < r.need_bytes_per_s:
        pw = metrics.get("per_worker") or []
        busy = sum(w.get("busy_s") or 0 for w in pw)
        io = sum((w.get("io_s") or 0) + (w.get("fill_s") or 0) for w in pw)
        if busy > 0 and (busy - io) / busy > 0.5:
            return Judgement("host", "CPU preparation",
                             f"parsing/decoding takes {(busy - io) / busy:.0%} of the workers' time: more workers "
                             "(one per free core) or cheaper preparation")
        reqs = metrics.get("requests") or 0
        per_req_s = io / reqs if reqs else 0.0
        per_req_b = r.bytes_read / reqs if reqs else 0.0
        emu = environment.get("emulation") or {}
        latency_emulated = emu.get("kind", "none") != "none" and not emu.get("bandwidth_bytes_per_s")
        if latency_emulated or (per_req_b <= 256 * 1024 and per_req_s >= 0.005):
            return Judgement("storage", "per-request latency",
                             f"each read of {format_bytes(per_req_b)} took {format_seconds(per_req_s)}: more reads in "
                             "flight hide it (more workers, --read-ahead)")
        return Judgement("storage", "storage bandwidth",
                         "faster storage, a faster tier, or staging; more workers share the same bandwidth")
    if r.delivered_bytes_per_s and feed and r.delivered_bytes_per_s < 0.9 * feed:
        # the workers read faster than the step needs; the loop did not receive it: this host's side
        return Judgement("host", "hand-over",
                         "each batch's hand-over from its worker to the loop (pipe, wake-up, batch view) is the "
                         "gap: fewer, larger batches, or a longer step")
    return Judgement("storage", "slow tail", "the slow batches (P99) outlast the prefetch: deeper prefetch")


def cpu_contention(metrics: dict) -> float | None:
    """The share of the workers' busy time they spent runnable but waiting for a CPU (schedstat)."""
    busy = delay = 0.0
    for w in metrics.get("per_worker") or ():
        if w.get("run_delay_s") is None or not w.get("busy_s"):
            return None
        busy, delay = busy + w["busy_s"], delay + w["run_delay_s"]
    return delay / busy if busy > 0 else None


def _residency_after(metrics: dict, environment: dict, load: LoadConfig, manifest,
                     storage_options: dict | None) -> dict:
    """environment.cache with the residency found before the run, at its start and after it."""
    from .io.pagecache import residency
    from .storage import open_backend

    cache = dict(environment.get("cache") or {})
    if cache.get("measured_residency") is not None:
        backend = open_backend(load.dataset, endpoint_url=load.endpoint_url, storage_options=storage_options,
                               field_name="dataset")
        cache["residency_after"] = residency(backend, [s.path for s in manifest.shards])
    else:
        cache.setdefault("residency_after", None)
    return cache


def _cold_steps(load: LoadConfig, manifest) -> tuple[int, str | None]:
    """The steps a cold run can take: one pass (a second would read the page cache), less, for a
    stream, the end of the pass where the workers' shuffle buffers drain with no reads behind them
    (batches storage did not have to deliver: at 1000 samples of 128 KiB per buffer they hid a
    bandwidth stall of 20% entirely on a 1024-sample dataset)."""
    from .loader.schedule import resolve_access

    total = usable = manifest.total_samples
    note = None
    if resolve_access(load.access, manifest.format, manifest) == "stream" and load.shuffle:
        usable -= load.workers * load.shuffle_buffer
        if usable < total // 2:
            usable = total
            note = (f"the workers' shuffle buffers ({load.workers} x {load.shuffle_buffer} samples) hold over half "
                    f"the dataset's {total}: its last batches come from the buffers, not from storage (a bigger "
                    "dataset, or a smaller --shuffle-buffer, measures storage)")
    one_pass = max(2, usable // load.batch_size)
    return (min(load.steps, one_pass) if load.steps else one_pass), note


def measure(cfg: DriveConfig, dataset: Dataset, manifest, storage_options: dict | None = None,
            progress: bool = False, source=None, **run_kw) -> Outcome:
    """Host ceiling, then the load (cold by default), then the judgement.  ``run_kw``: rank, world,
    deliver... passed to ``run_load``."""
    from .loader.core import run_load

    load = replace(cfg.load, dataset=dataset.url)
    note = None
    ceiling = None if cfg.host_ceiling == "off" or source is not None else \
        host_ceiling(load, manifest, storage_options, mode=cfg.host_ceiling, time_s=cfg.ceiling_time_s)
    if load.cache == "cold" and cfg.one_pass_when_cold:
        steps, note = _cold_steps(load, manifest)
        load = replace(load, epochs=1, steps=steps)
    run = run_load(load, storage_options, progress=progress, manifest=manifest, source=source, **run_kw)
    if load.cache == "cold" and cfg.one_pass_when_cold and note:
        run.warnings.append(note)
    cache = _residency_after(run.metrics, run.environment, load, manifest, storage_options)
    run.environment["cache"] = cache
    if ceiling is not None:
        run.environment["host_ceiling"] = ceiling.to_dict()
    r = rates(run.metrics, cfg.step_s, load, manifest)
    outcome = Outcome(dataset=dataset, run=run, rates=r, warmup=warmup(run.metrics, load.workers), ceiling=ceiling,
                      judgement=judge(run.metrics, run.environment, r, ceiling, load.workers), cache=cache)
    if load.cache == "cold" and cfg.one_pass_when_cold and run.metrics["steps"] >= run.metrics["steps_planned"] \
            and not run.metrics.get("stable", True):
        run.warnings.append(f"the dataset holds {run.metrics['steps_planned']} batches for one cold pass (a stream's "
                            "shuffle buffers' drain left out): not enough for narrow intervals (a bigger dataset, "
                            "or --cache warm for page-cache numbers)")
    return outcome


def drive(cfg: DriveConfig, storage_options: dict | None = None, progress: bool = False,
          say: Callable[[str], None] = print) -> Outcome:
    """Generate or index, then load, then judge (a generated dataset is removed at the end)."""
    with prepare(cfg, storage_options, progress, say) as (dataset, manifest):
        return measure(cfg, dataset, manifest, storage_options, progress)


# ---------------------------------------------------------------------------------------------
# Phrases the verdicts share


def cache_phrase(cache: dict) -> str:
    """'cold: 0.2% of the dataset resident' — what the run's data really was."""
    declared = cache.get("declared", "as-is")
    r = cache.get("measured_residency")
    if r is None:
        note = cache.get("note") or "residency not measurable"
        return f"{declared} ({note.split(';')[0]})" if declared != "as-is" else f"page cache as found ({note})"
    if declared == "warm":
        return f"warm: {r:.1%} of the dataset in the page cache (page-cache numbers, not storage)"
    if declared == "as-is":
        return f"page cache as found: {r:.1%} of the dataset resident (--cache cold for storage numbers)"
    return f"cold: {r:.1%} of the dataset resident"


def warmup_phrase(w: Warmup, access: str) -> str:
    if not w.material:
        return ""
    if w.fill_s_per_worker >= max(w.startup_s, 0.5 * w.first_batch_s) and w.fill_s_per_worker > 0:
        return (f"the shuffle buffer took {format_seconds(w.fill_s_per_worker)} to fill per worker "
                f"({w.share:.0%} of the run, counted in what storage delivered)")
    return (f"warm-up (worker start {format_seconds(w.startup_s)}, first batch {format_seconds(w.first_batch_s)}) "
            f"was {w.share:.0%} of the run")


def ceiling_phrase(o: Outcome) -> str:
    c = o.ceiling
    if o.judgement.bound == "host" and o.judgement.cause in ("hand-over", "CPU preparation", "CPU contention"):
        # the limit clause already names the host-side cause; this says what it means for the storage number
        return ("host-bound: the storage may deliver more, the answer is a lower bound"
                + (f" (host ceiling {format_rate(c.bytes_per_s)})" if c else ""))
    if c is None:
        return ""
    if o.judgement.bound == "host":
        return (f"host-bound: storage can deliver more than this host's {c.cores} core{'s' if c.cores != 1 else ''} "
                f"can read ({format_rate(c.bytes_per_s)} from memory): the answer is a lower bound")
    return f"host ceiling {format_rate(c.bytes_per_s)}"
