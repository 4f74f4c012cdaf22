"""Simulated accelerators: MLPerf Storage's one rank per accelerator, each with its own loader.

``run_mlperf(cfg)`` does what an MLPerf result is (mlcommons/storage Submission_guidelines.md):
one warm-up run (§6.6.1) then 5 runs (§3), a new seed each (§6.6.3), each run the workload's fixed
number of epochs (§2.1 "ends after a predetermined number of epochs").  An epoch is one pass of
``cfg.accelerators`` consumer processes on this node, each running the loader
(``iobench.loader.core.run_load``) as rank ``r`` of the world with the workload's batch, read
threads as workers, and the accelerator's step time as emulated compute followed by a barrier
across the accelerators (iobench.mlperf.sync: DLIO's barrier after every step).  An epoch is
``floor(samples / batch / ranks)`` steps (DLIO main.py ``_train``: the remainder is dropped).
Under MPI each MPI rank is a node-level coordinator and ranks are numbered ``node * accelerators +
local``.

AU (Submission_guidelines.md §4; DLIO statscounter.py ``compute_metrics_train`` / ``end_run``): per
rank and epoch, nominal compute of the steps after the first over their wall time (the first step
of every epoch excluded, the barrier after it counted: ``mlperf_steps``); the run's AU is the mean over ranks, then over epochs; a run passes when
that mean is at least the workload's threshold, and the result passes when every run does.  The
worst accelerator's AU stays beside it as a diagnostic.  A sleep that overran its nominal time (an
overloaded host) is counted as idle, and the results warn.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import queue as queue_mod
import statistics
from dataclasses import dataclass

from ..config import check_choice
from ..errors import ConfigError, IobenchError
from . import rules as R
from .workloads import MlperfWorkload, load_mlperf_workload

CACHE_MODES = ("auto", "cold", "as-is")
# The loader's warnings about its own headline (steady window, warm-up share): MLPerf's AU is counted
# here, per epoch, so they do not apply to it.
_LOADER_ONLY = ("not stable after", "warm-up (worker start")
MIN_MEASURED_STEPS = 1     # per epoch, after the excluded first step
START_TIMEOUT_S = 600.0    # the accelerators' start barrier: every loader's setup (cold pages dropped) done


@dataclass(frozen=True)
class MlperfConfig:
    dataset: str
    workload: str = "unet3d"
    accelerator: str = "h100"
    accelerators: int = 1               # simulated accelerators on this node
    compute_s: float | None = None      # overrides the workload's step time for the accelerator
    epochs: int = 0                     # 0: the workload's (5)
    min_steps: int = 0                  # > 0: at least this many steps per epoch (epochs repeat inside it)
    runs: int = R.DEFAULT_RUNS
    warmup: bool = True                 # one warm-up run before the measured ones
    client_memory: int = 0              # bytes per client node; 0: this host's memory
    cache: str = "auto"                 # auto: cold every epoch when the dataset is under 5x memory
    workers: int = 0                    # 0: the workload's read threads
    prefetch: int = 0                   # 0: as DLIO sets it from prefetch_size 2 (prefetch_for)
    au_threshold: float = 0.0           # 0: the workload's
    seed: int = 0
    endpoint_url: str | None = None
    emulate: str = "none"               # emulated storage latency/bandwidth (iobench.wrappers), for ground truth
    synthetic: bool = False             # no I/O (batches of the right size from memory): prep-only
    checkpoint: bool = True             # the workload's checkpoint (unet3d: after epoch 5), where it has one
    checkpoint_folder: str | None = None   # default: a new directory beside the dataset (removed after)
    checkpoint_scale: float = 1.0       # < 1: a scaled checkpoint, for tests (not rule-compliant)

    def __post_init__(self) -> None:
        check_choice("mlperf.cache", self.cache, CACHE_MODES)
        for name, low in (("accelerators", 1), ("runs", 1)):
            if getattr(self, name) < low:
                raise ConfigError(f"--{name}", f"must be at least {low}, got {getattr(self, name)}",
                                  f"give {name} >= {low}")
        for name in ("epochs", "min_steps", "client_memory", "workers", "seed", "prefetch"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')}", f"must be zero or more, got {getattr(self, name)}",
                                  "give a non-negative number")
        if not 0 <= self.au_threshold <= 1:
            raise ConfigError("--au-threshold", f"{self.au_threshold} is outside 0..1", "give e.g. 0.9")
        if not 0 < self.checkpoint_scale <= 1:
            raise ConfigError("--checkpoint-scale", f"{self.checkpoint_scale} is outside (0, 1]", "give e.g. 0.01")
        from ..wrappers import parse_emulation

        parse_emulation(self.emulate)

    def resolve(self) -> tuple[MlperfWorkload, float, float]:
        """(workload, compute seconds per step, AU threshold)."""
        wl, _ = load_mlperf_workload(self.workload)
        return wl, wl.step_compute_s(self.accelerator, self.compute_s), self.au_threshold or wl.au_threshold


def _consumer(cfg_dict: dict, rank: int, world: int, synthetic: bool, barrier, step_barrier, compute_s: float,
              group: int, q) -> None:
    from ..loader.core import LoadConfig, run_load
    from . import sync

    try:
        cfg = LoadConfig(**cfg_dict)
        sync.arm(compute_s, step_barrier, group)
        # The accelerators start reading together: the barrier after each one's loader setup (the cold
        # pages dropped and checked per file, the schedule), just before its workers start.  Before the
        # setup, one accelerator started reading 1.0 s before the other (unet3d shape, 2 accelerators at
        # 100 MB/s, a loaded host) and the excluded first step absorbed its head start.
        run = run_load(cfg, rank=rank, world=world, synthetic=synthetic,
                       ready=lambda: barrier.wait(timeout=START_TIMEOUT_S))
        m = run.metrics
        series = m.pop("series", None) or {}
        sleeps = list(sync.STEP.sleep_s)
        if series:
            # the accelerator's sleep on each group's last loader step; the barrier is idle time
            series["compute_s"] = [sleeps[k // group] if (k + 1) % group == 0 and k // group < len(sleeps) else 0.0
                                   for k in range(len(series.get("t_s", [])))]
            m["series"] = series
        m["au_model"] = _model_au(cfg, m) if group == 1 else None
        m["first_io_s"] = first_io_s(series, m)
        m.pop("series", None)
        m["mlperf_steps"] = mlperf_steps(list(series.get("t_s", [])), m["wall_s"], group, sleeps,
                                         list(sync.STEP.barrier_s))
        q.put(("ok", rank, m, run.environment, run.warnings))
    except BaseException as e:  # noqa: BLE001 — reported to the coordinator, which raises it
        for b in (barrier, step_barrier):   # the others must not wait for this one's start or next step
            try:
                b.abort()
            except Exception:  # noqa: BLE001
                pass
        q.put(("error", rank, f"{type(e).__name__}: {e}", None, None))


def first_io_s(series: dict, m: dict) -> float:
    """When this accelerator's first read was issued, on the loader's clock (negative: before it starts).

    A batch's ``start_s`` is when its worker began reading it (iobench.loader.worker ``_Emitter.gate``);
    a worker reads as soon as it is ready, while the next ones are still starting, so the earliest is
    usually before the loader's clock.  Where no batch carries one, the start of the workers' spawn."""
    starts = [s for s in series.get("start_s") or () if s is not None]
    return min(starts) if starts else -m["startup_s"]


def mlperf_steps(t_s: list[float], wall_s: float, group: int, sleeps: list[float],
                 barriers: list[float]) -> dict:
    """The measured MLPerf steps of one accelerator's epoch (every step but the first).

    A step is a group of ``group`` loader steps, from its first piece's wait to the next group's
    (``t_s``: loader step starts; the last step ends at ``wall_s``).  The first step is excluded as
    DLIO excludes it (statscounter.py ``compute_metrics_train``: ``total_time`` = the block's time less
    ``proc`` of the first ``metric_exclude_start_steps`` = 1 steps, where ``proc`` runs from
    ``start_loading`` to ``batch_processed``, i.e. loading and compute): the barrier after it (main.py
    ``_train``: ``comm.barrier()`` after ``batch_processed``) is idle time inside the measured window,
    so it opens the first measured step.  With several accelerators that barrier is where the ones whose
    first batch came early wait for the last one."""
    t = t_s[::group] + [wall_s]
    step_s = [b - a for a, b in zip(t, t[1:])][1:]
    if step_s and barriers:
        step_s[0] += barriers[0]
    return {"step_s": step_s, "compute_s": sleeps[1:], "barrier_s": barriers[:len(step_s) + 1]}


def _model_au(cfg, m: dict) -> float | None:
    """Ground truth computed another way: the discrete-event loader model replaying this run's
    per-batch worker times (iobench.planner.loader_sim).  None where the run lacks the series."""
    try:
        from ..planner.loader_sim import predict_from_run

        pattern = getattr(cfg, "access", None) or getattr(cfg, "pattern", None) or "block"
        return 1.0 - predict_from_run(m, pattern, cfg.workers, cfg.prefetch).stall_ratio
    except Exception:  # noqa: BLE001 — a cross-check must not fail the measurement
        return None


def loader_group(wl: MlperfWorkload, workers: int) -> int:
    """Loader steps per MLPerf step: a TFRecord stream's batch is cut from ``workers`` files read in
    parallel (tf.data interleave, DLIO reader/tf_reader.py), one piece per worker (iobench.mlperf.sync)."""
    if wl.access == "stream" and workers > 1 and wl.batch_size % workers == 0:
        return workers
    return 1


DLIO_PREFETCH_SIZE = 2   # DLIO utils/config.py ``prefetch_size`` (reader.prefetch_size): batches ahead


def prefetch_for(wl: MlperfWorkload, workers: int, group: int) -> int:
    """Loader prefetch per worker, from DLIO's ``prefetch_size`` of 2 batches.

    PyTorch (map; DLIO data_loader/torch_data_loader.py ``read``): ``prefetch_factor =
    ceil(prefetch_size / read_threads)`` per worker -- unet3d's 4 workers keep 1 batch each in flight,
    4 in all, not 2 each.  tf.data (stream; reader/tf_reader.py ``next``): ``dataset.prefetch(prefetch_size)``
    after the batch, so 2 per worker; a batch cut in pieces (``group`` > 1) is then 2 whole batches, its
    workers in lock step (LoadConfig.lockstep) as tf.data's interleave keeps its files within 2 records
    of each other.  Free-running workers 4 pieces deep (the old setting) let the excluded first step
    absorb the read of ~4 batches and the measured steps start with 3 in hand: AU 50.9-51.6% for a
    truth of 48.8% (4 epochs), 0.55-0.79 s of buffered steps computed with the disk idle at the epoch's
    end; in lock step 48.5% (2 epochs) and 0.24 s (one step): resnet50 shape at 100 MB/s,
    benchmarks/bench_dlio.py."""
    if wl.access == "map":
        return max(1, math.ceil(DLIO_PREFETCH_SIZE / max(1, workers)))
    return DLIO_PREFETCH_SIZE


def _load_fields(cfg: MlperfConfig, wl: MlperfWorkload, compute_s: float, cache: str, seed: int,
                 steps: int) -> dict:
    from . import sync

    shuffle, buffer = wl.loader_shuffle()
    workers = cfg.workers or wl.read_threads
    group = loader_group(wl, workers)
    return {"dataset": cfg.dataset, "workers": workers, "prefetch": cfg.prefetch or prefetch_for(wl, workers, group),
            "batch_size": wl.batch_size // group, "epochs": 1, "steps": steps * group, "shuffle": shuffle,
            "shuffle_buffer": buffer, "drop_last": wl.drop_last and wl.access == "map", "seed": seed,
            "lockstep": group > 1,
            "compute": f"{compute_s}s", "compute_mode": "callback", "compute_fn": sync.CALLBACK,
            "cache": cache, "endpoint_url": cfg.endpoint_url, "emulate": cfg.emulate, "access": wl.access}


def steps_per_epoch(total_samples: int, world: int, batch_size: int) -> int:
    """DLIO main.py ``_train``: ``max_steps = floor(samples / batch / ranks)`` (the remainder is dropped)."""
    return math.floor(total_samples / batch_size / max(1, world))


def run_accelerators(load_fields: dict, accelerators: int, compute_s: float, rank0: int = 0,
                     world: int | None = None, synthetic: bool = False, group: int = 1,
                     timeout_s: float = 3600.0) -> list[tuple[dict, dict, list]]:
    """Run ``accelerators`` consumers concurrently; [(metrics, environment, warnings)] by local rank."""
    world = world or accelerators
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()
    barrier = ctx.Barrier(accelerators)
    step_barrier = ctx.Barrier(accelerators)
    # Not daemonic: each consumer starts its own loader worker processes.
    procs = [ctx.Process(target=_consumer, args=(load_fields, rank0 + i, world, synthetic, barrier, step_barrier,
                                                 compute_s, group, q), name=f"iobench-accel-{i}")
             for i in range(accelerators)]
    for p in procs:
        p.start()
    out: dict[int, tuple] = {}
    error = None
    try:
        while len(out) < accelerators and error is None:
            try:
                kind, rank, m, env, warns = q.get(timeout=1.0)
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    error = f"accelerator process {dead[0].name} died (exit code {dead[0].exitcode})"
                continue
            if kind == "error":
                error = f"accelerator {rank}: {m}"
            else:
                out[rank - rank0] = (m, env, warns)
    finally:
        for p in procs:
            p.join(timeout=5 if error else timeout_s)
            if p.is_alive():
                p.terminate()
                p.join(5)
    if error:
        raise IobenchError(error)
    return [out[i] for i in range(accelerators)]


def step_au(steps: list[float], computes: list[float]) -> dict:
    """AU = sum(compute) / sum(step time) over the measured steps (step time: start to next start,
    as the loader's own stall ratio counts it), with the loader's batch-means 95% interval
    (iobench.loader.stability: contiguous groups absorb correlated neighbouring steps)."""
    from ..loader.stability import stall_interval

    n = min(len(steps), len(computes))
    steps = steps[:n]
    total = sum(steps)
    if n == 0 or total <= 0:
        return {"au": 0.0, "au_ci95": None, "steps": n, "compute_s": 0.0, "step_s_total": 0.0}
    compute = sum(computes[:n])
    iv = stall_interval([max(0.0, s - c) for s, c in zip(steps, computes)], steps)
    au = compute / total
    ci = None if iv.get("half_width") is None else [max(0.0, au - iv["half_width"]), min(1.0, au + iv["half_width"])]
    return {"au": au, "au_ci95": ci, "steps": n, "compute_s": compute, "step_s_total": total,
            "au_ci_note": iv.get("note")}


def _write_checkpoint(folder: str, name: str, nbytes: int) -> dict:
    """unet3d's checkpoint: ``nbytes`` written and fsynced (file, then directory), timed."""
    import os
    import time

    import numpy as np

    from ..io.atomic import atomic_open

    chunk = np.random.default_rng(0).integers(0, 256, size=min(nbytes, 16 << 20), dtype=np.uint8).tobytes()
    path = os.path.join(folder, name)
    t0 = time.perf_counter_ns()
    with atomic_open(path, "wb", fsync=True) as f:
        left = nbytes
        while left > 0:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
    s = (time.perf_counter_ns() - t0) / 1e9
    return {"path": path, "bytes": nbytes, "seconds": s, "GB_per_s": nbytes / s / 1e9 if s > 0 else None,
            "fsync": True}


def epoch_seed(seed: int, run_index: int, epoch: int) -> int:
    """The loader's seed for epoch ``epoch`` of run ``run_index`` (the warm-up is run -1): a new seed every
    run (§6.6.3) and every epoch.  benchmarks/bench_dlio.py replays the shuffles it gives."""
    return seed + 1000 * (run_index + 1) + epoch


def _one_run(cfg: MlperfConfig, wl: MlperfWorkload, compute_s: float, epochs: int, cold: bool, run_index: int,
             world_rank0: int, world_size: int, steps: int, world=None, ckpt: dict | None = None) -> dict:
    """One MLPerf run: all accelerators, ``epochs`` passes (one per epoch, each its first step excluded)."""
    seed = epoch_seed(cfg.seed, run_index, 0)
    per: list[dict] = [dict(samples=0, bytes_read=0, wall_s=0.0, startup_s=0.0, au_epochs=[], step_s=[], compute_s=[],
                            barrier_s=0.0, wait_s=0.0, caches=[], warnings=[], model=[], busy_s=0.0,
                            run_delay_s=0.0, delay_known=True)
                       for _ in range(cfg.accelerators)]
    io_p99: list[list[float]] = [[] for _ in range(cfg.accelerators)]
    walls: list[float] = []
    checkpoint = None
    for e in range(epochs):
        fields = _load_fields(cfg, wl, compute_s, "cold" if cold else ("as-is" if cfg.cache == "auto" else cfg.cache),
                              epoch_seed(cfg.seed, run_index, e), steps)
        if world is not None:
            world.barrier("mlperf epoch")   # every node's accelerators start each epoch together
        results = run_accelerators(fields, cfg.accelerators, compute_s, world_rank0, world_size,
                                   synthetic=cfg.synthetic, group=loader_group(wl, fields["workers"]))
        # samples/s and bytes/s over the wall from the first read to the end of the last step: "The I/O
        # operations that are excluded from the AU calculation are included in the samples/second"
        # (Guidelines §4), so the excluded first step and the reads workers issue while the others are
        # still starting count; starting processes is not I/O, and is left out (reported: startup_s).
        # The accelerators end together at the last step's barrier, so the longest of their walls runs
        # from the earliest first read of the epoch.
        io_walls = [m["wall_s"] - m["first_io_s"] for m, _, _ in results]
        walls.append(max(io_walls))
        for i, (m, env, warns) in enumerate(results):
            p = per[i]
            st = m["mlperf_steps"]
            p["samples"] += m["samples"]
            p["bytes_read"] += m["bytes_read"]
            p["wall_s"] += io_walls[i]
            p["startup_s"] += m["wall_s_with_startup"] - io_walls[i]
            # AU counts the nominal compute: a sleep that overran (host overloaded, the consumer late to
            # wake) is time the accelerator was idle, not busy -- as on a real device.
            p["au_epochs"].append(step_au(st["step_s"], [compute_s] * len(st["step_s"]))["au"])
            p["step_s"].extend(st["step_s"])
            p["compute_s"].extend(st["compute_s"])
            p["barrier_s"] += sum(st["barrier_s"])
            p["wait_s"] += m["wait_s_total"]
            for w in m.get("per_worker") or ():      # CPU contention, as the driver reads it (cpu_contention)
                if w.get("run_delay_s") is None or w.get("busy_s") is None:
                    p["delay_known"] = False
                else:
                    p["busy_s"] += w["busy_s"]
                    p["run_delay_s"] += w["run_delay_s"]
            if m.get("au_model") is not None:
                p["model"].append((m["au_model"], len(st["step_s"])))
            p["caches"].append((env.get("cache") or {}).get("declared") or env.get("cache"))
            p["warnings"].extend(warns)
            io_p99[i].append((m.get("batch_io_s") or {}).get("p99") or 0.0)
        if ckpt is not None and e + 1 == ckpt["after_epoch"] and world_rank0 == 0:
            # outside the AU, as DLIO ends the block before saving (main.py _train)
            checkpoint = _write_checkpoint(ckpt["folder"], f"{wl.name}-run{run_index}-epoch{e + 1}.ckpt",
                                           ckpt["bytes"])
    per_rank = []
    for i, p in enumerate(per):
        a = step_au(p["step_s"], [compute_s] * len(p["step_s"]))
        measured = sum(p["compute_s"]) / len(p["compute_s"]) if p["compute_s"] else None
        if measured is not None and measured > 1.1 * compute_s:
            p["warnings"].append(f"accelerator {world_rank0 + i}: emulated compute took {measured * 1e3:.1f} ms per "
                                 f"step on average for {compute_s * 1e3:.1f} ms nominal (host overloaded); AU counts "
                                 "the nominal time")
        per_rank.append({
            "rank": world_rank0 + i, "au": statistics.fmean(p["au_epochs"]), "au_per_epoch": p["au_epochs"],
            "au_ci95": a["au_ci95"],
            "au_model": (sum(v * n for v, n in p["model"]) / max(1, sum(n for _, n in p["model"]))
                         if p["model"] else None),
            "steps": a["steps"], "samples": p["samples"], "bytes_read": p["bytes_read"],
            "samples_per_s": p["samples"] / p["wall_s"] if p["wall_s"] > 0 else None,
            "bytes_per_s": p["bytes_read"] / p["wall_s"] if p["wall_s"] > 0 else None,
            "wall_s_from_first_io": p["wall_s"], "startup_s_before_first_io": p["startup_s"],
            "wait_s": p["wait_s"], "barrier_wait_s": p["barrier_s"], "batch_io_p99_s": max(io_p99[i], default=0.0),
            "compute_measured_s_mean": measured,
            # the share of its workers' busy time they spent runnable but waiting for a CPU (schedstat)
            "cpu_contention": p["run_delay_s"] / p["busy_s"] if p["delay_known"] and p["busy_s"] > 0 else None,
            "cache": p["caches"][0] if p["caches"] else None})
    out = _world_run(per_rank, sum(walls), [w for p in per for w in p["warnings"]])
    out["checkpoint"] = checkpoint
    out["seed"] = seed
    return out


def _world_run(per_rank: list[dict], wall: float, warnings: list[str]) -> dict:
    """A run of many accelerators: totals over ranks, throughput = totals / the longest wall; AU = the
    mean over ranks of each epoch, then over epochs (DLIO statscounter.py end_run: allreduce / size)."""
    samples = sum(r["samples"] for r in per_rank)
    nbytes = sum(r["bytes_read"] for r in per_rank)
    aus = [r["au"] for r in per_rank]
    epochs = len(per_rank[0]["au_per_epoch"])
    au_epochs = [statistics.fmean(r["au_per_epoch"][e] for r in per_rank) for e in range(epochs)]
    worst = min(range(len(aus)), key=aus.__getitem__)
    return {"per_rank": per_rank, "au": statistics.fmean(au_epochs), "au_per_epoch": au_epochs,
            "au_min": min(aus), "worst_rank": worst,
            "samples": samples, "bytes_read": nbytes, "wall_s_from_first_io": wall,
            "samples_per_s": samples / wall if wall > 0 else None, "bytes_per_s": nbytes / wall if wall > 0 else None,
            "warnings": sorted(set(warnings))}


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else None,
            "range_ratio": (max(values) - min(values)) / statistics.fmean(values) if statistics.fmean(values) else None}


