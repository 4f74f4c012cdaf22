"""`mpirun -n N iobench run --config cluster.yaml`: the suite across ranks, one launch model.

The single-process suite starts an embedded S3 server on 127.0.0.1 and works in a temporary
directory: neither is visible from another node.  Under MPI the suite therefore needs the
cluster config's ``work_dir`` on storage every rank shares (and uses its ``object`` tier only
when one is configured).  Each stage is the multi-rank form of its command — every rank does
its share, rank 0 writes the stage's results file with world metrics and ``per_rank``:

  generate    one token dataset, shard ranges split over ranks, manifest by rank 0 last
  probe       IOR-style file probe (n-n, n-1) and mdtest-style metadata probe
  load        the dataset read cold, rank-sharded
  checkpoint  a state with one checkpoint rank per process, committed when every process is
              durable; then restored on all processes, each reading only its files
  report      rank 0: plans, HTML and Markdown from the stage results
"""

from __future__ import annotations

from ..schema import STALL_RATIO
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from ..errors import ConfigError

WORLD_STAGES = ("generate", "probe", "load", "checkpoint", "report")


def run_world_suite(out_dir: Path, config: dict, stages: list[str] | None, keep_data: bool, world) -> Path | None:
    """Run the suite on every rank; rank 0 returns the path of run.json (None elsewhere)."""
    from ..dist.launch import start
    from ..results import Results
    from . import _relative

    work = (config or {}).get("work_dir")
    if not work:
        err = ConfigError("--config", "under mpirun, iobench run needs a cluster config whose work_dir is on "
                                      "storage every rank shares", "set work_dir: /shared/path in the --config file")
        err.collective = True       # every rank has the same config and raises the same line
        raise err
    wanted = [s for s in WORLD_STAGES if not stages or s in stages]
    start(world, "run", {"config": config, "stages": wanted, "out": str(out_dir)},
          check=lambda: _check_dir(work))
    token = world.bcast(secrets.token_hex(4) if world.rank == 0 else None, what="run work folder")
    base = Path(work) / f"iobench-run-{token}"
    if world.rank == 0:
        base.mkdir(parents=True)
        out_dir.mkdir(parents=True, exist_ok=True)
    world.barrier("run work folder made")
    local_tmp = Path(tempfile.mkdtemp(prefix="iobench-run-local-"))   # node-local: checkpoint local tier
    results = Results(command="run", config=config)
    rows: list[tuple[str, str, str]] = []
    files: list[Path] = []
    try:
        state: dict = {}
        for name in wanted:
            t0 = time.perf_counter_ns()
            metrics = _STAGES[name](world, base, local_tmp, out_dir, state, rows, files, config)
            if world.rank == 0:
                metrics = dict(metrics or {})
                metrics["stage_s"] = (time.perf_counter_ns() - t0) / 1e9
                results.metrics[name] = metrics
            world.barrier(f"run {name} done")
    finally:
        shutil.rmtree(local_tmp, ignore_errors=True)
        world.barrier("run cleanup")
        if world.rank == 0 and not keep_data:
            shutil.rmtree(base, ignore_errors=True)     # only the folder this run created
    if world.rank != 0:
        return None
    results.world = world.describe()
    results.environment["work_dir"] = str(base)
    results.environment["results_files"] = [_relative(p, out_dir) for p in files]   # see suite.run_suite
    results.metrics["summary"] = [{"stage": s, "what": w, "value": v} for s, w, v in rows]
    path = results.write(out_dir / "run.json")
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"iobench run — {world.size} ranks on {len(world.nodes)} node(s)")
    for col in ("stage", "what", "value"):
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    Console().print(table)
    return path


def _check_dir(work: str) -> None:
    if not os.path.isdir(work) or not os.access(work, os.W_OK):
        raise ConfigError("work_dir", f"{work} is not a writable directory on this rank",
                          "mount the shared path on every node, at the same place")


def _write(world, results, metrics, merge_fn, path: Path, files: list[Path], merge_only=()) -> dict | None:
    from ..dist.launch import collect

    if not collect(world, results, metrics, merge_fn, merge_only=merge_only):
        return None
    results.write(path)
    files.append(path)
    return results.metrics


def _generate(world, base, local_tmp, out_dir, state, rows, files, config) -> dict:
    from ..generate import GenSpec, gen_metrics, generate
    from ..results import Results
    from ..units import format_bytes, format_rate

    spec = GenSpec.from_mapping({"format": "raw", "modality": "tokens", "num_samples": 2048 * world.size,
                                 "seq_len": 256, "shard_size": "128 samples", "seed": 0})
    url = str(base / "datasets" / "raw-tokens")
    stats: dict = {}
    manifest = generate(spec, url, progress=False, stats=stats, world=world)
    state["dataset"] = url
    if world.rank != 0:
        return {}
    res = Results(command="gen", config={"gen": spec.resolved(), "out": url}, world=world.describe(),
                  metrics=gen_metrics(manifest, stats, world.hosts))
    path = res.write(out_dir / "gen.json")
    files.append(path)
    rate = manifest.total_bytes / max(stats["seconds"], 1e-9)
    rows.append(("generate", f"raw tokens, {len(manifest.shards)} shards from {world.size} ranks",
                 f"{format_bytes(manifest.total_bytes)} in {stats['seconds']:.2f} s ({format_rate(rate)})"))
    return {"bytes": manifest.total_bytes, "seconds": stats["seconds"], "bytes_per_s": rate}


