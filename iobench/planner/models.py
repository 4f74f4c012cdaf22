"""The planner's models by name, for `iobench plan MODEL --set key=value [--from RESULTS.json]`.

A ``Model`` names its inputs (``Param``: kind, default, help, and where a results file
holds a measured value), and ``run(inputs)`` returns a flat dict of outputs in SI units
plus a one-line ``recommendation``.  ``plan(name, overrides, results)`` resolves inputs
in this order: defaults, then values measured in ``results``, then ``overrides``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import nearest
from ..errors import ConfigError
from ..schema import BATCH_IO_S, BATCH_SERVICE_S
from ..units import format_bytes, format_rate, parse_duration, parse_size
from ..units import parse_rate as _parse_rate
from ..units import format_duration as format_seconds

REQUIRED = object()


@dataclass(frozen=True)
class Param:
    name: str
    kind: str                        # size | rate | duration | durations | ratio | float | int | bool | str | points
    default: Any = REQUIRED
    help: str = ""
    sources: tuple[str, ...] = ()    # dotted paths in a results file that can supply the value
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Model:
    name: str
    summary: str
    params: tuple[Param, ...]
    run: Callable[[dict], dict] = field(repr=False)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise ConfigError(f"--set {name}", f"model {self.name!r} has no input {name!r}",
                          nearest(name, [p.name for p in self.params]))


# ---------------------------------------------------------------------------- parsing

_DAYS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(d|day|days)\s*$")


def parse_rate(value, field: str) -> float:
    """'7GB/s', '7GB' or a number value of bytes per second (``iobench.units.parse_rate``)."""
    return _parse_rate(value, field)


PLAN_MAX_S = 3650 * 86400.0   # a plan may span a long training run (days); ten years is a typo


def _parse_duration(value, field: str) -> float:
    if isinstance(value, str):
        m = _DAYS.match(value)
        if m:
            value = f"{float(m.group(1)) * 86400!r}s"
    return parse_duration(value, field, max_s=PLAN_MAX_S)


def _parse_ratio(value, field: str) -> float:
    if isinstance(value, str) and value.strip().endswith("%"):
        value = float(value.strip()[:-1]) / 100
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(field, f"expected a fraction, got {value!r}", "give e.g. 0.9 or 90%") from None
    if not 0 <= v <= 1:
        raise ConfigError(field, f"must be between 0 and 1, got {value!r}", "give e.g. 0.9 or 90%")
    return v


def convert(p: Param, value, field: str | None = None):
    field = field or f"--set {p.name}"
    if p.kind in ("size", "rate") and not isinstance(value, bool) and value in (0, "0"):
        return 0.0   # "not given" for optional sizes; required ones are checked where they divide
    if p.kind == "size":
        return float(parse_size(value, field))
    if p.kind == "rate":
        return parse_rate(value, field)
    if p.kind == "duration":
        return _parse_duration(value, field)
    if p.kind == "durations":
        items = value if isinstance(value, (list, tuple)) else str(value).split(",")
        return tuple(_parse_duration(v.strip() if isinstance(v, str) else v, field) for v in items if str(v).strip())
    if p.kind == "ratio":
        return _parse_ratio(value, field)
    if p.kind == "points":   # a probe's measured points, as its results file holds them
        if not (isinstance(value, (list, tuple)) and value and all(isinstance(x, dict) for x in value)):
            raise ConfigError(field, "expected the probe's measured points", "give --from a results file of "
                              "`iobench probe s3 URL --ops get --json`")
        return [dict(x) for x in value]
    if p.kind in ("float", "int"):
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ConfigError(field, f"expected a number, got {value!r}", "give a number") from None
        if not math.isfinite(v) or v < 0:
            raise ConfigError(field, f"must be a non-negative number, got {value!r}", "give a number ≥ 0")
        if p.kind == "int":
            if v != int(v):
                raise ConfigError(field, f"expected a whole number, got {value!r}", "give e.g. 8")
            return int(v)
        return v
    if p.kind == "bool":
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            return str(value).lower() in ("true", "yes", "1", "on")
        raise ConfigError(field, f"expected true or false, got {value!r}", "use true/false")
    if p.choices and str(value) not in p.choices:
        raise ConfigError(field, f"unknown value {value!r}", nearest(str(value), p.choices))
    return str(value)


def lookup(results: dict, path: str):
    """The value at a dotted path of a results file, or None."""
    node: Any = results
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


# ---------------------------------------------------------------------------- models

def _m_bandwidth(x):
    from .pipeline import required_bandwidth

    bw = required_bandwidth(x["accelerators"], x["utilization"], x["batch_bytes"], x["step_time"])
    per_node = bw / max(1, math.ceil(x["accelerators"] / x["accelerators_per_node"]))
    return {"required_bytes_per_s": bw, "per_node_bytes_per_s": per_node,
            "recommendation": f"storage must deliver {format_rate(bw)} in aggregate, {format_rate(per_node)} per node"}


def _m_stall(x):
    from .pipeline import data_stall

    s, p = data_stall(x["compute_time"], x["io_time"], False), data_stall(x["compute_time"], x["io_time"], True)
    return {"serial_step_s": s.step_s, "serial_stall_ratio": s.stall_ratio, "pipelined_step_s": p.step_s,
            "pipelined_stall_ratio": p.stall_ratio,
            "recommendation": (f"overlap I/O with compute: stall {s.stall_ratio:.1%} → {p.stall_ratio:.1%}"
                               + ("; I/O is still slower than compute, so add bandwidth or workers"
                                  if p.stall_ratio > 0 else ""))}


def _m_prefetch(x):
    from .pipeline import prefetch_depth

    p = prefetch_depth(x["p99_io_time"], x["compute_time"], x["batch_bytes"], x["consumers"], x["margin"])
    return {"depth_min": p.depth_min, "depth_recommended": p.depth_recommended,
            "host_bytes_per_consumer": p.host_bytes_per_consumer, "host_bytes_total": p.host_bytes_total,
            "recommendation": (f"prefetch depth {p.depth_recommended} (minimum {p.depth_min} from P99 "
                               f"{format_seconds(x['p99_io_time'])} / compute {format_seconds(x['compute_time'])})"
                               + (f", {format_bytes(p.host_bytes_total)} of host memory" if x["batch_bytes"] else ""))}


def _m_collision(x):
    from .sharding import shard_collision

    c = shard_collision(x["workers"], x["shards"])
    return {"p_collision": c.p_collision, "p_collision_exact": c.p_collision_exact,
            "recommendation": (f"{c.p_collision:.1%} chance two of {x['workers']} workers hit the same shard; "
                               "shuffle shard order per rank (a seeded permutation) instead of random picks")}


def _m_tail(x):
    from .tail import hedged

    h = hedged(x["p_slow"], x["fanout"], x["replicas"])
    return {"p_step_slow": h.p_step_slow_unhedged, "p_step_slow_hedged": h.p_step_slow,
            "p_request_slow_hedged": h.p_request_slow,
            "recommendation": (f"{h.p_step_slow_unhedged:.1%} of steps wait on a slow server; hedging to "
                               f"{x['replicas']} replicas cuts it to {h.p_step_slow:.2%}")}


def _m_cache(x):
    from .pipeline import local_cache_gain

    g = local_cache_gain(x["compute_time"], x["remote_io_time"], x["local_io_time"], x["accelerators"])
    return {"utilization_remote": g.utilization_remote, "utilization_local": g.utilization_local,
            "utilization_gain": g.gain, "equivalent_accelerators": g.equivalent_accelerators,
            "recommendation": (f"a local cache lifts utilization {g.utilization_remote:.1%} → {g.utilization_local:.1%}, "
                               f"worth {g.equivalent_accelerators:.0f} accelerators")}


def _m_checkpoint_size(x):
    from .checkpoint import checkpoint_size, zero_rank_bytes

    from iobench.checkpointing import state   # the one recipe table, for presets and params= alike

    out: dict = {}
    if x["recipe"] and x["recipe"] not in state.RECIPES:
        # a nearest-name guess could name a recipe of other bytes per parameter: list them all
        raise ConfigError("--set recipe", f"unknown recipe {x['recipe']!r}",
                          "known: " + ", ".join(f"{r} {state.bytes_per_param(r)} B/param" for r in state.RECIPES))
    if x["preset"]:
        spec = state.preset(x["preset"], recipe=x["recipe"] or None)
        total = state.checkpoint_bytes(spec)
        out.update({"params": spec.params, "bytes_per_param": spec.bytes_per_param, "checkpoint_bytes": total,
                    "max_rank_bytes": state.max_rank_bytes(spec), "ranks": spec.ranks})
    else:
        if not x["params"]:
            raise ConfigError("--set params", "is required without a preset", "give e.g. params=8e9 or preset=qwen3-8b")
        if x["recipe"]:
            bpp = state.bytes_per_param(x["recipe"])
        else:
            bpp = x["bytes_per_param"]
        total = checkpoint_size(x["params"], bpp)
        out.update({"params": x["params"], "bytes_per_param": bpp, "checkpoint_bytes": total})
        if x["ranks"] > 1:
            out["rank_bytes_zero3"] = zero_rank_bytes(x["params"], x["ranks"], 3)
            out["rank_bytes"] = total / x["ranks"]
    out["recommendation"] = f"each checkpoint is {format_bytes(out['checkpoint_bytes'])}"
    return out


def _m_storm(x):
    from .checkpoint import checkpoint_storm

    r = checkpoint_storm(x["state_bytes"], x["replicas"], x["fabric_bandwidth"], sharded=False)
    s = checkpoint_storm(x["state_bytes"], x["replicas"], x["fabric_bandwidth"], sharded=True)
    return {"replicated_total_bytes": r.total_bytes, "replicated_write_s": r.write_s,
            "sharded_total_bytes": s.total_bytes, "sharded_bytes_per_replica": s.bytes_per_replica,
            "sharded_write_s": s.write_s,
            "recommendation": (f"shard the checkpoint across replicas: {format_seconds(r.write_s)} → "
                               f"{format_seconds(s.write_s)}")}


def _m_staged(x):
    from .checkpoint import staged_checkpoint

    s = staged_checkpoint(x["checkpoint_bytes"], x["nodes"], x["local_bandwidth"], x["pfs_bandwidth"], x["interval"])
    direct = x["checkpoint_bytes"] / x["pfs_bandwidth"]
    return {"shard_bytes": s.shard_bytes, "local_write_s": s.local_write_s, "pfs_drain_s": s.pfs_drain_s,
            "pfs_direct_write_s": direct, "pfs_bytes_per_s_per_node": s.pfs_bytes_per_s_per_node,
            "pause_overhead_ratio": s.pause_overhead,
            "recommendation": (f"write to local NVMe ({format_seconds(s.local_write_s)} pause), drain to the PFS in "
                               f"the background ({format_seconds(s.pfs_drain_s)})"
                               + ("; the drain outlasts the interval, so lengthen it" if s.pfs_drain_s > x["interval"]
                                  else ""))}


def _m_async(x):
    from .checkpoint import async_backlog, commit_timeline

    b = async_backlog(x["checkpoint_bytes"], x["bandwidth"], x["interval"])
    snaps = x["snapshots"] or tuple(x["interval"] * (i + 1) for i in range(int(x["fail_at"] // x["interval"])))
    t = commit_timeline(x["checkpoint_bytes"], x["bandwidth"], snaps, x["copy_time"], x["fail_at"])
    out = {"write_s": b.write_s, "demand_bytes_per_s": b.demand_bytes_per_s, "backlog": b.backlog,
           "commit_utilization_ratio": b.utilization,
           "recoverable_snapshot_s": t.recoverable_snapshot_s, "redo_s": t.redo_s,
           "foreground_pause_s": t.foreground_pause_s, "snapshots_s": list(t.snapshots_s),
           "commits_s": list(t.commits_s)}
    rec = (f"a failure at {format_seconds(x['fail_at'])} recovers the snapshot from "
           f"{format_seconds(t.recoverable_snapshot_s or 0.0)} and redoes {format_seconds(t.redo_s)}")
    if b.backlog:
        rec += f"; commits fall behind (demand {format_rate(b.demand_bytes_per_s)} > {format_rate(x['bandwidth'])})"
    out["recommendation"] = rec
    return out


def _rate(x) -> float:
    from .checkpoint import failure_rate

    spike = 1.0 / x["spike_mtbf"] if x["spike_mtbf"] else 0.0
    if x["job_mtbf"]:
        return failure_rate(job_mtbf_s=x["job_mtbf"], spike_rate=spike)
    if x["accelerator_mtbf"]:
        return failure_rate(per_accelerator_mtbf_s=x["accelerator_mtbf"], accelerators=x["accelerators"],
                            spike_rate=spike)
    raise ConfigError("--set job_mtbf", "the failure rate needs job_mtbf or accelerator_mtbf",
                      "give e.g. job_mtbf=7.9h")


def _m_interval(x):
    from .checkpoint import checkpoint_overhead, optimal_interval, poisson_optimal_interval

    lam = _rate(x)
    c = x["cost"]
    tau = optimal_interval(c, lam)
    out = {"failure_rate_per_s": lam, "optimal_interval_s": tau, "optimal_interval_poisson_s":
           poisson_optimal_interval(c, lam), "overhead_at_optimum_ratio": checkpoint_overhead(c, lam, x["recovery_time"],
                                                                                              tau).total}
    table = sorted(set(x["intervals"]) | {round(tau / 2, 3), round(tau, 3), round(2 * tau, 3)})
    out["overhead_table"] = [{"interval_s": o.interval_s, "save_ratio": o.save, "redo_ratio": o.redo,
                              "recover_ratio": o.recover, "total_ratio": o.total}
                             for o in (checkpoint_overhead(c, lam, x["recovery_time"], t) for t in table)]
    out["recommendation"] = (f"checkpoint every {format_seconds(tau)} (τ* = √(2c/λ), c = {format_seconds(c)}); "
                             f"overhead {out['overhead_at_optimum_ratio']:.2%}")
    return out


def _m_straggler(x):
    from .straggler import straggler_step

    s = straggler_step(x["mean_step"], x["sigma"], x["ranks"], x["overhead"])
    return {"expected_max_sigmas": s.expected_max_sigmas, "step_s": s.step_s, "extra_s": s.extra_s,
            "recommendation": (f"with {x['ranks']} ranks the slowest is {s.expected_max_sigmas:.2f}σ late: "
                               f"expect {format_seconds(s.step_s)} per step (+{format_seconds(s.extra_s)})")}


def _m_retention(x):
    from .checkpoint import retention

    r = retention(x["run_time"], x["interval"], x["checkpoint_bytes"], x["keep_last"], x["archive_every"],
                  0.0, x["epoch_bytes"] or None)
    out = {"checkpoints": r.checkpoints, "total_written_bytes": r.total_written_bytes,
           "footprint_bytes": r.footprint_bytes, "archived": r.archived, "archive_bytes": r.archive_bytes}
    if r.written_to_data_ratio is not None:
        out["written_to_data_ratio"] = r.written_to_data_ratio
    out["recommendation"] = (f"keep-last-{x['keep_last']} holds {format_bytes(r.footprint_bytes)}; the run writes "
                             f"{format_bytes(r.total_written_bytes)} in {r.checkpoints} checkpoints")
    return out


def _m_staging(x):
    from .staging import staging_time

    s = staging_time(x["dataset_bytes"], x["nodes"], x["per_node_bandwidth"])
    return {"bytes_per_node": s.bytes_per_node, "stage_s": s.stage_s,
            "recommendation": f"pre-staging takes {format_seconds(s.stage_s)} ({format_bytes(s.bytes_per_node)} per node)"}


def _m_cold_start(x):
    from .staging import cold_start, fan_out_bytes

    c = cold_start(x["model_bytes"], x["bandwidth"], x["drives"])
    return {"load_s": c.load_s, "bytes_per_drive": c.bytes_per_drive,
            "fan_out_bytes": fan_out_bytes(x["replicas"], x["model_bytes"]),
            "recommendation": f"loading the model takes {format_seconds(c.load_s)}"}


def _m_economics(x):
    from .economics import stream_vs_stage

    s = stream_vs_stage(x["dataset_bytes"], x["epochs"], x["runs_per_year"], x["object_price"], x["nvme_price"],
                        x["egress_price"])
    better = "stage once per run onto local NVMe" if s.savings_usd_per_year > 0 else "stream from the object store"
    return {"stream_usd_per_year": s.stream_usd_per_year, "stage_usd_per_year": s.stage_usd_per_year,
            "savings_usd_per_year": s.savings_usd_per_year, "break_even_epochs": s.break_even_epochs,
            "recommendation": f"{better} (break-even at {s.break_even_epochs:.2f} epochs per run)"}


def _m_endurance(x):
    from .checkpoint import ssd_endurance

    e = ssd_endurance(x["capacity"], x["dwpd"], x["warranty_years"], x["checkpoint_bytes"], x["interval"])
    return {"daily_budget_bytes": e.daily_budget_bytes, "lifetime_bytes": e.lifetime_bytes,
            "checkpoint_bytes_per_day": e.checkpoint_bytes_per_day, "budget_used_ratio": e.fraction_of_budget,
            "recommendation": f"local checkpoints use {e.fraction_of_budget:.1%} of the drive's daily write budget"}


def _m_s3_reads(x):
    from .s3_reads import plan_s3_reads

    def size_flag(n: int) -> str:   # what --s3-block-size takes back exactly
        return next((f"{n // u}{name}" for u, name in ((2**20, "MiB"), (2**10, "KiB")) if n % u == 0), f"{n}B")

    r = plan_s3_reads(x["points"], int(x["shard_bytes"]), x["workers"], x["near"],
                      whole_shards=x["access"] == "block")
    return {"s3_block_bytes": r.block_size, "s3_concurrency": r.concurrency, "read_ahead": r.read_ahead,
            "expected_bytes_per_s": r.expected_bytes_per_s, "why": r.why,
            "recommendation": f"iobench load ... --access {x['access']} -W {x['workers']} "
                              f"--s3-block-size {size_flag(r.block_size)} "
                              f"--s3-concurrency {r.concurrency} --read-ahead {r.read_ahead}"}


def _m_scale(x):
    from .scale import Point, leave_one_out, parse_points, per_accelerator_demand, straggler_cap, sustained

    pts = parse_points(x["points"], "--set points")
    if not any(p.nodes == 1 for p in pts):
        pts.insert(0, Point(1, x["accelerators_per_node"], x["node_bandwidth"]))
    d = per_accelerator_demand(pts)
    node_cap = max(p.accelerators_per_node for p in pts)
    sample = x["sample_bytes"]
    ops_per_byte = x["opens_per_sample"] / sample if sample else 0.0
    cap = straggler_cap(x["p_slow"], x["slow_wait"], x["compute_time"], x["au_threshold"])
    nodes = [int(v) for v in str(x["nodes"]).split(",") if v.strip()]
    rows = [sustained(n, node_cap, d, x["aggregate_bandwidth"], x["metadata_rate"], ops_per_byte * d, cap)
            for n in nodes]
    loo = leave_one_out(pts, x["aggregate_bandwidth"], x["metadata_rate"], ops_per_byte, cap)
    worst = max((abs(r["error"]) for r in loo), default=None)
    out = {"per_accelerator_bytes_per_s": d, "node_cap_accelerators": node_cap,
           "straggler_world_cap": None if cap == math.inf else cap,
           "prediction_table": [{"nodes": r.nodes, "per_node": r.per_node, "total": r.total,
                                 "demand_bytes_per_s": r.demand_bytes_per_s, "limit": r.limit} for r in rows],
           "leave_one_out_table": loo,
           "leave_one_out_max_abs_error": worst}
    last = rows[-1]
    knee = next((r for r in rows if r.limit != "node"), None)
    out["recommendation"] = (
        f"{last.per_node} accelerators per node at {last.nodes} nodes ({last.total} in all, limit: {last.limit})"
        + (f"; shared storage starts to limit at {knee.nodes} nodes ({knee.limit})" if knee else
           f"; {node_cap} per node up to {nodes[-1]} nodes")
        + (f"; leave-one-out error up to {worst} per node over {len(loo)} points" if loo else
           "; one measured point: no leave-one-out check"))
    return out


# Where `iobench ckpt` and `iobench load` results hold the values a model needs.
_CKPT_BYTES = ("metrics.checkpoint.state.checkpoint_bytes", "metrics.checkpoint.checkpoint_bytes")
_CKPT_COST = ("metrics.checkpoint.blocking_s", "metrics.blocking_s")
_CKPT_BW = ("metrics.checkpoint.upload_bytes_per_s", "metrics.checkpoint.local_write_bytes_per_s")
_CKPT_LOCAL_BW = ("metrics.checkpoint.local_write_bytes_per_s",)
# a load's batch time at its worker: storage + preparation (what the loader's own advice uses), then
# the storage part alone for results that have no service time
_P99_IO = (f"metrics.{BATCH_SERVICE_S}.p99", f"metrics.{BATCH_IO_S}.p99")
_COMPUTE = ("metrics.compute_s.mean",)
_BATCH_BYTES = ("metrics.batch_bytes",)

MODELS: dict[str, Model] = {m.name: m for m in [
    Model("bandwidth", "required pipeline bandwidth N × η × batch bytes / step time (Eq. 4.1)", (
        Param("accelerators", "int", 8, "accelerators reading data"),
        Param("utilization", "ratio", 0.9, "target utilization η"),
        Param("batch_bytes", "size", REQUIRED, "bytes one accelerator reads per step", _BATCH_BYTES),
        Param("step_time", "duration", REQUIRED, "compute time of one step", _COMPUTE),
        Param("accelerators_per_node", "int", 8, "for the per-node figure")), _m_bandwidth),
    Model("stall", "data stall, serial vs pipelined (Eq. 4.2)", (
        Param("compute_time", "duration", REQUIRED, "compute per step", _COMPUTE),
        Param("io_time", "duration", REQUIRED, "I/O per step", (f"metrics.{BATCH_IO_S}.mean",))), _m_stall),
    Model("prefetch", "prefetch depth from P99 I/O time and its host-memory cost (Eq. 4.3)", (
        Param("p99_io_time", "duration", REQUIRED, "P99 time to fetch one batch", _P99_IO),
        Param("compute_time", "duration", REQUIRED, "compute per step (--compute-ms)", _COMPUTE),
        Param("batch_bytes", "size", 0.0, "bytes per batch in host memory", _BATCH_BYTES),
        Param("consumers", "int", 1, "accelerators per node sharing host memory"),
        Param("margin", "int", 2, "extra batches beyond the minimum")), _m_prefetch),
    Model("collision", "probability that workers collide on a shard (birthday bound)", (
        Param("workers", "int", REQUIRED, "concurrent readers"),
        Param("shards", "int", REQUIRED, "shards to pick from", ("metrics.shards", "config.shards"))), _m_collision),
    Model("tail", "tail-latency amplification over a fan-out, and hedged requests", (
        Param("p_slow", "ratio", 0.01, "probability one server is slow"),
        Param("fanout", "int", 100, "servers each step waits for"),
        Param("replicas", "int", 2, "copies each hedged request goes to")), _m_tail),
    Model("cache", "utilization gained by serving exposed I/O from a local cache", (
        Param("compute_time", "duration", REQUIRED, "compute per step", _COMPUTE),
        Param("remote_io_time", "duration", REQUIRED, "exposed I/O per step from remote storage"),
        Param("local_io_time", "duration", REQUIRED, "exposed I/O per step from the cache"),
        Param("accelerators", "int", 1, "accelerators in the job")), _m_cache),
    Model("checkpoint-size", "checkpoint size from a state spec (params × bytes/param, or a preset)", (
        Param("params", "float", 0.0, "parameter count"),
        Param("bytes_per_param", "float", 14.0, "bytes per parameter (BF16 weights + FP32 master + Adam = 14)"),
        Param("recipe", "str", "", "precision recipe (overrides bytes_per_param): bf16-mixed-adam 14, "
              "fp16-mixed-adam 14, fp16-adam 10, fp32-adam 12, bf16-weights 2 B/param"),
        Param("preset", "str", "", "model preset from iobench.checkpointing.state (e.g. qwen3-8b)"),
        Param("ranks", "int", 1, "ranks the state is sharded over")), _m_checkpoint_size),
    Model("storm", "checkpoint storm: every replica writes (replicated) vs 1/R each (sharded)", (
        Param("state_bytes", "size", REQUIRED, "training state of one replica", _CKPT_BYTES),
        Param("replicas", "int", REQUIRED, "data-parallel replicas"),
        Param("fabric_bandwidth", "rate", REQUIRED, "storage fabric bandwidth")), _m_storm),
    Model("staged-checkpoint", "staged checkpoint: local NVMe write, then background drain to the PFS", (
        Param("checkpoint_bytes", "size", REQUIRED, "whole checkpoint", _CKPT_BYTES),
        Param("nodes", "int", REQUIRED, "nodes writing shards"),
        Param("local_bandwidth", "rate", REQUIRED, "per-node local write bandwidth", _CKPT_LOCAL_BW),
        Param("pfs_bandwidth", "rate", REQUIRED, "aggregate PFS bandwidth"),
        Param("interval", "duration", "10min", "checkpoint interval")), _m_staged),
    Model("async-commit", "async commit backlog and the timeline of a failure at time t", (
        Param("checkpoint_bytes", "size", REQUIRED, "bytes per checkpoint", _CKPT_BYTES),
        Param("bandwidth", "rate", REQUIRED, "commit bandwidth to durable storage", _CKPT_BW),
        Param("interval", "duration", REQUIRED, "time between snapshots"),
        Param("copy_time", "duration", 0.0, "blocking snapshot copy", _CKPT_COST),
        Param("fail_at", "duration", REQUIRED, "failure time"),
        Param("snapshots", "durations", (), "explicit snapshot times (default: every interval)")), _m_async),
    Model("interval", "optimal checkpoint interval τ* = √(2c/λ), its overhead table, loss spikes", (
        Param("cost", "duration", REQUIRED, "blocking checkpoint cost c", _CKPT_COST),
        Param("job_mtbf", "duration", 0.0, "mean time between job failures"),
        Param("accelerator_mtbf", "duration", 0.0, "MTBF of one accelerator (with accelerators)"),
        Param("accelerators", "int", 1, "accelerators in the job"),
        Param("spike_mtbf", "duration", 0.0, "mean time between loss-spike rollbacks (0: none)"),
        Param("recovery_time", "duration", 120.0, "restart and restore time r"),
        Param("intervals", "durations", (), "extra intervals for the overhead table")), _m_interval),
    Model("straggler", "expected step time when a synchronous step waits for the slowest of N ranks", (
        Param("mean_step", "duration", REQUIRED, "mean compute per step"),
        Param("sigma", "duration", REQUIRED, "standard deviation of one rank's step"),
        Param("ranks", "int", REQUIRED, "ranks in the step"),
        Param("overhead", "duration", 0.0, "fixed per-step overhead")), _m_straggler),
    Model("retention", "checkpoint retention footprint and total bytes written", (
        Param("run_time", "duration", REQUIRED, "length of the run"),
        Param("interval", "duration", REQUIRED, "checkpoint interval"),
        Param("checkpoint_bytes", "size", REQUIRED, "bytes per checkpoint", _CKPT_BYTES),
        Param("keep_last", "int", 3, "checkpoints kept on the fast tier"),
        Param("archive_every", "int", 0, "archive every n-th checkpoint (0: none)"),
        Param("epoch_bytes", "size", 0.0, "bytes read per epoch, for the written/read ratio")), _m_retention),
    Model("staging", "time to pre-stage a dataset across nodes", (
        Param("dataset_bytes", "size", REQUIRED, "dataset size", ("metrics.total_bytes", "metrics.bytes")),
        Param("nodes", "int", 1, "nodes sharing it"),
        Param("per_node_bandwidth", "rate", REQUIRED, "staging rate per node",
              ("metrics.throughput.bytes_per_s",))), _m_staging),
    Model("cold-start", "model cold-start time from a tier, and replica fan-out bytes", (
        Param("model_bytes", "size", REQUIRED, "model weights"),
        Param("bandwidth", "rate", REQUIRED, "read bandwidth per drive or tier", ("metrics.throughput.bytes_per_s",)),
        Param("drives", "int", 1, "drives the weights are striped over"),
        Param("replicas", "int", 1, "replicas pulling the model")), _m_cold_start),
    Model("scale", "accelerators sustained at 8..4096 nodes: per-node demand vs shared bandwidth, metadata "
                   "rate and stragglers (iobench.planner.scale), leave-one-out on the measured points", (
        Param("accelerators_per_node", "int", REQUIRED, "measured on 1 node: accelerators sustained (find-max)",
              ("metrics.mlperf.max_accelerators_per_node",)),
        Param("node_bandwidth", "rate", REQUIRED, "measured on 1 node: bytes/s delivered to them",
              ("metrics.throughput.bytes_per_s",)),
        Param("points", "str", "", "more measured points NODES:ACCELERATORS_PER_NODE:RATE,... (e.g. 2:12:4GB/s)"),
        Param("aggregate_bandwidth", "rate", REQUIRED, "shared storage's aggregate read bandwidth (probe)"),
        Param("metadata_rate", "float", 0.0, "shared storage's aggregate opens/s (probe; 0: no limit)"),
        Param("sample_bytes", "size", 0.0, "mean bytes per sample", ("metrics.mlperf_run.sample_bytes_mean",)),
        Param("opens_per_sample", "float", 1.0, "file opens per sample (unet3d 1, resnet50 1/1251)"),
        Param("compute_time", "duration", 0.0, "compute per step", ("metrics.mlperf_run.compute_s_per_step",)),
        Param("au_threshold", "ratio", 0.9, "AU pass mark", ("metrics.mlperf_run.au_threshold",)),
        Param("p_slow", "ratio", 0.0, "synchronous steps: share of one rank's steps that wait"),
        Param("slow_wait", "duration", 0.0, "synchronous steps: mean wait of those steps"),
        Param("nodes", "str", "8,16,32,64,128,256,512,1024,2048,4096", "node counts to predict")), _m_scale),
    Model("s3-reads", "the loader's S3 GET size, GETs in flight and read-ahead from a probe's GET sweep "
                      "(iobench.planner.s3_reads)", (
        Param("points", "points", REQUIRED, "the probe's GET points (`iobench probe s3 URL --ops get --json`)",
              ("metrics.tiers.*.s3.points", "metrics.points")),
        Param("shard_bytes", "size", REQUIRED, "the dataset's largest shard"),
        Param("workers", "int", 1, "loader workers (-W) sharing the GETs in flight"),
        Param("access", "str", "block", "the loader's access pattern: block buffers whole shards, so the "
              "largest GET size near the best is taken; otherwise the smallest", choices=("block", "map", "stream")),
        Param("near", "ratio", 0.9, "a size or count within this share of the best counts as the best")), _m_s3_reads),
    Model("economics", "stream every epoch vs stage once: cost per year and break-even epochs", (
        Param("dataset_bytes", "size", REQUIRED, "dataset size"),
        Param("epochs", "float", REQUIRED, "epochs per run"),
        Param("runs_per_year", "float", 4.0, "training runs per year"),
        Param("object_price", "float", 0.023, "object storage, USD per GB-month"),
        Param("nvme_price", "float", 0.10, "local NVMe, USD per GB-month"),
        Param("egress_price", "float", 0.09, "egress, USD per GB")), _m_economics),
    Model("ssd-endurance", "share of an SSD's write endurance that local checkpoints use", (
        Param("capacity", "size", REQUIRED, "drive capacity"),
        Param("dwpd", "float", 1.0, "rated drive writes per day"),
        Param("warranty_years", "float", 5.0, "warranty period"),
        Param("checkpoint_bytes", "size", REQUIRED, "bytes one node writes per checkpoint"),
        Param("interval", "duration", REQUIRED, "checkpoint interval")), _m_endurance),
]}


def get_model(name: str) -> Model:
    if name not in MODELS:
        raise ConfigError("MODEL", f"unknown planner model {name!r}", nearest(name, MODELS))
    return MODELS[name]


def _lookup_any(results: dict, path: str):
    """(value, the path it was at): a ``*`` part matches any key (the first that holds the rest)."""
    if "*" not in path:
        return lookup(results, path), path
    head, _, rest = path.partition(".*.")
    node = lookup(results, head)
    for key in (node if isinstance(node, dict) else {}):
        v, at = _lookup_any(node[key], rest) if isinstance(node[key], dict) else (None, rest)
        if v is not None:
            return v, f"{head}.{key}.{at}"
    return None, path


def _measured(p: Param, results: dict):
    for pattern in p.sources:
        v, path = _lookup_any(results, pattern)
        if isinstance(v, dict) and "mean" in v:   # an HDR summary: the mean unless the path names a percentile
            v = v["mean"]
        if v is not None and (not isinstance(v, (dict, list)) or (p.kind == "points" and isinstance(v, list))):
            return v, path
    return None, None


def resolve(model: Model, overrides: dict | None = None, results: dict | list[dict] | None = None
            ) -> tuple[dict, dict]:
    """(inputs in SI, where each came from: 'default' | 'results:<path>' | 'set').

    ``results`` may be several results files (e.g. a run's stage files): the first that holds
    a value supplies it."""
    docs = results if isinstance(results, list) else ([results] if results else [])
    overrides = dict(overrides or {})
    known = {p.name for p in model.params}
    for k in overrides:
        if k not in known:
            raise ConfigError(f"--set {k}", f"model {model.name!r} has no input {k!r}", nearest(k, known))
    inputs, origin = {}, {}
    for p in model.params:
        if p.name in overrides:
            inputs[p.name], origin[p.name] = convert(p, overrides[p.name]), "set"
            continue
        found = next(((v, path) for v, path in (_measured(p, d) for d in docs) if v is not None), None)
        if found:
            v, path = found
            inputs[p.name], origin[p.name] = convert(p, v, f"--from {path}"), f"results:{path}"
            continue
        if p.default is REQUIRED:
            raise ConfigError(f"--set {p.name}", f"model {model.name!r} needs {p.name} ({p.help})",
                              f"give --set {p.name}=VALUE" + (" or --from a results file that has it" if p.sources else ""))
        inputs[p.name], origin[p.name] = convert(p, p.default), "default"
    return inputs, origin


def plan(name: str, overrides: dict | None = None, results: dict | list[dict] | None = None) -> dict:
    """Run one model: {model, summary, inputs, inputs_from, outputs, recommendation}."""
    model = get_model(name)
    inputs, origin = resolve(model, overrides, results)
    try:
        outputs = model.run(inputs)
    except ZeroDivisionError:
        raise ConfigError(f"plan {name}", "an input that divides is zero", "give positive sizes, rates and times") from None
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"plan {name}", str(e), "check the inputs") from e
    rec = outputs.pop("recommendation", "")
    return {"model": name, "summary": model.summary, "inputs": {k: list(v) if isinstance(v, tuple) else v
                                                                for k, v in inputs.items()},
            "inputs_from": origin, "outputs": outputs, "recommendation": rec}