def _checkpoint_plan(cfg: MlperfConfig, wl: MlperfWorkload, epochs: int):
    """(plan or None, folder we made or None)."""
    import os
    import tempfile

    if wl.checkpoint is None or not cfg.checkpoint or wl.checkpoint.after_epoch > epochs:
        return None, None
    made = None
    folder = cfg.checkpoint_folder
    if folder is None:
        parent = os.path.dirname(os.path.abspath(cfg.dataset)) if "://" not in cfg.dataset or \
            cfg.dataset.startswith("file://") else tempfile.gettempdir()
        parent = parent.replace("file://", "")
        folder = made = tempfile.mkdtemp(prefix=f"iobench-mlperf-{wl.name}-ckpt-", dir=parent)
    else:
        os.makedirs(folder, exist_ok=True)
    return {"after_epoch": wl.checkpoint.after_epoch, "bytes": max(1, int(wl.checkpoint.model_bytes *
                                                                          cfg.checkpoint_scale)),
            "folder": folder}, made


def check_dataset_fits(cfg: MlperfConfig, total_samples: int, world_size: int, batch: int) -> int:
    steps = steps_per_epoch(total_samples, world_size, batch)
    if steps < 1 + MIN_MEASURED_STEPS and not cfg.min_steps:
        need = (1 + MIN_MEASURED_STEPS) * batch * world_size
        raise ConfigError("dataset", f"{total_samples} samples give {steps} step(s) per epoch for {world_size} "
                                     f"accelerator(s) at batch {batch}; an epoch needs 2 (the first is excluded)",
                          f"generate at least {need} samples (`iobench mlperf datasize` for MLPerf's count), "
                          "or give --min-steps")
    return steps