def _probe(world, base, local_tmp, out_dir, state, rows, files, config) -> dict:
    from ..probe import world_probe as wp
    from ..results import Results

    area = wp.open_world_area(world, str(base / "probe"), 64 * 2**20 * world.size, False, None)
    try:
        body = {"file": wp.file_probe(world, area, 2**20, 16 * 2**20, ("n-n", "n-1")),
                "metadata": wp.metadata_probe(world, area, 200, 4096)}
    finally:
        wp.close_world_area(world, area)
    res = Results(command="probe", config={"probe": "file+metadata", "mode": "aggregate (MPI)"})
    m = _write(world, res, {"aggregate": body}, wp.merge_probe_ranks, out_dir / "probe.json", files)
    if m is None:
        return {}
    agg = m["aggregate"]
    for layout in ("n-n", "n-1"):
        w, r = agg["file"][layout]["write"], agg["file"][layout]["read"]
        rows.append(("probe", f"file {layout} (1 MiB, {world.size} ranks)",
                     f"write {w['bytes_per_s'] / 2**20:,.0f} MiB/s, read {r['bytes_per_s'] / 2**20:,.0f} MiB/s"))
    md = agg["metadata"]["shared"]
    rows.append(("probe", "metadata, shared dir", f"create {md['create']['ops_per_s']:,.0f}/s, "
                                                  f"stat {md['stat']['ops_per_s']:,.0f}/s"))
    return {"file": {k: {ph: agg["file"][k][ph]["bytes_per_s"] for ph in ("write", "read")} for k in ("n-n", "n-1")},
            "metadata_shared_create_per_s": md["create"]["ops_per_s"]}


def _load(world, base, local_tmp, out_dir, state, rows, files, config) -> dict:
    from ..config import to_dict
    from ..loader.core import LoadConfig, run_load
    from ..loader.ranks import merge_ranks
    from ..results import Results

    cfg = LoadConfig(dataset=state["dataset"], workers=2, prefetch=2, batch_size=32, compute="5ms", cache="cold",
                     shuffle_buffer=128)
    world.barrier("run load start")
    run = run_load(cfg, rank=world.rank, world=world.size)
    res = Results(command="load", config=to_dict(cfg), environment=run.environment)
    m = _write(world, res, dict(run.metrics), merge_ranks, out_dir / "load-cold.json", files, merge_only=("series",))
    if m is None:
        return {}
    rows.append(("load", f"raw tokens, cold, {world.size} ranks",
                 f"stall {m[STALL_RATIO]:.0%} (worst rank), {m['throughput']['samples_per_s'] or 0:,.0f} samples/s; "
                 f"{m['world']['straggler']['line']}"))
    return {STALL_RATIO: m[STALL_RATIO], "samples_per_s": m["throughput"]["samples_per_s"],
            "bytes_read": m["bytes_read"]}


def _checkpoint(world, base, local_tmp, out_dir, state, rows, files, config) -> dict:
    from ..checkpointing.runner import CkptConfig, merge_restore_ranks, open_tiers, run_restore, run_saves
    from ..checkpointing.world import merge_save_ranks
    from ..config import to_dict
    from ..results import Results
    from ..units import format_bytes, format_seconds

    durable_url = str(base / "ckpt")
    cfg = CkptConfig(params=2e6 * world.size, dp=world.size, zero_stage=3, count=3, mode="async",
                     local=str(local_tmp / "ckpt"), durable=durable_url, keep_local=1, keep_durable=2)
    local, durable = open_tiers(cfg.local, cfg.durable)
    m = run_saves(cfg, local, durable, progress=False, world=world)
    res = Results(command="ckpt", config=to_dict(cfg))
    w = _write(world, res, {"checkpoint": m}, lambda pr, hosts: {"checkpoint": {
        **m, **merge_save_ranks([p["checkpoint"] for p in pr], hosts)}}, out_dir / "ckpt.json", files)
    got, rm = run_restore(None, durable, verify=True, world=world)
    rres = Results(command="ckpt restore", config={"durable": durable_url, "verify": True})
    r = _write(world, rres, {"checkpoint": rm}, lambda pr, hosts: {"checkpoint": {
        **rm, **merge_restore_ranks([p["checkpoint"] for p in pr], hosts)}}, out_dir / "ckpt-restore.json", files)
    if w is None:
        return {}
    ck, rc = w["checkpoint"], r["checkpoint"]
    rows.append(("checkpoint", f"{format_bytes(ck['bytes_per_save'])} per save from {world.size} processes",
                 f"save p50 {format_seconds(ck['local_write_s']['p50'] or 0)} (max over ranks), commit p50 "
                 f"{format_seconds(ck['commit_latency_s']['p50'] or 0)}, {ck['saves']['committed']}/"
                 f"{ck['saves']['total']} committed"))
    rows.append(("checkpoint", "restore on every process (verified)",
                 f"step {got.step}: {format_bytes(rc['restore_bytes'])} in {format_seconds(rc['restore_s'])}"))
    return {"bytes_per_save": ck["bytes_per_save"], "saves_committed": ck["saves"]["committed"],
            "commit_latency_s_p50": ck["commit_latency_s"]["p50"], "restored_step": got.step,
            "restore_s": rc["restore_s"], "verified": rc["verified"]}


def _report(world, base, local_tmp, out_dir, state, rows, files, config) -> dict:
    if world.rank != 0:
        return {}
    from . import SuiteContext
    from .report import suite_stage

    ctx = SuiteContext(out_dir=out_dir, work_dir=base, quick=False, config=config or {})
    ctx.results_files = list(files)
    ctx.rows = rows
    out = suite_stage(ctx)
    files[:] = ctx.results_files
    return out


_STAGES = {"generate": _generate, "probe": _probe, "load": _load, "checkpoint": _checkpoint, "report": _report}
