"""The checkpoint benchmark: N saves at an emulated step interval, then the numbers a training
job pays (blocking pause, local write, commit latency, backlog, recovery exposure), and the
restore benchmark.  Shared by `iobench ckpt` and the `iobench run` checkpoint stage."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass

from iobench.config import check_choice
from iobench.errors import ConfigError, IntegrityError
from iobench.metrics import summarize_seconds
from iobench.storage import Backend, open_backend

from . import commit_point as cp
from .commit import MODES, POLICIES, Checkpointer, EngineConfig, check_durable
from .exposure import has_backlog, recovery_at
from .restore import Restored, restore
from .snapshot import LiveState, local_ranks
from .state import StateSpec, checkpoint_bytes, from_params, preset, preset_names


@dataclass(frozen=True)
class CkptConfig:
    preset: str | None = None
    params: float | None = None
    recipe: str | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    zero_stage: int | None = None
    ranks: int | None = None
    scale: float = 1.0
    count: int = 3
    interval_ms: float = 0.0
    mode: str = "async"
    policy: str = "block"
    queue_depth: int = 1
    local: str | None = None
    durable: str | None = None
    endpoint_url: str | None = None
    keep_local: int = 2
    keep_durable: int = 3
    keep_every: int = 0
    durable_bw: float | None = None
    local_bw: float | None = None
    fsync: bool = True
    seed: int = 0
    fail_at: tuple[float, ...] = ()

    def __post_init__(self):
        if (self.preset is None) == (self.params is None):
            raise ConfigError("--preset", "give exactly one of --preset NAME or --params N",
                              "presets: " + ", ".join(preset_names()))
        if self.params is not None and self.params < 1:
            raise ConfigError("--params", f"must be at least 1, got {self.params:g}", "give e.g. 8e9")
        if self.count < 1:
            raise ConfigError("--count", f"must be at least 1, got {self.count}", "give the number of saves")
        from iobench.bounds import bound_of

        for flag, value in (("--params", self.params), ("--count", self.count), ("--interval-ms", self.interval_ms),
                            *(("--fail-at", t) for t in self.fail_at)):
            if value is not None:   # the flags' bounds, also for --set ckpt.KEY=VALUE and the Python API
                bound_of("ckpt", flag).check(flag, value)
        check_choice("--mode", self.mode, MODES)
        check_choice("--policy", self.policy, POLICIES)
        if not self.local and not self.durable:
            raise ConfigError("--durable", "no tier to save to", "give --local DIR and/or --durable URL")
        if not (0 < self.scale <= 1):
            raise ConfigError("--scale", f"must be in (0, 1], got {self.scale:g}", "give e.g. 0.001")
        if any(t < 0 for t in self.fail_at):
            raise ConfigError("--fail-at", "failure times must be zero or more", "give seconds since the first save")

    def spec(self) -> StateSpec:
        kw = {k: getattr(self, k) for k in ("tp", "pp", "dp", "zero_stage") if getattr(self, k) is not None}
        if self.preset is not None:
            spec = preset(self.preset, recipe=self.recipe, scale=self.scale, **kw)
        else:
            spec = from_params(int(self.params), recipe=self.recipe or "bf16-mixed-adam", scale=self.scale,
                               **{"tp": 1, "pp": 1, "dp": 1, "zero_stage": 0, **kw})
        if self.ranks is not None and self.ranks != spec.ranks:
            raise ConfigError("--ranks", f"{self.ranks} does not match TP×PP×DP = {spec.tp}×{spec.pp}×{spec.dp} "
                              f"= {spec.ranks}", "set --tp/--pp/--dp so that their product is --ranks")
        return spec

    def engine(self) -> EngineConfig:
        return EngineConfig(mode=self.mode, policy=self.policy, queue_depth=self.queue_depth, fsync=self.fsync,
                            keep_local=self.keep_local, keep_durable=self.keep_durable, keep_every=self.keep_every,
                            durable_bw=self.durable_bw, local_bw=self.local_bw)


def check_fits_memory(spec: StateSpec, ranks: list[int]) -> None:
    """The live state this process holds, and its snapshot copy, within the host's memory -- refused
    (exit 2) before any allocation: ``--params 1e15`` died allocating 56 TiB."""
    from iobench.bounds import memory_cap
    from iobench.units import format_bytes

    from .state import rank_bytes

    sizes = rank_bytes(spec)
    need = 2 * sum(sizes[r] for r in ranks)   # the training state and the snapshot it is copied into
    have = memory_cap()
    if need > have:
        raise ConfigError("--params" if spec.name.startswith("params-") else "--preset",
                          f"the state and its snapshot need {format_bytes(need)} in this process, more than "
                          f"this host's {format_bytes(have)} of memory",
                          "shrink it with --scale (e.g. 0.001), or spread the ranks over processes (mpirun)")


def open_tiers(local: str | None, durable: str | None, endpoint_url: str | None = None,
               storage_options: dict | None = None, check: bool = True) -> tuple[Backend | None, Backend | None]:
    lb = open_backend(local, field_name="--local") if local else None
    if lb is not None and not lb.is_local:
        raise ConfigError("--local", f"{local} is not a local path", "give a directory on local NVMe or disk")
    db = None
    if durable:
        db = open_backend(durable, endpoint_url=endpoint_url, storage_options=storage_options, field_name="--durable")
        if check:
            check_durable(db)
    return lb, db


def _check_space(tier: Backend | None, need: int, keep: int) -> None:
    if tier is None or not tier.is_local:
        return
    path = tier.root
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    free = shutil.disk_usage(path).free
    if need * (keep + 1) > free:
        raise ConfigError("--scale", f"{(keep + 1)} checkpoints of {need / 1e9:.2f} GB do not fit in "
                          f"{free / 1e9:.2f} GB free at {tier.root}", "use a smaller --scale or another --local")


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def run_saves(cfg: CkptConfig, local: Backend | None, durable: Backend | None, world_rank: int = 0,
              world_size: int = 1, progress: bool = True, world=None) -> dict:
    """Run the saves; returns the metrics dict (``metrics.checkpoint`` in the results).

    With an MPI ``world`` of several processes, each saves the checkpoint ranks it holds and
    world rank 0 commits each step once every process has reported its files durable
    (checkpointing.world); ``local`` is then this process's own directory.
    """
    spec = cfg.spec()
    if world is not None:
        world_rank, world_size = world.rank, world.size
    multi = world is not None and world.size > 1
    if multi and durable is None:
        raise ConfigError("--durable", "a multi-process save commits on a shared durable tier",
                          "give --durable on a path or bucket every rank can reach")
    if multi and cfg.policy != "block":
        err = ConfigError("--policy", f"{cfg.policy} lets processes save different steps, which one commit "
                          "cannot join", "use --policy block under mpirun")
        err.collective = True   # the ranks agreed on the config: every one raises this same line
        raise err
    if spec.ranks < world_size:
        raise ConfigError("--ranks", f"{spec.ranks} checkpoint rank(s) for {world_size} processes",
                          f"give --dp (or --tp/--pp) so that TP×PP×DP is at least {world_size}")
    ranks = local_ranks(spec, world_rank, world_size)
    check_fits_memory(spec, ranks)
    live = LiveState(spec, ranks)
    per_save = live.nbytes
    _check_space(local, per_save, cfg.keep_local)
    _check_space(durable, per_save, cfg.keep_durable)
    live.fill(cfg.seed, 0)
    interval = cfg.interval_ms / 1e3
    rss = []
    commit = None
    if multi:
        from .world import WorldCommit

        commit = WorldCommit(world)
    ck = Checkpointer(spec, ranks, local, durable, cfg.engine(), commit=commit,
                      retain_durable=world_rank == 0)   # one process deletes old steps on the shared tier
    bar = None
    if progress:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("checkpoint saves", total=cfg.count)
    # a rerun into the same tiers continues after their newest step instead of clashing with it
    first = 1 + max([0] + [s for t in (local, durable) if t is not None for s in cp.list_steps(t)])
    if multi:   # every process must save the same step numbers
        first = max(world.allgather(first, what="checkpoint first step"))
        world.barrier("checkpoint start")
    try:
        t_next = time.perf_counter()
        for i in range(cfg.count):
            step = first + i
            # emulated compute between saves; the state changes every step
            delay = t_next - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            live.touch(step)
            ck.save(step, live)
            t_next = time.perf_counter() + interval
            rss.append(_rss())
            if bar is not None:
                bar.update(task, advance=1)
        ck.close()
    except KeyboardInterrupt:   # Ctrl-C or SIGTERM: nothing more starts, and nothing writes after the exit
        ck.abort()
        raise
    finally:
        if bar is not None:
            bar.stop()
    m = save_metrics(cfg, spec, ck, per_save, rss)
    if multi:
        m["world_ranks"] = ranks
        m["commits"] = commit.history     # rank 0: every rank's durable time and the commit time per step
        world.barrier("checkpoint saves done")
    return m


def save_metrics(cfg: CkptConfig, spec: StateSpec, ck: Checkpointer, per_save: int, rss: list[int]) -> dict:
    recs = ck.records
    t0 = recs[0].t_call
    done = [r for r in recs if r.status == "committed"]
    statuses = {s: sum(r.status == s for r in recs) for s in ("committed", "skipped", "coalesced", "failed")}
    lw = [r for r in done if r.local_write_s]
    up = [r for r in done if r.upload_s]
    timeline = [(r.step, r.t_call - t0, None if r.t_durable is None else r.t_durable - t0) for r in recs]
    fail_times = list(cfg.fail_at)
    if not fail_times and done:
        # by default: a failure just before each commit and just after the last one
        fail_times = [r.t_durable - t0 - 1e-6 for r in done] + [done[-1].t_durable - t0 + 1e-6]
    exposure = [vars(recovery_at(timeline, t)) for t in fail_times]
    m = {
        "state": {"name": spec.name, "params": spec.params, "recipe": spec.recipe, "bytes_per_param": spec.bytes_per_param,
                  "tp": spec.tp, "pp": spec.pp, "dp": spec.dp, "zero_stage": spec.zero_stage, "ranks": spec.ranks,
                  "scale": spec.scale, "checkpoint_bytes": checkpoint_bytes(spec), "local_ranks": len(ck.ranks),
                  "bytes_per_save": per_save},
        "saves": statuses,
        "blocking_s": summarize_seconds(r.blocking_s for r in recs if r.status != "skipped"),
        "snapshot_s": summarize_seconds(r.snapshot_s for r in recs if r.status != "skipped"),
        "local_write_s": summarize_seconds(r.local_write_s for r in lw),
        "local_write_bytes_per_s": (sum(r.local_bytes for r in lw) / sum(r.local_write_s for r in lw)) if lw else None,
        "upload_s": summarize_seconds(r.upload_s for r in up),
        "upload_bytes_per_s": (sum(r.local_bytes for r in up) / sum(r.upload_s for r in up)) if up else None,
        "commit_latency_s": summarize_seconds(r.commit_latency_s for r in done),
        "backlog_max": max(r.backlog for r in recs),
        "wait_s_total": sum(r.wait_s for r in recs),
        "staging_bytes": ck.staging.nbytes,
        "staging_kind": ck.staging.kind,
        "rss_bytes": {"after_first": rss[0] if rss else None, "after_last": rss[-1] if rss else None},
        "timeline": [r.to_dict(t0) for r in recs],
        "exposure": exposure,
    }
    if cfg.durable_bw and cfg.interval_ms > 0:
        m["backlog_predicted"] = has_backlog(per_save, cfg.durable_bw, cfg.interval_ms / 1e3)
    return m


def run_restore(local: Backend | None, durable: Backend | None, target_ranks: int | None = None,
                tp: int | None = None, pp: int | None = None, dp: int | None = None, verify: bool = True,
                read_fn=None, world=None) -> tuple[Restored, dict]:
    """Restore the newest committed checkpoint (resharded to ``target_ranks`` / TP, PP, DP if given).

    With an MPI ``world`` of several processes, each restores the target ranks it holds
    (every world_size-th one) and reads only the rank files that hold their boxes; the
    processes agree on one step (the newest that every one of them could verify).
    """
    tiers = [("local", local), ("durable", durable)]
    target = None
    probe = None
    for _, b in tiers:
        if b is not None:
            steps = cp.committed_steps(b)
            if steps:
                probe = cp.load_manifest(b, steps[-1]).spec
                break
    if probe is not None and (target_ranks is not None or tp or pp or dp):
        target = _target_layout(probe, target_ranks, tp, pp, dp)
    multi = world is not None and world.size > 1
    mine = None
    if multi:
        layout = target or probe
        mine = local_ranks(layout, world.rank, world.size) if layout is not None else []
        world.barrier("restore start")
    got = restore(tiers, target=target, verify=verify, read_fn=read_fn, ranks=mine)
    if multi:
        steps = world.allgather(got.step, what="restore step")
        if len(set(steps)) > 1:   # a file only some ranks read failed to verify: all take an older step
            got = restore(tiers, target=target, verify=verify, read_fn=read_fn, ranks=mine, max_step=min(steps))
            steps = world.allgather(got.step, what="restore step")
            if len(set(steps)) > 1:
                raise IntegrityError(f"ranks restored different steps {steps}: no step verifies on every rank")
    m = {"step": got.step, "tier": got.tier, "url": got.url, "restore_s": got.seconds, "restore_bytes": got.bytes_read,
         "restore_bytes_per_s": got.bytes_per_s, "verified": got.verified, "cache": "cold" if got.cold else "as-is",
         "resident_ratio": got.resident_ratio,
         "ranks": len(got.arrays), "resharded": target is not None, "skipped": got.skipped,
         "target_ranks": sorted(got.arrays), "files_read": got.files_read}
    return got, m


def merge_restore_ranks(per_rank: list[dict], hosts: list[str]) -> dict:
    """World restore: as long as the slowest process, bytes summed, throughput = total / that."""
    from iobench.dist.aggregate import MergeSpec, merge

    out = merge(per_rank, MergeSpec(duration="restore_s", sums=("restore_bytes", "ranks"),
                                    spreads=("restore_bytes_per_s", "restore_bytes"),
                                    rates={"restore_bytes_per_s": "restore_bytes"}), hosts)
    out["timing"] = "max across ranks (as MLPerf Storage reports checkpoint loads)"
    out["verified"] = all(m["verified"] for m in per_rank)
    return out


def _target_layout(spec: StateSpec, ranks: int | None, tp, pp, dp) -> StateSpec:
    tp, pp = tp or spec.tp, pp or spec.pp
    if ranks is not None and dp is None:
        if ranks % (tp * pp):
            raise ConfigError("--ranks", f"{ranks} is not a multiple of TP×PP = {tp * pp}", "give --tp/--pp too")
        dp = ranks // (tp * pp)
    dp = dp or spec.dp
    if ranks is not None and tp * pp * dp != ranks:
        raise ConfigError("--ranks", f"{ranks} does not match TP×PP×DP = {tp * pp * dp}", "fix --tp/--pp/--dp")
    return spec.with_parallelism(tp=tp, pp=pp, dp=dp)


def seed_exposure_scenario(root: str, time_scale: float = 0.1, fsync: bool = False) -> dict:
    """The domain models' async-commit timeline (G73) replayed on real saves with an emulated durable tier.

    Seed: 112 GB snapshots at t = 20 s and 40 s, committed at 7 or 20 GB/s, failure at 50 s.
    Scaled: time × ``time_scale``; bytes × time_scale/1000 (bandwidth /1000), so 11.2 MB at
    7 or 20 MB/s with snapshots at 2 s and 4 s for the default 0.1.  Both bandwidths run at once.
    """
    import threading

    size = int(112e9 * time_scale / 1000)
    spec = from_params(size // 14, recipe="bf16-mixed-adam")
    snaps, t_fail = (20 * time_scale, 40 * time_scale), 50 * time_scale
    out: dict = {}

    def one(gbps: float):
        bw = gbps * 1e9 / 1000
        live = LiveState(spec, local_ranks(spec))
        durable = open_backend(os.path.join(root, f"bw{gbps:g}"))
        ck = Checkpointer(spec, live.ranks, None, durable, EngineConfig(durable_bw=bw, fsync=fsync, keep_durable=2))
        t0 = time.perf_counter() - snaps[0]        # the first snapshot happens at (virtual) t = snaps[0]
        ck.save(1, live)
        time.sleep(max(0.0, t0 + snaps[1] - time.perf_counter()))
        ck.save(2, live)
        ck.close()
        timeline = [(r.step, r.t_call - t0, r.t_durable - t0) for r in ck.records]
        rec = recovery_at(timeline, t_fail)
        out[gbps] = {"bandwidth_bytes_per_s": bw, "commit_times_s": [t for _, _, t in timeline],
                     "commit_latency_s": [r.commit_latency_s for r in ck.records],
                     "recovered_step": rec.step, "redo_s": rec.redo_s,
                     "redo_s_unscaled": rec.redo_s / time_scale}

    threads = [threading.Thread(target=one, args=(g,)) for g in (7.0, 20.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"time_scale": time_scale, "bytes": checkpoint_bytes(spec), "snapshots_s": list(snaps), "t_fail_s": t_fail,
            "seed_redo_s": {"7": 30.0, "20": 10.0}, "runs": {f"{g:g}": v for g, v in sorted(out.items())}}