def run_mlperf(cfg: MlperfConfig, world=None) -> dict:
    """A warm-up run and ``cfg.runs`` MLPerf runs; the MLPerf-vocabulary result (README: MLPerf Storage)."""
    import os
    import shutil

    import psutil

    from ..manifest import read_manifest
    from ..storage import open_backend

    wl, compute_s, threshold = cfg.resolve()
    backend = open_backend(cfg.dataset, endpoint_url=cfg.endpoint_url, field_name="dataset", check=True)
    manifest = read_manifest(backend)
    nodes = world.size if world is not None else 1
    node = world.rank if world is not None else 0
    client_memory = cfg.client_memory or psutil.virtual_memory().total
    scale = float((manifest.spec or {}).get("scale", 1.0) or 1.0)
    samples_per_file = max(1, round(manifest.total_samples / max(1, len(manifest.shards))))
    need = R.datasize(client_memory, nodes, cfg.accelerators, samples_per_file,
                      wl.record_bytes or manifest.total_bytes / max(1, manifest.total_samples), wl.batch_size)
    under = manifest.total_bytes < R.MEMORY_MULTIPLE * client_memory * nodes
    cold = cfg.cache == "cold" or (cfg.cache == "auto" and under)
    epochs = cfg.epochs or wl.epochs
    world_size = nodes * cfg.accelerators
    steps = check_dataset_fits(cfg, manifest.total_samples, world_size, wl.batch_size)
    notes: list[str] = []
    if cfg.min_steps and steps < cfg.min_steps:
        if cold:
            # A lengthened epoch repeats its samples, and a cold run's repeats come from the page cache
            # its first pass just filled: AU and MB/s then exceed what the storage can feed (2 unet3d
            # accelerators on a 12 MB/s disk read AU 72-85% for a truth of 60%).  So each epoch becomes
            # several cold passes, the cache dropped before each, as every epoch already is.
            passes = -(-cfg.min_steps // steps)
            notes.append(f"{steps} steps per epoch is under --min-steps {cfg.min_steps}: {passes} cold passes "
                         f"per epoch ({epochs * passes} epochs of {steps} steps, the page cache dropped before "
                         "each) instead of one lengthened epoch whose repeats would be read from memory")
            epochs *= passes
        else:
            notes.append(f"lengthened from {steps} to {cfg.min_steps} steps per epoch (--min-steps): the "
                         "epoch's samples repeat inside it (repeats may hit the page cache)")
            steps = cfg.min_steps
    multi = world if world is not None and world.size > 1 else None
    ckpt, made = _checkpoint_plan(cfg, wl, epochs)
    try:
        warm = None
        if cfg.warmup:
            warm = _one_run(cfg, wl, compute_s, epochs, cold, -1, node * cfg.accelerators, world_size, steps, multi,
                            ckpt)
        runs = [_one_run(cfg, wl, compute_s, epochs, cold, k, node * cfg.accelerators, world_size, steps, multi,
                         ckpt) for k in range(cfg.runs)]
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)
        elif ckpt:
            for name in os.listdir(ckpt["folder"]):
                if name.startswith(f"{wl.name}-run") and name.endswith(".ckpt"):
                    os.unlink(os.path.join(ckpt["folder"], name))
    if world is not None and world.size > 1:
        gathered = world.allgather(runs)
        runs = [_merge_nodes([g[k] for g in gathered]) for k in range(cfg.runs)]
    worst_run = min(runs, key=lambda r: r["au"])   # the run reported in full: the worst one
    au = [r["au"] for r in runs]
    passed = all(a >= threshold for a in au)
    sample_bytes = manifest.total_bytes / max(1, manifest.total_samples)
    sps = _spread([r["samples_per_s"] or 0.0 for r in runs])
    bps = _spread([r["bytes_per_s"] or 0.0 for r in runs])
    record = wl.record_bytes * scale if wl.record_bytes else sample_bytes   # DLIO: the config's record length
    ckpts = [r["checkpoint"] for r in runs if r.get("checkpoint")]
    out = {
        "workload": wl.name, "accelerator": cfg.accelerator, "accelerators_per_node": cfg.accelerators,
        "nodes": nodes, "accelerators": cfg.accelerators * nodes, "compute_s_per_step": compute_s,
        "batch_size": wl.batch_size, "read_threads": cfg.workers or wl.read_threads, "access": wl.access,
        "au_threshold": threshold, "passed": passed,
        # the pass metric: mean AU over ranks and epochs, averaged over the runs (§3, statscounter end_run)
        "au": statistics.fmean(au), "au_per_run": au, "au_per_epoch_worst_run": worst_run["au_per_epoch"],
        "au_min": min(r["au_min"] for r in runs), "au_per_accelerator": [r["au"] for r in worst_run["per_rank"]],
        "au_ci95_worst": worst_run["per_rank"][worst_run["worst_rank"]]["au_ci95"],
        "worst_accelerator": worst_run["per_rank"][worst_run["worst_rank"]]["rank"],
        "samples_per_s": sps["mean"], "throughput_bytes_per_s": bps["mean"],
        # two MB/s, named: bytes read (10^6 B/s) and DLIO's (samples/s x record length / 2^20, MiB/s)
        "MB_per_s": bps["mean"] / 1e6, "MB_per_s_read": bps["mean"] / 1e6,
        "MiB_per_s_dlio": sps["mean"] * record / 2**20, "record_length_bytes": record,
        "sample_bytes_mean": sample_bytes,
        "epochs": epochs, "steps_per_epoch": steps, "runs": cfg.runs, "warmup_run": warm is not None,
        "first_step_excluded": "every epoch's",
        "steps_per_accelerator": worst_run["per_rank"][worst_run["worst_rank"]]["steps"],
        "seeds": [r["seed"] for r in runs],
        "spread": {"au": _spread(au), "au_min": _spread([r["au_min"] for r in runs]), "samples_per_s": sps,
                   "bytes_per_s": bps},
        "per_run": [{k: v for k, v in r.items() if k != "warnings"} for r in runs],
        "warmup": {k: v for k, v in warm.items() if k not in ("warnings", "per_rank")} if warm else None,
        "per_rank": worst_run["per_rank"],
        "checkpoint": ({"bytes": ckpts[0]["bytes"], "after_epoch": ckpt["after_epoch"] if ckpt else None,
                        "seconds_mean": statistics.fmean(c["seconds"] for c in ckpts),
                        "GB_per_s_mean": statistics.fmean(c["GB_per_s"] or 0.0 for c in ckpts), "fsync": True,
                        "written": len(ckpts)} if ckpts else None),
        "dataset": {"url": cfg.dataset, "format": manifest.format, "files": len(manifest.shards),
                    "samples": manifest.total_samples, "bytes": manifest.total_bytes, "scale": scale,
                    "fsync_at_generation": (manifest.spec or {}).get("fsync"),
                    "required_files": need.files, "required_by": need.bound_by},
        "cache": {"mode": "cold every epoch" if cold else cfg.cache, "client_memory_bytes": client_memory,
                  "required_dataset_bytes": need.required_bytes},
        "synthetic": cfg.synthetic,
        "warnings": sorted({w for r in runs for w in r["warnings"] if not w.startswith(_LOADER_ONLY)} | set(notes)),
    }
    comp = compliance_for(cfg, wl, out, manifest, need, scale, nodes)
    out["compliance"] = comp.as_dict()
    out["rule_compliant"] = comp.compliant
    out["rule_verdict"] = comp.verdict
    out["rule_notes"] = [f"{r.rule}: {r.used} (MLPerf: {r.required}; {r.source})" for r in comp.broken]
    return out


