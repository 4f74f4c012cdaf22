"""The loader run: sampler → W worker processes → Q prefetch slots → consumer step loop.

``run_load(cfg)`` reads a dataset through its manifest and the format readers, hands
each batch to the consumer as a shared-memory view, emulates the step's compute, and
returns the metrics of the results schema: per-step wait and compute, stall ratio (first
step excluded), throughput counted at the backend, HDR histograms of batch wait, batch
I/O and per-operation read latency, queue depth and psutil samples over time.
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass, field

import numpy as np

from ..cache import STATES as CACHE_STATES
from ..config import check_choice
from ..errors import ConfigError, IobenchError
from ..metrics import LatencyHistogram, now_ns
from ..units import parse_size
from .compute import MODES, Compute, ComputeModel, parse_compute
from .sampler import EpochPlan, epoch_plan

START_METHODS = ("fork", "forkserver", "spawn")
_MAX_EPOCHS_FOR_STEPS = 100_000
_SPIN_S = 0.002   # how long the consumer polls for its next batch before it sleeps on the pipes


@dataclass(frozen=True)
class LoadConfig:
    dataset: str
    workers: int = 2
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
    read_ahead: int = 0               # blocks each worker reads ahead of the one it is collating
    monitor_interval_s: float = 0.5
    start_method: str = "fork"

    def __post_init__(self) -> None:
        for name, low in (("workers", 1), ("prefetch", 1), ("batch_size", 1), ("epochs", 1),
                          ("s3_concurrency", 1), ("retries", 1)):
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
        if self.retry_budget_s <= 0 or self.monitor_interval_s <= 0:
            raise ConfigError("load.retry_budget_s", "durations must be positive", "give a positive number")
        check_choice("load.cache", self.cache, CACHE_STATES)
        from ..storage import S3_CLIENTS

        check_choice("load.s3_client", self.s3_client, S3_CLIENTS)
        check_choice("load.compute_mode", self.compute_mode, MODES)
        check_choice("load.start_method", self.start_method, START_METHODS)
        parse_size(self.s3_block_size, "load.s3_block_size")
        self.compute_model()  # validates the compute spec
        from ..wrappers import parse_emulation

        parse_emulation(self.emulate)

    def compute_model(self) -> ComputeModel:
        return parse_compute(self.compute, self.compute_mode, self.compute_fn, self.seed, field="--compute-ms")


@dataclass
class LoadRun:
    """What one load measured: results-schema metrics, environment, warnings."""

    metrics: dict
    environment: dict
    warnings: list[str] = field(default_factory=list)


def plan_epochs(cfg: LoadConfig, shard_samples: list[int], rank: int, world: int) -> tuple[list[EpochPlan], int]:
    """The epoch plans needed and the number of steps to run."""
    plans: list[EpochPlan] = []
    total = 0
    epoch = 0
    while True:
        p = epoch_plan(shard_samples, cfg.batch_size, cfg.seed, epoch, rank, world, cfg.shuffle_buffer,
                       cfg.shuffle, cfg.drop_last)
        if p.batches == 0:
            raise ConfigError("load.batch_size", f"no full batch of {cfg.batch_size} on rank {rank}",
                              "lower --batch-size or drop --drop-last")
        plans.append(p)
        total += p.batches
        epoch += 1
        if cfg.steps and total >= cfg.steps:
            return plans, cfg.steps
        if not cfg.steps and epoch >= cfg.epochs:
            return plans, total
        if epoch >= _MAX_EPOCHS_FOR_STEPS:
            raise ConfigError("load.steps", f"{cfg.steps} steps need over {epoch} epochs", "ask for fewer steps")


def estimate_slot_bytes(cfg: LoadConfig, manifest) -> int:
    """Bytes one batch can take in a slot, from the manifest (generous, so overflow is rare)."""
    spec = manifest.spec or {}
    per_sample = max((s.bytes + s.samples - 1) // max(1, s.samples) for s in manifest.shards)
    if manifest.modality == "tokens" and "seq_len" in spec:
        dt = spec.get("token_dtype", "auto")
        if dt not in ("uint16", "uint32"):
            dt = "uint16" if int(spec.get("vocab_size", 65536)) <= 65536 else "uint32"
        itemsize = np.dtype(dt).itemsize
        per_sample = max(int(spec["seq_len"]) * itemsize, 1)
        if manifest.compression == "none" and manifest.format == "raw":
            return cfg.batch_size * per_sample
    if cfg.decode and manifest.modality == "images":
        w, h = int(spec.get("image_width", 500)), int(spec.get("image_height", 375))
        jitter = 1 + float(spec.get("image_size_jitter", 0.2))
        per_sample = max(per_sample, int(w * h * 3 * jitter * jitter) + 64)
    return int(cfg.batch_size * per_sample * 2) + 4096


def _hist_summary(values_s: list[float]) -> dict:
    from ..metrics import summarize_seconds

    return summarize_seconds(values_s)


def run_load(cfg: LoadConfig, storage_options: dict | None = None, source=None, rank: int = 0, world: int = 1,
             progress: bool = False, synthetic: bool = False, manifest=None, deliver=None) -> LoadRun:
    """Run one load and return its metrics (see module docstring)."""
    from ..cache import set_cache_state
    from ..manifest import read_manifest
    from ..storage import open_backend
    from ..wrappers import resolve_emulation
    from .delivery import get_delivery
    from .receiver import Receiver
    from .slots import SlotPool, batch_from_meta
    from .source import BackendSource, RetryPolicy
    from .sysmon import SystemMonitor
    from .worker import WorkerJob, run_worker

    warnings: list[str] = []
    backend = open_backend(cfg.dataset, endpoint_url=cfg.endpoint_url, storage_options=storage_options,
                           field_name="dataset", check=True)
    if manifest is None:
        manifest = read_manifest(backend)
    if not manifest.shards:
        raise ConfigError("dataset", f"the manifest at {cfg.dataset} lists no shards", "regenerate the dataset")
    compute = Compute(cfg.compute_model())
    deliver = deliver or get_delivery(cfg.device)
    if getattr(deliver, "bind", None) is not None:  # a GPU delivery picks its route for this dataset (iobench.gds)
        deliver.bind(manifest, cfg.dataset)
    plans, total = plan_epochs(cfg, [s.samples for s in manifest.shards], rank, world)
    my_shards = sorted({s for p in plans for b in p.blocks for s in b.shards})
    cache_state = {"declared": "synthetic (no I/O)"} if synthetic else \
        set_cache_state(backend, [manifest.shards[s].path for s in my_shards], cfg.cache)
    emulation = resolve_emulation(cfg.emulate)
    if source is None:
        source = BackendSource(url=cfg.dataset, endpoint_url=cfg.endpoint_url, storage_options=storage_options or {},
                               emulation=cfg.emulate, seed=cfg.seed,
                               block_size=parse_size(cfg.s3_block_size, "load.s3_block_size"),
                               concurrency=cfg.s3_concurrency, s3_client=cfg.s3_client,
                               retry=RetryPolicy(attempts=cfg.retries, budget_s=cfg.retry_budget_s),
                               error_rate=cfg.error_rate, timeout_rate=cfg.timeout_rate, odirect=cfg.odirect)
    if cfg.odirect and not synthetic:
        _check_odirect(backend, manifest, warnings)
    slot_bytes = cfg.slot_bytes or estimate_slot_bytes(cfg, manifest)
    ctx = mp.get_context(cfg.start_method)
    pool = SlotPool(ctx, cfg.prefetch + 1, slot_bytes, cfg.workers)  # +1: the batch the step computes on
    owner = _batch_owners(plans, cfg.workers, total)
    pipes = [ctx.Pipe(duplex=False) for _ in range(cfg.workers)]
    stop = ctx.Event()
    procs = []
    monitor = SystemMonitor(cfg.monitor_interval_s)
    waits: list[float] = []
    computes: list[float] = []
    steps_s: list[float] = []
    depths: list[int] = []
    t_step: list[float] = []
    batch_bytes: list[int] = []
    lens: list[int] = []
    samples = 0
    bar = None
    rx = None

    try:
        for wid in range(cfg.workers):
            job = WorkerJob(wid=wid, workers=cfg.workers, manifest=manifest, plans=plans, total_batches=total,
                            decode=cfg.decode, synthetic=synthetic, read_ahead=cfg.read_ahead)
            p = ctx.Process(target=run_worker, args=(job, source, pool, pipes[wid][1], stop), daemon=True,
                            name=f"iobench-load-{wid}")
            p.start()
            procs.append(p)
        import os

        # Poll for batches before blocking only where a core is left over for the consumer.
        rx = Receiver([r for r, _ in pipes], procs, sent=pool.sent,
                      spin_s=_SPIN_S if (os.cpu_count() or 1) > cfg.workers else 0.0)

        monitor.start([os.getpid()] + [p.pid for p in procs])
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            bar = Progress(TextColumn("load"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                           transient=True)
            bar.start()
            task = bar.add_task("load", total=total)
        t_spawn = now_ns()
        rx.wait_started(cfg.workers)  # connections and imports are start-up, not throughput
        t_start = now_ns()
        for k in range(total):
            t0 = now_ns()
            meta = rx.wait_batch(k)
            batch = deliver(batch_from_meta(meta, pool))
            t1 = now_ns()
            depths.append(rx.ready() + 1)  # batches ready when this step got its own (included)
            # Like a host thread while the accelerator computes: take worker messages meanwhile.
            try:
                c = compute(batch, k, idle=rx.idle)
            except Exception as e:
                if cfg.compute_mode != "callback":
                    raise
                raise IobenchError(f"--compute-fn {cfg.compute_fn} failed at step {k}: "
                                   f"{type(e).__name__}: {e}") from e
            del batch
            pool.release(k, int(owner[k + pool.n]) if k + pool.n < total else None)
            t2 = now_ns()
            waits.append((t1 - t0) / 1e9)
            computes.append(c)
            steps_s.append((t2 - t0) / 1e9)
            t_step.append((t0 - t_start) / 1e9)
            batch_bytes.append(meta["nbytes"])
            samples += meta["n"]
            lens.append(meta["n"])
            if bar is not None:
                bar.update(task, advance=1)
        t_end = now_ns()
        system = monitor.stop()  # before workers exit: their shared pages would turn into the parent's USS
        stop.set()
        rx.wait_done(cfg.workers, 30.0)
    finally:
        stop.set()
        if bar is not None:
            bar.stop()
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
        pool.close()

    wall_s = (t_end - t_start) / 1e9
    done, io_hist, overflow = rx.done, rx.io_hist, rx.overflow
    if len(done) < cfg.workers:
        warnings.append(f"{cfg.workers - len(done)} worker(s) did not report their counters; bytes may be undercounted")
    if overflow:
        warnings.append(f"{overflow} batch(es) did not fit a {slot_bytes}-byte slot and were pickled; "
                        "raise --slot-bytes")
    read_hists: dict[str, LatencyHistogram] = {}
    calls: dict[str, int] = {}
    bytes_read = 0
    per_worker = []
    for wid in sorted(done):
        st = done[wid]
        src = st.get("source") or {}
        bytes_read += int(src.get("bytes_read", 0))
        for op, enc in (src.get("hist") or {}).items():
            read_hists.setdefault(op, LatencyHistogram()).merge(LatencyHistogram.decode(enc))
        for op, n in (src.get("calls") or {}).items():
            calls[op] = calls.get(op, 0) + n
        per_worker.append({"worker": wid, "pid": st["pid"], "batches": st["batches"], "samples": st["samples"],
                           "bytes_read": int(src.get("bytes_read", 0)), "busy_s": st["busy_s"],
                           "slot_wait_s": st["slot_wait_s"],
                           "bytes_per_s": int(src.get("bytes_read", 0)) / wall_s if wall_s > 0 else None,
                           "samples_per_s": st["samples"] / wall_s if wall_s > 0 else None})
    # Rule 4: the first step includes worker start-up and the first read; it is excluded.
    w, s = waits[1:], steps_s[1:]
    stall = sum(w) / sum(s) if s and sum(s) > 0 else 0.0
    measured_s = sum(s)
    metrics = {
        "steps": total,
        "samples": samples,
        "epochs_planned": len(plans),
        "first_step_excluded": True,
        "stall_ratio": stall,
        "accelerator_utilization": 1.0 - stall,
        "wall_s": wall_s,
        "wait_s_total": sum(w),
        "compute_s_total": sum(computes[1:]),
        "first_step_s": steps_s[0] if steps_s else None,
        "startup_s": (t_start - t_spawn) / 1e9,
        "batch_wait_s": _hist_summary(w),
        "batch_io_s": io_hist.summary(),
        "batch_io_hist": io_hist.encode() if io_hist.count else None,
        "batch_wait_hist": _encode(w),
        "compute_hist": _encode(computes[1:]),
        "compute_s": _hist_summary(computes[1:] or computes),
        "step_s": _hist_summary(s),
        "batch_bytes": float(np.mean(batch_bytes)) if batch_bytes else 0.0,
        "batch_bytes_max": int(max(batch_bytes)) if batch_bytes else 0,
        "bytes_read": bytes_read,
        "throughput": {
            "samples_per_s": samples / wall_s if wall_s > 0 else None,
            "bytes_per_s": bytes_read / wall_s if wall_s > 0 else None,
            "batches_per_s": total / wall_s if wall_s > 0 else None,
            "steady_samples_per_s": sum(lens[1:]) / measured_s if measured_s > 0 else None,
        },
        "read_latency_s": {op: h.summary() for op, h in read_hists.items()},
        "read_calls": calls,
        "queue_depth": {"mean": float(np.mean(depths)) if depths else 0.0, "max": max(depths, default=0),
                        "slots": cfg.prefetch + 1, "slot_bytes": slot_bytes},
        "per_worker": per_worker,
        "series": {"t_s": t_step, "wait_s": waits, "compute_s": computes, "queue_depth": depths},
        "system": system,
        "pickled_batches": overflow,
    }
    src_desc = source.describe() if hasattr(source, "describe") else {"kind": type(source).__name__}
    environment = {
        "cache": cache_state,
        "storage": "synthetic" if synthetic else ("emulated" if emulation.active else "real"),
        "emulation": emulation.describe() if emulation.active else None,
        "source": src_desc,
        "dataset": {"url": cfg.dataset, "format": manifest.format, "modality": manifest.modality,
                    "compression": manifest.compression, "shards": len(manifest.shards),
                    "samples": manifest.total_samples, "bytes": manifest.total_bytes},
        "loader": {"workers": cfg.workers, "prefetch": cfg.prefetch, "start_method": cfg.start_method,
                   "delivery": cfg.device, "compute": cfg.compute_model().describe()},
        "world": {"rank": rank, "size": world},
        "delivery": _describe_delivery(deliver, cfg.device),
        "first_step_excluded": "stall and utilization exclude step 0, as MLPerf Storage does; worker start-up "
                               "(processes, storage connections) happens before the clock starts (startup_s)",
    }
    for reason in getattr(deliver, "reasons", ()):  # GPU delivery fallbacks (iobench.gds.delivery)
        warnings.append(f"--device {cfg.device}: {reason}")
    return LoadRun(metrics=metrics, environment=environment, warnings=warnings)


def _batch_owners(plans: list[EpochPlan], workers: int, total: int) -> np.ndarray:
    """Which worker produces each batch (block b belongs to worker b % W)."""
    out = np.empty(total, dtype=np.int32)
    k = 0
    for p in plans:
        for b in p.blocks:
            n = min(len(b.batch_sizes), total - k)
            if n <= 0:
                return out
            out[k:k + n] = b.index % workers
            k += n
    return out


def _check_odirect(backend, manifest, warnings: list[str]) -> None:
    import os

    if not backend.supports_odirect:
        warnings.append(f"--odirect ignored: {backend.protocol}:// has no O_DIRECT; reads are buffered")
        return
    path = backend.local_path(manifest.shards[0].path)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError as e:
        raise ConfigError("--odirect", f"the filesystem under {backend.root} refuses O_DIRECT ({e.strerror})",
                          "drop --odirect (tmpfs and some FUSE filesystems do not support it)") from None


def _encode(values_s: list[float]) -> str | None:
    """An encoded HDR histogram (mergeable across ranks; the report plots its full CDF)."""
    if not values_s:
        return None
    h = LatencyHistogram()
    for v in values_s:
        h.record_s(v)
    return h.encode()


def _describe_delivery(deliver, device: str) -> dict:
    """The effective delivery path (a GPU delivery records its fallbacks), not just the requested one."""
    fn = getattr(deliver, "describe", None)
    if fn is None:
        return {"device": device, "path": "host (zero-copy view of the slot)" if device == "cpu" else "custom"}
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 — a description must not fail the run
        return {"device": device, "error": f"{type(e).__name__}: {e}"}
