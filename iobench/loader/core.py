"""The loader run: sampler → W worker processes → Q prefetch slots → consumer step loop.

``run_load(cfg)`` reads a dataset through its manifest and the format readers, hands
each batch to the consumer as a shared-memory view, emulates the step's compute, and
returns a ``iobench.schema.LoadMetrics`` (as its dict): per-step wait and compute, stall ratio (first
step excluded), throughput counted at the backend, HDR histograms of batch wait, batch
I/O and per-operation read latency, queue depth and psutil samples over time.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..blockdev import DeviceCounter
from ..bounds import memory_cap
from ..config import check_choice
from ..dist.world import usable_cores
from ..errors import ConfigError
from ..index import dataset_manifest, resolve_dataset_url
from ..io.pagecache import STATES as CACHE_STATES, set_cache_state
from ..io.retry import RetryPolicy
from ..metrics import LatencyHistogram, encoded_seconds, now_ns, summarize_seconds
from ..schema import P99_SERVICE_INTERVAL, P99_WAIT_INTERVAL, STALL_RATIO, LoadMetrics, Stability, StepSeries
from ..storage import S3_CLIENTS, Backend, open_backend
from ..synth import token_dtype_for
from ..units import format_bytes, parse_size
from ..wrappers import EmulationSpec, parse_emulation, resolve_emulation
from .compute import MODES, Compute, ComputeModel, parse_compute
from .delivery import Delivery, as_delivery, get_delivery
from .memmap import MappedSource, check_memmap
from .sampler import ACCESS_PATTERNS, order_of
from .schedule import Schedule, build_schedule
from .source import ShardSource, backend_source
from .stability import StopRule, service, steady_verdict, steady_window, window_stall
from .verifying import VerifyingSource, check_sizes, merge_verify

if TYPE_CHECKING:
    from ..manifest import Manifest

START_METHODS = ("fork", "forkserver", "spawn")
_SPIN_S = 0.002   # how long the consumer (and a worker, for its slot) polls before it sleeps on a pipe


BLOCK_READS = ("read", "mmap")   # how block access gets a local shard's rows (LocalFileSource.read_block_records)


@dataclass(frozen=True)
class LoadConfig:
    dataset: str
    workers: int = 2                  # 0: batches made in the consumer process (iobench.loader.inprocess)
    prefetch: int = 2                 # Q: batches ready (or being filled) ahead of the consumer
    batch_size: int = 32
    epochs: int = 1
    steps: int = 0                    # > 0: stop after this many steps (epochs repeat as needed)
    shuffle: bool = True
    shuffle_buffer: int = 1000
    drop_last: bool = False
    seed: int = 0
    compute: str = "0ms"              # 200ms | normal:mean=..,std=.. | lognormal:p50=..,p99=.. | file:PATH
    compute_mode: str = "sleep"       # sleep | spin | callback
    compute_fn: str | None = None     # module:function for callback mode
    cache: str = "as-is"              # cold | warm | as-is
    emulate: str = "none"             # see iobench.wrappers
    decode: bool = False              # images: JPEG -> RGB arrays in the workers
    device: str = "cpu"
    endpoint_url: str | None = None
    s3_block_size: str = "8MiB"
    s3_concurrency: int = 4
    s3_client: str = "auto"           # auto (obstore when installed) | s3fs | obstore
    retries: int = 5
    retry_budget_s: float = 30.0
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    slot_bytes: int = 0               # 0: sized from the manifest
    odirect: bool = False             # local files: O_DIRECT reads (bypass the page cache)
    block_read: str = "read"          # block, local token rows: read (a preadv per shard) | mmap (mapped shards)
    verify_checksums: bool = False    # check each shard's manifest checksum as it is read (iobench.loader.verifying)
    read_ahead: int = 0               # block: blocks each worker reads ahead of the one it is collating;
                                      # map: extra sample reads each worker keeps in flight
    access: str = "auto"              # map | stream | block | auto (raw, files -> map; others -> stream)
    stream_read_size: str = "64KiB"   # stream: whole samples per piece of a shard's streamed read
    # stream: the workers advance in rounds (round_need): one starts a batch of round r only once every
    # batch of round r - 1 was sent, as tf.data's deterministic interleave keeps its files together
    lockstep: bool = False
    until_stable: bool = False        # run until the stall and P99 intervals are narrow (or max_time_s)
    min_steps: int = 50               # until_stable: never stop before this many steps
    max_time_s: float = 60.0          # until_stable: time cap (the results then say "not stable")
    stall_ci: float = 0.02            # until_stable: stall interval half-width to reach (0.02 = ±2 pp)
    p99_ci: float = 0.25              # until_stable: P99 batch-time interval half-width, relative
    monitor_interval_s: float = 0.5
    start_method: str = "fork"

    def __post_init__(self) -> None:
        for name, low in (("workers", 0), ("prefetch", 1), ("batch_size", 1), ("epochs", 1),
                          ("s3_concurrency", 1), ("retries", 1), ("min_steps", 2)):
            v = getattr(self, name)
            if v < low:
                raise ConfigError(f"load.{name}", f"must be at least {low}, got {v}", f"give {name} >= {low}")
        for name in ("steps", "shuffle_buffer", "seed", "slot_bytes", "read_ahead"):
            if getattr(self, name) < 0:
                raise ConfigError(f"load.{name}", f"must be zero or more, got {getattr(self, name)}",
                                  "give a non-negative number")
        for name in ("error_rate", "timeout_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"load.{name}", f"must be within 0..1, got {getattr(self, name)}",
                                  "give a probability")
        if self.max_time_s <= 0 or not 0 < self.stall_ci < 1 or not self.p99_ci > 0:
            raise ConfigError("load.max_time_s", "max_time_s, stall_ci and p99_ci must be positive (stall_ci < 1)",
                              "e.g. max_time_s=60, stall_ci=0.02, p99_ci=0.25")
        if self.retry_budget_s <= 0 or self.monitor_interval_s <= 0:
            raise ConfigError("load.retry_budget_s", "durations must be positive", "give a positive number")
        for name, choices in (("cache", CACHE_STATES), ("s3_client", S3_CLIENTS), ("compute_mode", MODES),
                              ("start_method", START_METHODS), ("access", ACCESS_PATTERNS + ("auto",)),
                              ("block_read", BLOCK_READS)):
            check_choice(f"load.{name}", getattr(self, name), choices)
        parse_size(self.s3_block_size, "load.s3_block_size")
        parse_size(self.stream_read_size, "load.stream_read_size")
        self.compute_model()  # validates the compute spec
        check_workers_fit_fd_limit(self)
        parse_emulation(self.emulate)

    def compute_model(self) -> ComputeModel:
        return parse_compute(self.compute, self.compute_mode, self.compute_fn, self.seed, field="--compute")

    def stop_rule(self) -> StopRule:
        """The ``until_stable`` rule (also the one every load's verdict is judged by)."""
        return StopRule(min_steps=self.min_steps, max_time_s=self.max_time_s, stall_ci=self.stall_ci, p99_ci=self.p99_ci)


@dataclass
class LoadRun:
    """What one load measured: results-schema metrics, environment, warnings."""

    metrics: dict
    environment: dict
    warnings: list[str] = field(default_factory=list)


def estimate_slot_bytes(cfg: LoadConfig, manifest) -> int:
    """Bytes one batch can take in a slot, from the manifest (generous, so overflow is rare)."""
    spec = manifest.spec or {}
    per_sample = max((s.bytes + s.samples - 1) // max(1, s.samples) for s in manifest.shards)
    row = _token_row_bytes(manifest)
    if row is not None:
        per_sample = max(row, 1)
        if manifest.compression == "none" and manifest.format == "raw":
            return cfg.batch_size * per_sample
    if cfg.decode and manifest.modality == "images":
        w, h = int(spec.get("image_width", 500)), int(spec.get("image_height", 375))
        jitter = 1 + float(spec.get("image_size_jitter", 0.2))
        per_sample = max(per_sample, int(w * h * 3 * jitter * jitter) + 64)
    return int(cfg.batch_size * per_sample * 2) + 4096


# Descriptors per worker process: its pipes and queue ends, the slots' shared-memory handles it
# maps, the shard files it has open; plus a fixed allowance for the parent.
_FDS_PER_WORKER, _FDS_BASE = 8, 64


def check_workers_fit_fd_limit(cfg: LoadConfig) -> None:
    """Refuse, before any process starts, a worker count the open-file limit cannot carry."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    base = _FDS_BASE + cfg.workers * _FDS_PER_WORKER
    need = base + slots_for("map", cfg.workers, cfg.prefetch)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if base + slots_for("map", cfg.workers, 1) <= soft:   # the workers fit; their prefetch depth asks for the slots
        raise ConfigError("--prefetch", f"{cfg.prefetch} batches in flight per worker need ~{need} open files, "
                          f"the limit is {soft}", "lower --prefetch, or raise the limit (ulimit -n)")
    top = max(1, (soft - _FDS_BASE) // (_FDS_PER_WORKER + cfg.prefetch + 1))
    raise ConfigError("--workers", f"{cfg.workers} workers need ~{need} open files, the limit is {soft}",
                      f"use at most {top} workers, or raise the limit (ulimit -n)")


def _token_row_bytes(manifest) -> int | None:
    """Bytes of one token sample of a tokens dataset of fixed ``seq_len`` (None for any other)."""
    spec = manifest.spec or {}
    if manifest.modality != "tokens" or "seq_len" not in spec:
        return None
    dt = spec.get("token_dtype", "auto")
    return int(spec["seq_len"]) * token_dtype_for(int(spec.get("vocab_size", 65536)),
                                                  dt if dt in ("uint16", "uint32") else "auto").itemsize


def one_sample_bytes(manifest) -> int:
    """The largest stored sample (bytes), from the manifest: what one slot must hold at least."""
    row = _token_row_bytes(manifest)
    if row is not None and manifest.compression == "none":
        return row
    return max((int(np.diff(np.asarray(s.offsets, dtype=np.int64)).max()) if s.offsets and len(s.offsets) > 1
                else (s.bytes + s.samples - 1) // max(1, s.samples) for s in manifest.shards), default=0)


def check_against_dataset(cfg: LoadConfig, manifest, world: int = 1) -> None:
    """Flags that only make sense against this dataset: refused before the first worker starts."""
    per_rank = manifest.total_samples // max(1, world)
    if cfg.batch_size > per_rank:
        raise ConfigError("--batch-size", f"{cfg.batch_size} is more than the {per_rank} samples "
                          f"{'each rank reads' if world > 1 else 'in the dataset'}",
                          f"use at most {per_rank} (a step must be a whole batch to be measured)")
    if cfg.slot_bytes:
        one = one_sample_bytes(manifest)
        if cfg.slot_bytes < one:
            raise ConfigError("--slot-bytes", f"{cfg.slot_bytes} bytes cannot hold one sample ({one} bytes)",
                              f"give at least {cfg.batch_size * one} (a batch), or 0 to size it from the manifest")


@dataclass
class _Setup:
    """Everything a load needs before its first step (built by ``_setup``)."""

    cfg: LoadConfig
    backend: Backend
    manifest: Manifest
    schedule: Schedule
    source: ShardSource
    compute: Compute
    deliver: Delivery            # the batch to the device (loader.delivery, iobench.gds)
    cache_state: dict
    emulation: EmulationSpec
    slot_bytes: int
    slots: int
    warnings: list[str]


@dataclass
class _Steps(StepSeries):
    """What the step loop recorded, one entry per step, in step order."""

    depths: list[int] = field(default_factory=list)
    fill_s: list[float] = field(default_factory=list)      # shuffle-buffer fill before it (stream), apart
    requests: list[int] = field(default_factory=list)
    worker: list[int] = field(default_factory=list)
    ready_s: list = field(default_factory=list)            # when its worker finished it (s after clock start)
    handoff_s: list = field(default_factory=list)          # from then (or the step's start) to the step having it
    start_s: list = field(default_factory=list)            # map/stream: when its worker started it (gate open)
    t_spawn: int = 0
    t_start: int = 0
    system: dict = field(default_factory=dict)
    done: dict = field(default_factory=dict)
    overflow: int = 0
    stopped_early: str | None = None
    run_delay_s: dict = field(default_factory=dict)        # worker pid -> s runnable but waiting for a CPU
    device: Any = None                                    # iobench.blockdev.DeviceCounter, local disks

    def add(self, t0: int, t1: int, t2: int, compute_s: float, depth: int, worker: int, nbytes: int, n: int,
            io_s: float, prep_s: float, fill_s: float, requests: int, ready_ns: int, start_ns: int | None) -> None:
        """One step: started at ``t0``, had its batch at ``t1``, ended at ``t2`` (ns); the rest is
        what the batch's producer counted (the worker's ``_Emitter._send`` keys)."""
        ts = self.t_start
        self.waits.append((t1 - t0) / 1e9)
        self.computes.append(compute_s)
        self.steps_s.append((t2 - t0) / 1e9)
        self.t_step.append((t0 - ts) / 1e9)
        self.depths.append(depth)
        self.batch_bytes.append(nbytes)
        self.lens.append(n)
        self.io_s.append(io_s)
        self.prep_s.append(prep_s)
        self.fill_s.append(fill_s)
        self.requests.append(requests)
        self.worker.append(worker)
        self.ready_s.append((ready_ns - ts) / 1e9)
        self.start_s.append((start_ns - ts) / 1e9 if start_ns else None)
        # worker done -> step has it (pipe, wake-up, unpickle); only on the critical path when the step waited
        self.handoff_s.append(max(0.0, (t1 - max(t0, ready_ns)) / 1e9))


def slots_for(access: str, workers: int, prefetch: int) -> int:
    """Prefetch slots: ``prefetch`` per worker for map/stream (DataLoader's ``prefetch_factor``:
    W·Q batches in flight), ``prefetch`` in all for block; +1 for the batch the step computes on.
    No workers (W=0): the one batch the consumer builds and computes on."""
    if workers == 0:
        return 1
    return (prefetch * workers if order_of(access) in ("map", "stream") else prefetch) + 1


def round_need(owner: np.ndarray, workers: int) -> np.ndarray:
    """``LoadConfig.lockstep``: row ``r`` holds, per worker, its batches among the first ``r * workers``
    (the rounds before round ``r``), which it must have sent before any worker starts a batch of
    round ``r``.  A tf.data batch cut from ``workers`` files read by a deterministic parallel
    interleave (``TFRecordDataset(num_parallel_reads=W)``: ``block_length=1``, ``sloppy=False``,
    ``buffer_output_elements`` 2 records per file: tensorflow ``data/ops/readers.py``) takes its
    records round-robin, so no file runs more than two records ahead of the others; a worker that
    ran a whole piece ahead per batch of prefetch would read other steps' data while the step it
    waits for starves (the read throttle shares the disk unevenly), and the step it finally gets
    finds several more already read: a head start that DLIO's pipeline does not have."""
    owner = np.asarray(owner, dtype=np.int64)
    rounds = -(-len(owner) // max(1, workers))
    need = np.zeros((rounds, workers), dtype=np.int64)
    for r in range(1, rounds):
        need[r] = need[r - 1] + np.bincount(owner[(r - 1) * workers:r * workers], minlength=workers)[:workers]
    return need


def _one_cold_pass(cfg: LoadConfig, backend: Backend, manifest: Manifest, schedule: Schedule, rank: int,
                   world: int, until_stable_cap: bool, warnings: list[str]) -> Schedule:
    """A cold load reads storage once: its cache is dropped at setup, so a second pass over a local
    dataset the page cache can hold reads memory (``mlperf run --min-steps`` delivered 1.04-1.06x a
    kernel-throttled disk's cap that way).  Refused before any work; an ``--until-stable`` run
    (no step count asked for) stops at the end of the first pass instead.  O_DIRECT reads and
    object stores have no client page cache to hit."""
    if len(schedule.plans) < 2 or cfg.odirect or not backend.base.is_local:
        return schedule
    nbytes = sum(manifest.shards[s].bytes for s in schedule.shards)
    if nbytes > _page_cache_bytes():   # larger than memory: the cache cannot hold a pass (later passes may hit in part)
        warnings.append(f"--cache cold over {len(schedule.plans)} passes of a {format_bytes(nbytes)} dataset: larger "
                        "than memory, but the passes after the first may find part of it cached")
        return schedule
    one_pass = schedule.plans[0].batches
    if until_stable_cap:
        warnings.append(f"--cache cold: the run stops at the end of one pass ({one_pass} steps), because a second "
                        "would read the page cache the first filled")
        return build_schedule(replace(cfg, steps=one_pass), manifest, rank, world)
    key, what = ("load.steps", f"{cfg.steps} steps") if cfg.steps else ("load.epochs", f"{cfg.epochs} epochs")
    raise ConfigError(key, f"a cold run of {what} reads the {format_bytes(nbytes)} dataset "
                      f"{len(schedule.plans)} times, and the page cache holds it after the first pass (one pass is "
                      f"{one_pass} steps): the later passes would read memory, not storage",
                      f"use --epochs 1 or --steps {one_pass} or fewer; `iobench mlperf run` drops the cache before "
                      "every epoch; --cache as-is measures the cached passes knowingly")


def _page_cache_bytes() -> int:
    """What the page cache could hold at most: the host's physical memory."""
    return memory_cap()


def _setup(cfg: LoadConfig, storage_options, source, rank: int, world: int, synthetic: bool, manifest,
           deliver, until_stable_cap: bool = False) -> _Setup:
    warnings: list[str] = []
    ref = resolve_dataset_url(cfg.dataset)     # a brace range or one shard: those files, under their directory
    if ref.only is not None:
        cfg = replace(cfg, dataset=ref.root)
    backend = open_backend(cfg.dataset, endpoint_url=cfg.endpoint_url, storage_options=storage_options,
                           field_name="dataset", check=True)
    if manifest is None:
        manifest = dataset_manifest(backend, ref.only)
    if not manifest.shards:
        raise ConfigError("dataset", f"the manifest at {cfg.dataset} lists no shards", "regenerate the dataset")
    check_against_dataset(cfg, manifest, world)
    if backend.server_on_this_host and not synthetic and cfg.workers >= usable_cores():
        warnings.append(f"the object store at {backend.describe()['endpoint_url']} runs on this machine: its server, "
                        f"the {cfg.workers} workers and the consumer share {usable_cores()} cores, so the numbers "
                        "include that contention (a server on another machine would not take the loader's cores)")
    schedule = build_schedule(cfg, manifest, rank, world)
    if cfg.lockstep and (schedule.access != "stream" or cfg.workers < 2):
        raise ConfigError("load.lockstep", f"keeps stream workers in rounds; this load is {schedule.access} "
                                           f"with {cfg.workers} worker(s)",
                          "drop lockstep, or use access=stream with 2 or more workers")
    if not synthetic and cfg.cache == "cold":
        schedule = _one_cold_pass(cfg, backend, manifest, schedule, rank, world, until_stable_cap, warnings)
    if order_of(schedule.access) == "map" and not synthetic:
        _check_map_ranges(manifest)
    if schedule.access == "memmap" and not synthetic:
        check_memmap(cfg, backend, manifest, source)   # before any work: memmap reads local fixed rows only
    compute = Compute(cfg.compute_model())
    deliver = as_delivery(deliver, cfg.device) if deliver is not None else get_delivery(cfg.device)
    deliver.bind(manifest, cfg.dataset)   # a GPU delivery picks its route for this dataset (iobench.gds)
    emulation = resolve_emulation(cfg.emulate).for_workers(cfg.workers)   # the workers share the tier's bandwidth
    if source is None:
        source = backend_source(cfg.dataset, endpoint_url=cfg.endpoint_url, storage_options=storage_options or {},
                                emulation=emulation, seed=cfg.seed,
                                block_size=parse_size(cfg.s3_block_size, "load.s3_block_size"),
                                concurrency=cfg.s3_concurrency, s3_client=cfg.s3_client,
                                retry=RetryPolicy(attempts=cfg.retries, budget_s=cfg.retry_budget_s),
                                error_rate=cfg.error_rate, timeout_rate=cfg.timeout_rate, odirect=cfg.odirect,
                                block_read=cfg.block_read)
    if cfg.block_read != "read" and not synthetic:
        _check_block_read(cfg, manifest, schedule, source, warnings)
    # the cache made ready (a warm cache reads every shard) once the load is known to be valid
    cache_state = {"declared": "synthetic (no I/O)"} if synthetic else \
        set_cache_state(backend, [manifest.shards[s].path for s in schedule.shards], cfg.cache)
    if schedule.access == "memmap" and not synthetic:   # rows sliced from mappings (iobench.loader.memmap)
        source = MappedSource(source)
    if cfg.verify_checksums and not synthetic:
        check_sizes(backend, [manifest.shards[s] for s in schedule.shards])
        source = VerifyingSource(source)
        if order_of(schedule.access) == "map":
            warnings.append("--verify-checksums: the map pattern read whole shards (verified) instead of "
                            "per-sample ranges")
    if cfg.odirect and not synthetic:
        _check_odirect(backend, source, manifest, warnings)
    return _Setup(cfg=cfg, backend=backend, manifest=manifest, schedule=schedule, source=source, compute=compute,
                  deliver=deliver, cache_state=cache_state, emulation=emulation,
                  slot_bytes=cfg.slot_bytes or estimate_slot_bytes(cfg, manifest),
                  slots=slots_for(schedule.access, cfg.workers, cfg.prefetch), warnings=warnings)


def _check_map_ranges(manifest) -> None:
    """The map pattern reads samples by byte range: refuse, before any work, a dataset without them."""
    from .schedule import has_sample_ranges

    if not has_sample_ranges(manifest):
        why = f"compressed ({manifest.compression}) " if manifest.compression != "none" else ""
        raise ConfigError("load.access", f"map reads samples by byte range, and this {why}{manifest.format} dataset "
                          "has no per-sample ranges", "use --access stream (or block)")


def _step_loop(st: _Setup, progress: bool, synthetic: bool, stop_rule=None) -> _Steps:
    """Start the workers, run the consumer's steps, stop the workers; returns what each step saw."""
    from .receiver import Receiver, Sender
    from .slots import SlotPool, batch_from_meta
    from .sysmon import SystemMonitor, run_delay_s
    from .inprocess import progress_bar
    from .worker import WorkerJob, run_worker

    cfg, schedule, total = st.cfg, st.schedule, st.schedule.total
    ctx: Any = mp.get_context(cfg.start_method)
    # Poll before blocking only where a core is left over for each process (an object store
    # served from this host needs one of them: spinning would starve it).
    spin_s = _SPIN_S if usable_cores() - st.backend.server_on_this_host > cfg.workers else 0.0
    owner = schedule.owner
    lag = cfg.prefetch * cfg.workers if order_of(schedule.access) in ("map", "stream") else 0
    need = round_need(owner, cfg.workers) if cfg.lockstep else None
    stop, monitor, rec = ctx.Event(), SystemMonitor(cfg.monitor_interval_s), _Steps()
    procs: list = []
    pipes: list = []
    bar = rx = None
    pool = SlotPool(ctx, st.slots, st.slot_bytes, cfg.workers, spin_s=spin_s)
    try:   # a signal while the rest is set up (SIGTERM 1 s into `check`) must not leak the slots
        pipes = [ctx.Pipe(duplex=False) for _ in range(cfg.workers)]
        rec.device = _device_counter(st.backend, st.manifest, synthetic)  # before the workers' first read
        # The start-up clock starts before the first worker does: a worker reads as soon as it is ready,
        # while the next ones are forked, and those bytes count in wall_s_with_startup (DESIGN rule 13).
        rec.t_spawn = now_ns()
        for wid in range(cfg.workers):
            job = WorkerJob.of_load(st, synthetic, wid, cfg.workers, lag, need)
            p = ctx.Process(target=run_worker, args=(job, st.source, pool, Sender(pipes[wid][1], pool.sent, wid), stop),
                            daemon=True, name=f"iobench-load-{wid}")
            p.start()
            procs.append(p)
        rx = Receiver([r for r, _ in pipes], procs, sent=pool.sent, spin_s=spin_s,
                      build=lambda meta: batch_from_meta(meta, pool))
        monitor.start([os.getpid()] + [p.pid for p in procs], device=rec.device)
        bar = progress_bar(total) if progress else None
        rx.wait_started(cfg.workers)  # connections and imports are start-up, not throughput
        rec.t_start = now_ns()
        run_delay0 = {p.pid: run_delay_s(p.pid) for p in procs}   # CPU contention, from here to the end
        compute, deliver = st.compute, st.deliver
        for k in range(total):
            t0 = now_ns()
            meta = rx.wait_batch(k)
            batch = rx.take_built(k)
            batch = deliver(batch if batch is not None else batch_from_meta(meta, pool))
            t1 = now_ns()
            if lag:
                pool.take(k, int(owner[k + lag]) if k + lag < total else None)
            depth = rx.ready() + 1  # batches ready when this step got its own (included)
            c = compute(batch, k, idle=rx.idle)   # like a host thread while the accelerator computes: takes messages
            del batch
            pool.release(k, int(owner[k + pool.n]) if k + pool.n < total else None)
            t2 = now_ns()
            rec.add(t0, t1, t2, c, depth, meta["worker"], meta["nbytes"], meta["n"], meta["io_s"], meta["prep_s"],
                    meta["fill_s"], meta["requests"], meta["ready_ns"], meta["start_ns"])
            if bar is not None:
                bar[0].update(bar[1], advance=1)
            if stop_rule is not None and k + 1 < total:
                why = stop_rule(rec, (now_ns() - rec.t_start) / 1e9)
                if why:
                    rec.stopped_early = why
                    break
        rec.t_end = now_ns()
        for p in procs:
            a, b = run_delay0.get(p.pid), run_delay_s(p.pid)
            rec.run_delay_s[p.pid] = b - a if a is not None and b is not None else None
        rec.system = monitor.stop(rec.t_start)  # before workers exit: their shared pages would turn into the parent's USS
        stop.set()
        rx.wait_done(cfg.workers, 30.0)
    finally:
        stop.set()
        if bar is not None:
            bar[0].stop()
        if monitor.running:
            monitor.stop()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for r, w in pipes:
            r.close()
            w.close()
        if rx is not None:
            rx.built.clear()   # views of slots built ahead: gone before the slots are
        pool.close()
    rec.done, rec.overflow = rx.done, rx.overflow
    return rec


def run_load(cfg: LoadConfig, storage_options: dict | None = None, source=None, rank: int = 0, world: int = 1,
             progress: bool = False, synthetic: bool = False, manifest=None, deliver=None,
             stop_rule=None, ready=None) -> LoadRun:
    """Run one load and return its metrics (see module docstring): setup, step loop, metrics.
    ``ready``: called after the setup, before the first worker starts (e.g. a barrier across ranks)."""
    cap = False
    if cfg.until_stable and stop_rule is None:
        stop_rule = cfg.stop_rule().check
        if not cfg.steps:
            cap = True
            cfg = replace(cfg, steps=_UNTIL_STABLE_STEPS)   # a cap; the rule or the time cap ends the run
    st = _setup(cfg, storage_options, source, rank, world, synthetic, manifest, deliver, until_stable_cap=cap)
    if ready is not None:
        ready()
    if cfg.workers == 0:   # the consumer makes its own batches (DataLoader num_workers=0)
        from .inprocess import step_loop

        # the block-device counter starts before the first read
        rec = step_loop(st, _Steps(device=_device_counter(st.backend, st.manifest, synthetic)), progress, synthetic,
                        stop_rule)
    else:
        rec = _step_loop(st, progress, synthetic, stop_rule)
    return _metrics(st, rec, rank, world, synthetic)


_UNTIL_STABLE_STEPS = 20_000


def _rate(amount: float, seconds: float) -> float | None:
    return amount / seconds if seconds > 0 else None


def _metrics(st: _Setup, rec: _Steps, rank: int, world: int, synthetic: bool) -> LoadRun:
    cfg, manifest, schedule = st.cfg, st.manifest, st.schedule
    warnings = list(st.warnings)
    steps = len(rec.waits)
    wall_s = (rec.t_end - rec.t_start) / 1e9
    if len(rec.done) < cfg.workers:
        warnings.append(f"{cfg.workers - len(rec.done)} worker(s) did not report their counters; "
                        "bytes may be undercounted")
    if rec.overflow:
        warnings.append(f"{rec.overflow} batch(es) did not fit a {st.slot_bytes}-byte slot and were pickled; "
                        "raise --slot-bytes")
    read_hists: dict[str, LatencyHistogram] = {}
    calls: dict[str, int] = {}
    sources, per_worker = [], []
    for wid, d in sorted(rec.done.items()):
        src = d.get("source") or {}
        sources.append(src)
        nbytes = int(src.get("bytes_read", 0))
        for op, enc in (src.get("hist") or {}).items():
            read_hists.setdefault(op, LatencyHistogram()).merge(LatencyHistogram.decode(enc))
        for op, n in (src.get("calls") or {}).items():
            calls[op] = calls.get(op, 0) + n
        per_worker.append({"worker": wid, "pid": d["pid"], "batches": d["batches"], "samples": d["samples"],
                           "bytes_read": nbytes, "busy_s": d["busy_s"],
                           "io_s": d.get("io_s"), "fill_s": d.get("fill_s"), "slot_wait_s": d["slot_wait_s"],
                           "gate_wait_s": d.get("gate_wait_s", 0.0),
                           # waiting for a CPU while runnable (other processes on the host): not storage
                           "run_delay_s": rec.run_delay_s.get(d["pid"]),
                           "bytes_per_s": _rate(nbytes, wall_s), "samples_per_s": _rate(d["samples"], wall_s)})
    bytes_read = sum(p["bytes_read"] for p in per_worker)
    # Measurement rule 4 ("first step excluded", docs/design.md): the first step includes the first reads
    # (and a stream's buffer fill); it is excluded (a one-step run keeps its step where a summary needs one).
    w, s, computes = rec.waits[1:], rec.steps_s[1:], rec.computes[1:]
    stall_mlperf = _rate(sum(w), sum(s)) or 0.0
    # The headline: the steady window also leaves out the drain of the workers' head start
    # (iobench.loader.stability.steady_window), which a short run would otherwise count as no stall.
    k0, k1, why = steady_window(rec.waits)
    stall = window_stall(rec.waits, rec.steps_s, (k0, k1))
    io, service_s = rec.io_s[1:] or rec.io_s, service(rec)
    svc = service_s[1:] or service_s
    startup_s = (rec.t_start - rec.t_spawn) / 1e9
    total_wall_s = (rec.t_end - rec.t_spawn) / 1e9
    first_wait = rec.waits[0] if rec.waits else None
    warmup_s = startup_s + (first_wait or 0.0)
    warmup_fraction = _rate(warmup_s, total_wall_s)
    warnings += [f"--device {cfg.device}: {reason}" for reason in st.deliver.reasons]  # GPU fallbacks (iobench.gds)
    intervals, stable, stability = _judge(st, rec, warnings)
    if warmup_fraction is not None and warmup_fraction > 0.10:
        warnings.append(f"warm-up (worker start + first batch) took {warmup_s:.2f} s, {warmup_fraction:.0%} of the "
                        "wall clock: wall-clock utilization is below the steady-state one")
    metrics = LoadMetrics(
        access=schedule.access, steps=steps, steps_planned=schedule.total, stopped_early=rec.stopped_early,
        samples=sum(rec.lens), epochs_planned=schedule.epochs, first_step_excluded=True,
        stall_ratio=stall, accelerator_utilization=1.0 - stall,
        steady_window={"from_step": k0, "to_step": k1, "rule": why},
        # MLPerf Storage's count (every step but the first), the head start's drain included
        stall_ratio_first_step_excluded=stall_mlperf, accelerator_utilization_first_step_excluded=1.0 - stall_mlperf,
        # compute over the whole wall clock, worker start and the first batch included
        wall_clock_utilization=_rate(sum(rec.computes), total_wall_s),
        wall_s=wall_s, wall_s_with_startup=total_wall_s, wait_s_total=sum(w), compute_s_total=sum(computes),
        first_step_s=rec.steps_s[0] if rec.steps_s else None, startup_s=startup_s, time_to_first_batch_s=first_wait,
        warmup_s=warmup_s, warmup_fraction=warmup_fraction, fill_io_s_total=sum(rec.fill_s),
        batch_wait_s=summarize_seconds(w), batch_wait_hist=encoded_seconds(w),
        batch_io_s=summarize_seconds(io), batch_io_hist=encoded_seconds(io),
        batch_service_s=summarize_seconds(svc), batch_service_hist=encoded_seconds(svc),
        batch_prep_s=summarize_seconds(rec.prep_s[1:] or rec.prep_s),
        compute_s=summarize_seconds(computes or rec.computes), compute_hist=encoded_seconds(computes),
        step_s=summarize_seconds(s),
        batch_bytes=float(np.mean(rec.batch_bytes)) if rec.batch_bytes else 0.0,
        batch_bytes_max=int(max(rec.batch_bytes, default=0)), bytes_read=bytes_read, requests=sum(rec.requests),
        throughput={"samples_per_s": _rate(sum(rec.lens), wall_s), "bytes_per_s": _rate(bytes_read, wall_s),
                    "batches_per_s": _rate(steps, wall_s), "steady_samples_per_s": _rate(sum(rec.lens[1:]), sum(s))},
        read_latency_s={op: h.summary() for op, h in read_hists.items()}, read_calls=calls,
        queue_depth={"mean": float(np.mean(rec.depths)) if rec.depths else 0.0, "max": max(rec.depths, default=0),
                     "slots": st.slots, "slot_bytes": st.slot_bytes},
        per_worker=per_worker,
        series={"t_s": rec.t_step, "wait_s": rec.waits, "step_s": rec.steps_s, "compute_s": rec.computes,
                "queue_depth": rec.depths, "io_s": rec.io_s, "prep_s": rec.prep_s, "fill_s": rec.fill_s,
                "requests": rec.requests,
                # the batch's whole time at its worker (what planner.loader_sim replays)
                "service_s": [a + b for a, b in zip(service_s, rec.fill_s)],
                "worker": rec.worker, "ready_s": rec.ready_s, "handoff_s": rec.handoff_s, "start_s": rec.start_s},
        system=rec.system, pickled_batches=rec.overflow, verify_checksums=merge_verify(sources),
        # What the block device read for these requests (read-ahead makes it more); None off local disks.
        device_io=rec.device.stop(bytes_read, sum(rec.batch_bytes)) if rec.device is not None else None,
        intervals=intervals, stable=stable, stability=stability,
    )
    environment = {
        "cache": st.cache_state,
        "storage": "synthetic" if synthetic else ("emulated" if st.emulation.active else "real"),
        "emulation": st.emulation.describe() if st.emulation.active else None,
        "source": st.source.describe(),
        "dataset": {"url": cfg.dataset, "format": manifest.format, "modality": manifest.modality,
                    "compression": manifest.compression, "shards": len(manifest.shards),
                    "samples": manifest.total_samples, "bytes": manifest.total_bytes},
        "loader": {"access": schedule.access, "access_semantics": ACCESS_SEMANTICS[schedule.access],
                   "workers": cfg.workers, "prefetch": cfg.prefetch, "slots": st.slots,
                   "start_method": cfg.start_method, "delivery": cfg.device,
                   "compute": cfg.compute_model().describe()},
        "world": {"rank": rank, "size": world},
        "delivery": _describe_delivery(st.deliver, cfg.device),
        "first_step_excluded": "stall and utilization exclude step 0, as MLPerf Storage does, and the drain of the "
                               "workers' head start (steady_window; the MLPerf count is stall_ratio_first_step_"
                               "excluded); worker start-up (processes, storage connections) happens before the "
                               "clock starts (startup_s); wall_clock_utilization includes both",
    }
    return LoadRun(metrics=metrics.to_dict(), environment=environment, warnings=warnings)


def _judge(st: _Setup, rec: _Steps, warnings: list[str]) -> tuple[dict, bool, Stability]:
    """Intervals (measurement rule 9, "enough samples", docs/design.md), and the warnings that keep the headline honest (too short, idle workers...)."""
    cfg = st.cfg
    rule = cfg.stop_rule()
    v = steady_verdict(rec, rule)
    intervals = {k: v[k] for k in (STALL_RATIO, P99_SERVICE_INTERVAL, P99_WAIT_INTERVAL)}
    stability: Stability = {"rule": rule.describe(), "until_stable": cfg.until_stable,
                            "stopped": rec.stopped_early or "planned steps done",
                            "not_stable_because": v["not_stable_because"]}
    if not v["stable"]:
        warnings.append(f"not stable after {len(rec.waits)} steps: " + "; ".join(v["not_stable_because"])
                        + ("" if cfg.until_stable else " (add --until-stable)"))
    if cfg.compute_model().nominal_s <= 0 and cfg.compute_mode != "callback":
        warnings.append("no compute time given: the stall is against a zero-time step (give --compute-ms)")
    if st.schedule.access in ("stream", "block"):
        mine = len(st.schedule.shards)
        if mine < cfg.workers:
            warnings.append(f"{mine} shard(s) for {cfg.workers} workers: {cfg.workers - mine} worker(s) have nothing "
                            "to read (regenerate with smaller shards, or use --access map)")
    requests = sum(rec.requests)
    if st.emulation.active and requests < 100:
        warnings.append(f"the emulated storage saw only {requests} request(s): its latency distribution "
                        "is barely sampled (run more steps)")
    return intervals, v["stable"], stability


ACCESS_SEMANTICS = {
    "memmap": "nanoGPT get_batch / Megatron GPTDataset: map's order (seeded permutation per epoch, batch j to worker "
              "j % W); each shard mapped once per reading process and every batch one gather of its fixed-size rows "
              "from the mappings (no syscall per sample): page faults and the kernel's read-around are the I/O "
              "(requests = major page faults; device_io.read_amplification = device bytes / bytes asked for)",
    "map": "PyTorch map-style: seeded permutation of global sample indices per epoch (rank::world); batch j of an "
           "epoch made by worker j % W from one ranged read per sample; prefetch_factor Q batches per worker",
    "stream": "webdataset/tf.data: shards rank::world then worker::W, each worker streams its shards in order "
              "(one streamed request per shard, pieces of whole samples) through its own shuffle buffer (fill, then "
              "one out per one in); batches cut as samples leave; consumer takes workers' batches round-robin",
    "block": "full-window shuffle: shards grouped into blocks of >= shuffle_buffer samples, each block read whole "
             "and shuffled; its reads land on its first batch (lumpy by design); Q batches in all",
}


def _device_counter(backend, manifest, synthetic: bool):
    """Device bytes read during the run (iobench.blockdev), for datasets on a local block device."""
    if synthetic or not backend.is_local:
        return None
    c = DeviceCounter(backend.local_path(manifest.shards[0].path))
    return c if c.dev is not None else None


def _check_block_read(cfg: LoadConfig, manifest, schedule, source, warnings: list[str]) -> None:
    """``block_read="mmap"``: refused, before any work, where no block would be mapped (only a
    plain local source maps, and only the fixed-size token rows of block access); a warning for
    blocks of several shards, which are read (their rows must be one contiguous array)."""
    from ..formats import get_format

    if schedule.access != "block":
        raise ConfigError("load.block_read", f"mmap maps the shards of block access; this load is {schedule.access}",
                          "add --access block, or drop --block-read (--access memmap maps per sample)")
    # the factory's source for this storage says whether it maps (plain local files do); a verifying
    # source, wrapped around it later, reads whole shards to hash them
    if not source.supports_mapped_blocks or cfg.verify_checksums:
        raise ConfigError("load.block_read", "mmap maps plain local files: not object stores, --tiers, --emulate, "
                                             "faults, --odirect or --verify-checksums", "drop --block-read mmap")
    if manifest.modality != "tokens" or get_format(manifest.format).reader(manifest).fixed_layout() is None:
        raise ConfigError("load.block_read", "mmap maps fixed-size token rows; this dataset's samples are not",
                          "drop --block-read mmap")
    several = sum(len(b.shards) > 1 for p in schedule.plans for b in p.blocks)
    if several:
        warnings.append(f"--block-read mmap: {several} block(s) hold several shards and were read, not mapped "
                        "(give a --shuffle-buffer of at most one shard's samples to map every block)")


def _check_odirect(backend, source, manifest, warnings: list[str]) -> None:
    if not backend.supports_odirect:
        warnings.append(f"--odirect ignored: {backend.protocol}:// has no O_DIRECT; reads are buffered")
        return
    if not source.supports_odirect:
        warnings.append("--odirect ignored: emulated or faulty storage (or this source) passes every read through "
                        "its wrappers; reads are buffered")
        return
    try:
        os.close(os.open(backend.local_path(manifest.shards[0].path), os.O_RDONLY | os.O_DIRECT))
    except OSError as e:
        raise ConfigError("--odirect", f"the filesystem under {backend.root} refuses O_DIRECT ({e.strerror})",
                          "drop --odirect (tmpfs and some FUSE filesystems do not support it)") from None


def _describe_delivery(deliver: Delivery, device: str) -> dict:
    """The effective delivery path (a GPU delivery records its fallbacks), not just the requested one."""
    try:
        return deliver.describe()
    except Exception as e:  # noqa: BLE001 — a description must not fail the run
        return {"device": device, "error": f"{type(e).__name__}: {e}"}