def compliance_for(cfg: MlperfConfig, wl: MlperfWorkload, out: dict, manifest, need: R.DataSize, scale: float,
                   nodes: int) -> R.Compliance:
    """The compliance block: every rule this run is held to, with its value and its source."""
    G, CFG = R.GUIDE, "mlcommons/storage configs/dlio/workload/"
    rule = R.rule
    files = len(manifest.shards)
    ckpt = out["checkpoint"]
    rs = [
        rule("workload values", "MLPerf's own workload configuration", wl.name if wl.mlperf_defined else
             f"{wl.name}: a user's YAML", wl.mlperf_defined, f"{CFG}{wl.name}_*.yaml; {G} §10.1"),
        rule("dataset size", f">= {need.files} files (max of 5x {nodes} client(s)' memory and "
             f"{R.STEPS_PER_EPOCH} steps x batch x accelerators)", f"{files} files", files >= need.files,
             need.source),
        rule("dataset content", "samples at the workload's size (unscaled)", f"gen --scale {scale:g}",
             scale == 1.0, f"{G} §3 'Dataset content', §7"),
        rule("storage", "the storage under test (no emulation, no synthetic batches)",
             "synthetic (no I/O)" if cfg.synthetic else (f"emulated ({cfg.emulate})" if cfg.emulate != "none"
                                                           else "real"),
             not cfg.synthetic and cfg.emulate == "none", f"{G} §6.5"),
        rule("step time", f"{wl.name}'s train.computation_time for {cfg.accelerator}",
             f"{out['compute_s_per_step']:g} s" + (" (--compute-s)" if cfg.compute_s is not None else ""),
             cfg.compute_s is None and cfg.accelerator in wl.compute_s, wl.source("compute_s") + f"; {G} §4"),
        rule("AU threshold", f"{wl.au_threshold:.0%} (metric.au)", f"{out['au_threshold']:.0%}",
             out["au_threshold"] == wl.au_threshold, wl.source("au_threshold")),
        rule("pass metric", "mean AU over ranks and epochs >= threshold, every run", f"{out['au']:.1%} mean",
             True, wl.source("au") + f"; {G} §4"),
        rule("epochs", f"{wl.epochs} (train.epochs), fixed", f"{out['epochs']}",
             out["epochs"] == wl.epochs, wl.source("epochs") + f"; {G} §2.1"),
        rule("steps per epoch", "floor(samples / batch / ranks): the remainder dropped",
             f"{out['steps_per_epoch']}" + (" (--min-steps)" if cfg.min_steps and out["steps_per_epoch"] >
                                            steps_per_epoch(manifest.total_samples, out["accelerators"],
                                                            wl.batch_size) else ""),
             out["steps_per_epoch"] == steps_per_epoch(manifest.total_samples, out["accelerators"], wl.batch_size),
             wl.source("drop_last")),
        rule("first step excluded", "the first step of every epoch", "every epoch's", True,
             f"{G} §4; DLIO statscounter.py compute_metrics_train (metric_start_step)"),
        rule("step barrier", "every step synchronized across ranks",
             "every step, across this node's accelerators" + (
                 "; across nodes once per epoch" if nodes > 1 else ""), nodes == 1,
             wl.source("step_barrier") + f"; {G} §9"),
        rule("warm-up run", "1 before the measured runs", "1" if out["warmup_run"] else "0 (--no-warmup)",
             out["warmup_run"], f"{G} §6.6.1"),
        rule("runs", f"{R.DEFAULT_RUNS}, the result their mean", str(out["runs"]), out["runs"] == R.DEFAULT_RUNS,
             f"{G} §3 'benchmark result'"),
        rule("seeds", "a new seed every run", ", ".join(str(s) for s in out["seeds"]),
             len(set(out["seeds"])) == len(out["seeds"]), f"{G} §6.6.3"),
        rule("read threads", f"{wl.read_threads} (reader.read_threads; CLOSED may change it)",
             str(out["read_threads"]), True, f"{wl.source('read_threads')}; mlpstorage/rules.py "
                                             "check_allowed_params (closed_allowed_params)"),
        rule("shuffle", _shuffle_words(wl), _shuffle_words(wl), True, wl.source("shuffle")),
    ]
    if wl.checkpoint is not None:
        want = wl.checkpoint.model_bytes
        rs.append(rule("checkpoint", f"{want} B after epoch {wl.checkpoint.after_epoch}, fsync",
                       "none (--no-checkpoint or fewer epochs)" if ckpt is None else
                       f"{ckpt['bytes']} B after epoch {ckpt['after_epoch']}, {ckpt['seconds_mean']:.2f} s",
                       ckpt is not None and ckpt["bytes"] == want,
                       wl.checkpoint.source + "; mlpstorage/rules.py check_workflow_parameters"))
    return R.Compliance(tuple(rs))


def _shuffle_words(wl: MlperfWorkload) -> str:
    if not (wl.file_shuffle or wl.sample_shuffle):
        return "no file or sample shuffle"
    parts = ["file order shuffled" if wl.file_shuffle else "file order fixed"]
    if wl.access == "stream":
        parts.append(f"sample shuffle buffer {wl.shuffle_size}" if wl.sample_shuffle else "no sample shuffle")
    else:
        parts.append("samples shuffled (map)" if wl.sample_shuffle else "samples in order")
    return ", ".join(parts)


def _merge_nodes(node_runs: list[dict]) -> dict:
    """One run across nodes: ranks concatenated, throughput = totals / the longest wall."""
    out = _world_run([r for n in node_runs for r in n["per_rank"]], max(n["wall_s_from_first_io"] for n in node_runs),
                     [w for n in node_runs for w in n["warnings"]])
    out["checkpoint"] = node_runs[0].get("checkpoint")
    out["seed"] = node_runs[0]["seed"]
    return out

