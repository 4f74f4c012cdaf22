"""Simulated accelerators: MLPerf Storage's one rank per accelerator, each with its own loader.

``run_mlperf(cfg)`` starts ``cfg.accelerators`` consumer processes on this node; each runs
the loader (``iobench.loader.core.run_load``) as rank ``r`` of the world, with the workload's
batch, read threads as workers and the accelerator's step time as emulated compute (sleep:
an accelerator leaves the host CPU free).  Under MPI each MPI rank is a node-level
coordinator and ranks are numbered ``node * accelerators + local``.

The local coordinator is deliberately small (processes started together behind a barrier,
results through a queue): across nodes, MPI ranks (``iobench.dist.world``) are the nodes.

AU of one accelerator = nominal compute time x steps / the steps' wall time, first step
excluded (MLPerf Storage's ``train_au_percentage``); the run passes when the minimum AU over
accelerators is at least the workload's threshold.  A sleep that overruns its nominal time
(an overloaded host) is counted as idle, and the results warn.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import queue as queue_mod
from dataclasses import dataclass

from ..config import check_choice
from ..errors import ConfigError, IobenchError
from .rules import DEFAULT_RUNS, compliance
from .workloads import MlperfWorkload, load_mlperf_workload

CACHE_MODES = ("auto", "cold", "as-is")
MIN_MEASURED_STEPS = 3     # fewer measured steps per accelerator cannot give an AU with an interval


@dataclass(frozen=True)
class MlperfConfig:
    dataset: str
    workload: str = "unet3d"
    accelerator: str = "h100"
    accelerators: int = 1               # simulated accelerators on this node
    compute_s: float | None = None      # overrides the workload's step time for the accelerator
    epochs: int = 0                     # 0: the workload's (5)
    min_steps: int = 0                  # > 0: at least this many steps per accelerator (epochs repeat)
    runs: int = DEFAULT_RUNS
    client_memory: int = 0              # bytes per client node; 0: this host's memory
    cache: str = "auto"                 # auto: cold every epoch when the dataset is under 5x memory
    workers: int = 0                    # 0: the workload's read threads
    prefetch: int = 2
    au_threshold: float = 0.0           # 0: the workload's
    seed: int = 0
    endpoint_url: str | None = None
    emulate: str = "none"               # emulated storage latency/bandwidth (iobench.wrappers), for ground truth
    synthetic: bool = False             # no I/O (batches of the right size from memory): prep-only

    def __post_init__(self) -> None:
        check_choice("mlperf.cache", self.cache, CACHE_MODES)
        for name, low in (("accelerators", 1), ("runs", 1), ("prefetch", 1)):
            if getattr(self, name) < low:
                raise ConfigError(f"--{name}", f"must be at least {low}, got {getattr(self, name)}",
                                  f"give {name} >= {low}")
        for name in ("epochs", "min_steps", "client_memory", "workers", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')}", f"must be zero or more, got {getattr(self, name)}",
                                  "give a non-negative number")
        if not 0 <= self.au_threshold <= 1:
            raise ConfigError("--au-threshold", f"{self.au_threshold} is outside 0..1", "give e.g. 0.9")
        from ..wrappers import parse_emulation

        parse_emulation(self.emulate)

    def resolve(self) -> tuple[MlperfWorkload, float, float]:
        """(workload, compute seconds per step, AU threshold)."""
        wl, _ = load_mlperf_workload(self.workload)
        return wl, wl.step_compute_s(self.accelerator, self.compute_s), self.au_threshold or wl.au_threshold


def _consumer(cfg_dict: dict, rank: int, world: int, synthetic: bool, barrier, q) -> None:
    from ..loader.core import LoadConfig, run_load

    try:
        cfg = LoadConfig(**cfg_dict)
        barrier.wait(timeout=120)
        run = run_load(cfg, rank=rank, world=world, synthetic=synthetic)
        m = run.metrics
        m["au_model"] = _model_au(cfg, m)
        series = m.pop("series", None) or {}
        t = list(series.get("t_s", [])) + [m["wall_s"]]
        m["mlperf_steps"] = {"step_s": [b - a for a, b in zip(t, t[1:])][1:],
                             "compute_s": list(series.get("compute_s", [])[1:])}
        q.put(("ok", rank, m, run.environment, run.warnings))
    except BaseException as e:  # noqa: BLE001 — reported to the coordinator, which raises it
        q.put(("error", rank, f"{type(e).__name__}: {e}", None, None))


def _model_au(cfg, m: dict) -> float | None:
    """Ground truth computed another way: the discrete-event loader model replaying this run's
    per-batch worker times (iobench.planner.loader_sim).  None where the run lacks the series."""
    try:
        from ..planner.loader_sim import predict_from_run

        pattern = getattr(cfg, "access", None) or getattr(cfg, "pattern", None) or "block"
        return 1.0 - predict_from_run(m, pattern, cfg.workers, cfg.prefetch).stall_ratio
    except Exception:  # noqa: BLE001 — a cross-check must not fail the measurement
        return None


def _load_fields(cfg: MlperfConfig, wl: MlperfWorkload, compute_s: float, epochs: int, cache: str,
                 seed: int, steps: int = 0) -> dict:
    from ..loader.core import LoadConfig

    d = {"dataset": cfg.dataset, "workers": cfg.workers or wl.read_threads, "prefetch": cfg.prefetch,
         "batch_size": wl.batch_size, "epochs": epochs, "shuffle": True, "seed": seed,
         "compute": f"{compute_s}s", "compute_mode": "sleep", "cache": cache, "endpoint_url": cfg.endpoint_url,
         "emulate": cfg.emulate}
    fields = {f.name for f in dataclasses.fields(LoadConfig)}
    for name in ("access", "pattern"):   # the loader's access pattern, once it has one (map | stream)
        if name in fields:
            d[name] = wl.access
    if steps:
        d["steps"] = steps
    return d


def steps_per_accelerator(total_samples: int, world: int, batch_size: int, epochs: int) -> int:
    """Steps one accelerator takes over ``epochs`` (its 1/world share of the samples, batched)."""
    return math.ceil(total_samples / max(1, world) / batch_size) * epochs


def run_accelerators(load_fields: dict, accelerators: int, rank0: int = 0, world: int | None = None,
                     synthetic: bool = False, timeout_s: float = 3600.0) -> list[tuple[dict, dict, list]]:
    """Run ``accelerators`` consumers concurrently; [(metrics, environment, warnings)] by local rank."""
    world = world or accelerators
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()
    barrier = ctx.Barrier(accelerators)
    # Not daemonic: each consumer starts its own loader worker processes.
    procs = [ctx.Process(target=_consumer, args=(load_fields, rank0 + i, world, synthetic, barrier, q),
                         name=f"iobench-accel-{i}") for i in range(accelerators)]
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


def _one_run(cfg: MlperfConfig, wl: MlperfWorkload, compute_s: float, epochs: int, cold_each_epoch: bool,
             run_index: int, world_rank0: int, world_size: int, steps: int = 0, world=None) -> dict:
    """One MLPerf run: all accelerators, all epochs.  Per-accelerator sums over epochs."""
    seed = cfg.seed + 1000 * run_index
    passes = [(e, 1) for e in range(epochs)] if cold_each_epoch else [(0, epochs)]
    per: list[dict] = [dict(samples=0, bytes_read=0, wall_s=0.0, step_s=[], compute_s=[], wait_s=0.0,
                            caches=[], warnings=[], model=[]) for _ in range(cfg.accelerators)]
    io_p99: list[list[float]] = [[] for _ in range(cfg.accelerators)]
    agg_wall = 0.0
    for e, n_epochs in passes:
        fields = _load_fields(cfg, wl, compute_s, n_epochs, "cold" if cold_each_epoch else
                              ("as-is" if cfg.cache == "auto" else cfg.cache), seed + e, steps)
        if world is not None:
            world.barrier("mlperf pass")   # every node's accelerators start each pass together
        results = run_accelerators(fields, cfg.accelerators, world_rank0, world_size, synthetic=cfg.synthetic)
        agg_wall += max(m["wall_s"] for m, _, _ in results)
        for i, (m, env, warns) in enumerate(results):
            p = per[i]
            p["samples"] += m["samples"]
            p["bytes_read"] += m["bytes_read"]
            p["wall_s"] += m["wall_s"]
            p["step_s"].extend(m["mlperf_steps"]["step_s"])
            p["compute_s"].extend(m["mlperf_steps"]["compute_s"])
            p["wait_s"] += m["wait_s_total"]
            if m.get("au_model") is not None:
                p["model"].append((m["au_model"], len(m["mlperf_steps"]["step_s"])))
            p["caches"].append((env.get("cache") or {}).get("declared") or env.get("cache"))
            p["warnings"].extend(warns)
            io_p99[i].append((m.get("batch_io_s") or {}).get("p99") or 0.0)
    per_rank = []
    for i, p in enumerate(per):
        # AU counts the nominal compute: a sleep that overran (host overloaded, the consumer late to
        # wake) is time the accelerator was idle, not busy -- as on a real device.
        a = step_au(p["step_s"], [compute_s] * len(p["step_s"]))
        measured = sum(p["compute_s"]) / len(p["compute_s"]) if p["compute_s"] else None
        if measured is not None and measured > 1.1 * compute_s:
            p["warnings"].append(f"accelerator {world_rank0 + i}: emulated compute took {measured * 1e3:.1f} ms per "
                                 f"step on average for {compute_s * 1e3:.1f} ms nominal (host overloaded); AU counts "
                                 "the nominal time")
        per_rank.append({
            "rank": world_rank0 + i, "au": a["au"], "au_ci95": a["au_ci95"],
            "au_model": (sum(v * n for v, n in p["model"]) / max(1, sum(n for _, n in p["model"]))
                         if p["model"] else None),
            "steps": a["steps"], "samples": p["samples"], "bytes_read": p["bytes_read"],
            "samples_per_s": p["samples"] / p["wall_s"] if p["wall_s"] > 0 else None,
            "bytes_per_s": p["bytes_read"] / p["wall_s"] if p["wall_s"] > 0 else None,
            "wait_s": p["wait_s"], "batch_io_p99_s": max(io_p99[i], default=0.0),
            "compute_measured_s_mean": measured,
            "cache": p["caches"][0] if p["caches"] else None})
    return _world_run(per_rank, agg_wall, [w for p in per for w in p["warnings"]])


def _world_run(per_rank: list[dict], wall: float, warnings: list[str]) -> dict:
    """A run of many accelerators: totals over ranks, throughput = totals / the longest wall,
    the worst rank's AU (MLPerf's pass rule is every accelerator, not the mean)."""
    samples = sum(r["samples"] for r in per_rank)
    nbytes = sum(r["bytes_read"] for r in per_rank)
    aus = [r["au"] for r in per_rank]
    worst = min(range(len(aus)), key=aus.__getitem__)
    return {"per_rank": per_rank, "au_min": min(aus), "au_mean": sum(aus) / len(aus), "worst_rank": worst,
            "samples": samples, "bytes_read": nbytes, "wall_s": wall,
            "samples_per_s": samples / wall if wall > 0 else None, "bytes_per_s": nbytes / wall if wall > 0 else None,
            "warnings": sorted(set(warnings))}


def _spread(values: list[float]) -> dict:
    import statistics

    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else None,
            "range_ratio": (max(values) - min(values)) / statistics.fmean(values) if statistics.fmean(values) else None}


def run_mlperf(cfg: MlperfConfig, world=None) -> dict:
    """Run ``cfg.runs`` MLPerf runs; the MLPerf-vocabulary result (see README: MLPerf Storage)."""
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
    under = manifest.total_bytes < 5 * client_memory * nodes
    cold = cfg.cache == "cold" or (cfg.cache == "auto" and under)
    rules = compliance(manifest.total_bytes, client_memory, nodes, cold, scale)
    epochs = cfg.epochs or wl.epochs
    world_size = nodes * cfg.accelerators
    # Fidelity: a run too short to estimate AU is lengthened to cfg.min_steps per accelerator.  With a
    # cold cache every epoch it gets more (cold) epochs -- repeating an epoch inside one pass would
    # read warm pages; only a share of one step per epoch falls back to warm repeats, and says so.
    min_steps = max(cfg.min_steps, MIN_MEASURED_STEPS + 1)   # + the excluded first step
    steps, notes = 0, []
    if cold:
        per_epoch = steps_per_accelerator(manifest.total_samples, world_size, wl.batch_size, 1)
        if per_epoch >= 2:
            epochs = max(epochs, math.ceil((min_steps - 1) / (per_epoch - 1)))
        else:
            steps = min_steps
            notes.append(f"each accelerator's share is one batch per epoch: lengthened to {min_steps} steps "
                         "with epochs repeating inside a pass (repeats may hit the page cache)")
    elif min_steps > steps_per_accelerator(manifest.total_samples, world_size, wl.batch_size, epochs):
        steps = min_steps
    multi = world if world is not None and world.size > 1 else None
    runs = [_one_run(cfg, wl, compute_s, epochs, cold, k, node * cfg.accelerators, world_size, steps, multi)
            for k in range(cfg.runs)]
    if world is not None and world.size > 1:
        gathered = world.allgather(runs)
        runs = [_merge_nodes([g[k] for g in gathered]) for k in range(cfg.runs)]
    worst_run = min(runs, key=lambda r: r["au_min"])   # the run reported in full: the worst one
    au_min = [r["au_min"] for r in runs]
    passed = all(a >= threshold for a in au_min)
    sample_bytes = manifest.total_bytes / max(1, manifest.total_samples)
    return {
        "workload": wl.name, "accelerator": cfg.accelerator, "accelerators_per_node": cfg.accelerators,
        "nodes": nodes, "accelerators": cfg.accelerators * nodes, "compute_s_per_step": compute_s,
        "batch_size": wl.batch_size, "read_threads": cfg.workers or wl.read_threads, "access": wl.access,
        "au_threshold": threshold, "passed": passed,
        "au_min": min(au_min), "au_per_accelerator": [r["au"] for r in worst_run["per_rank"]],
        "au_ci95_worst": worst_run["per_rank"][worst_run["worst_rank"]]["au_ci95"],
        "worst_accelerator": worst_run["per_rank"][worst_run["worst_rank"]]["rank"],
        "samples_per_s": _spread([r["samples_per_s"] or 0.0 for r in runs])["mean"],
        "throughput_bytes_per_s": _spread([r["bytes_per_s"] or 0.0 for r in runs])["mean"],
        "MB_per_s": _spread([r["bytes_per_s"] or 0.0 for r in runs])["mean"] / 1e6,
        "sample_bytes_mean": sample_bytes,
        "epochs": epochs, "runs": cfg.runs, "first_step_excluded": True,
        "steps_per_accelerator": worst_run["per_rank"][worst_run["worst_rank"]]["steps"],
        "lengthened_to_min_steps": bool(steps) or epochs > (cfg.epochs or wl.epochs),
        "spread": {"au_min": _spread(au_min), "samples_per_s": _spread([r["samples_per_s"] or 0.0 for r in runs]),
                   "bytes_per_s": _spread([r["bytes_per_s"] or 0.0 for r in runs])},
        "per_run": [{k: v for k, v in r.items() if k != "warnings"} for r in runs],
        "per_rank": worst_run["per_rank"],
        "rule_compliant": rules.compliant, "rule_notes": list(rules.notes),
        "dataset": {"url": cfg.dataset, "format": manifest.format, "files": len(manifest.shards),
                    "samples": manifest.total_samples, "bytes": manifest.total_bytes, "scale": scale,
                    "fsync_at_generation": (manifest.spec or {}).get("fsync")},
        "cache": {"mode": rules.cache, "client_memory_bytes": client_memory,
                  "required_dataset_bytes": rules.required_bytes},
        "synthetic": cfg.synthetic,
        "warnings": sorted({w for r in runs for w in r["warnings"]} | set(notes)),
    }


def _merge_nodes(node_runs: list[dict]) -> dict:
    """One run across nodes: ranks concatenated, throughput = totals / the longest wall."""
    return _world_run([r for n in node_runs for r in n["per_rank"]], max(n["wall_s"] for n in node_runs),
                      [w for n in node_runs for w in n["warnings"]])
