"""MLPerf Storage's checkpoint workloads (llama3-8b/70b/405b/1t), as mlcommons/storage defines them.

Rules (each cited in the result's compliance block):

- the model's TP x PP x DP ranks and ZeRO stage (Submission_guidelines.md §2.2.1 Table 2; iobench's
  ``checkpointing.state`` presets); ``default`` mode: every rank, ``subset`` mode: 8 processes on one
  host writing their own share, ``8 / (TP x PP x DP)`` of the checkpoint (§2.2.2; mlpstorage/config.py
  ``LLM_SUBSET_PROCS = 8``);
- 10 checkpoints written, then the cache cleared, then 10 read, as separate runs (§2.2.2 "Checkpoint
  write and (read) recovery"; configs/dlio/workload/llama3_*.yaml ``num_checkpoints_write: 10``,
  ``num_checkpoints_read: 10``), 5 s apart (``time_between_checkpoints: 5``), writes fsynced
  (``fsync: True``, §2.2.2 "fsync");
- per checkpoint, duration = the maximum over ranks and throughput = the minimum over ranks
  (§2.2.3); the result is the mean of 5 runs (§2.2.3 "executed five times ... the average").

Each rank is its own process (started together behind a barrier) writing and reading its own
shard file per checkpoint, so the per-rank times are real, concurrent ones.  GB is 10^9 B.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from dataclasses import dataclass

from ..config import check_choice
from ..errors import ConfigError, IobenchError
from . import rules as R

MODELS = ("llama3-8b", "llama3-70b", "llama3-405b", "llama3-1t")
MODES = ("subset", "default")
SUBSET_PROCESSES = 8          # mlcommons/storage mlpstorage/config.py LLM_SUBSET_PROCS
CHECKPOINTS = 10              # configs/dlio/workload/llama3_*.yaml num_checkpoints_write / _read
INTERVAL_S = 5.0              # configs/dlio/workload/llama3_*.yaml time_between_checkpoints
_CFG = "mlcommons/storage configs/dlio/workload/llama3_*.yaml"


@dataclass(frozen=True)
class CkptWorkload:
    model: str
    out: str
    mode: str = "subset"
    processes: int = 0            # 0: 8 (subset) or TP x PP x DP (default)
    scale: float = 1.0
    checkpoints: int = CHECKPOINTS
    interval_s: float = INTERVAL_S
    runs: int = R.DEFAULT_RUNS

    def __post_init__(self) -> None:
        check_choice("--model", self.model, MODELS)
        check_choice("--mode", self.mode, MODES)
        if self.checkpoints < 1 or self.processes < 0 or self.runs < 1:
            raise ConfigError("--checkpoints/--processes/--runs", "checkpoints and runs must be >= 1, processes >= 0",
                              "fix the counts")
        if self.interval_s < 0:
            raise ConfigError("--interval-s", f"must be zero or more, got {self.interval_s}", "give e.g. 5")
        if not 0 < self.scale <= 1:
            raise ConfigError("--scale", f"{self.scale} is outside (0, 1]", "give e.g. 0.001")

    def spec(self):
        from ..checkpointing.state import preset

        return preset(self.model, scale=self.scale)

    def ranks(self) -> int:
        s = self.spec()
        full = s.tp * s.pp * s.dp
        n = self.processes or (SUBSET_PROCESSES if self.mode == "subset" else full)
        if n > full:
            raise ConfigError("--processes", f"{n} processes for {self.model}'s {full} ranks", f"give at most {full}")
        return n


def _path(out: str, k: int, rank: int) -> str:
    return os.path.join(out, f"checkpoint-{k:02d}", f"rank-{rank:05d}.bin")


def _rank_proc(op: str, out: str, rank: int, nbytes: int, checkpoints: int, interval_s: float, barrier, q) -> None:
    """One rank: ``checkpoints`` writes (fsync) or reads of its shard, each behind a barrier with the others."""
    import numpy as np

    try:
        chunk = np.random.default_rng(rank).integers(0, 256, size=min(max(nbytes, 1), 16 << 20),
                                                     dtype=np.uint8).tobytes()
        times = []
        for k in range(checkpoints):
            barrier.wait(timeout=600)
            path = _path(out, k, rank)
            t0 = time.perf_counter_ns()
            if op == "write":
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    left = nbytes
                    while left > 0:
                        left -= os.write(fd, chunk[:min(left, len(chunk))])
                    os.fsync(fd)
                finally:
                    os.close(fd)
                dfd = os.open(os.path.dirname(path), os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
                got = nbytes
            else:
                got = 0
                with open(path, "rb", buffering=0) as f:
                    while True:
                        b = f.read(16 << 20)
                        if not b:
                            break
                        got += len(b)
                if got != nbytes:
                    raise IobenchError(f"rank {rank} read {got} B of checkpoint {k}, wrote {nbytes}")
            times.append((time.perf_counter_ns() - t0) / 1e9)
            if k + 1 < checkpoints and interval_s > 0:
                time.sleep(interval_s)   # time_between_checkpoints (the others wait at the next barrier)
        q.put(("ok", rank, times))
    except BaseException as e:  # noqa: BLE001 — reported to the coordinator
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
        q.put(("error", rank, f"{type(e).__name__}: {e}"))


def _phase(op: str, w: CkptWorkload, per_rank: list[int]) -> list[list[float]]:
    """Every rank's per-checkpoint seconds for one phase: [rank][checkpoint]."""
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()
    barrier = ctx.Barrier(len(per_rank))
    procs = [ctx.Process(target=_rank_proc, args=(op, w.out, r, per_rank[r], w.checkpoints, w.interval_s, barrier, q),
                         name=f"iobench-ckpt-{op}-{r}") for r in range(len(per_rank))]
    for p in procs:
        p.start()
    got: dict[int, list[float]] = {}
    error = None
    try:
        while len(got) < len(procs) and error is None:
            try:
                kind, rank, val = q.get(timeout=1.0)
            except Exception:  # noqa: BLE001 — queue.Empty
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    error = f"{dead[0].name} died (exit code {dead[0].exitcode})"
                continue
            if kind == "error":
                error = f"rank {rank}: {val}"
            else:
                got[rank] = val
    finally:
        for p in procs:
            p.join(timeout=5 if error else 3600)
            if p.is_alive():
                p.terminate()
                p.join(5)
    if error:
        raise IobenchError(f"mlperf ckpt {op}: {error}")
    return [got[r] for r in range(len(per_rank))]


def _summarize(times: list[list[float]], per_rank: list[int]) -> dict:
    """Per checkpoint: duration = max over ranks, throughput = min over ranks (§2.2.3); then the mean."""
    n = len(times[0])
    dur = [max(t[k] for t in times) for k in range(n)]
    thr = [min(per_rank[r] / times[r][k] for r in range(len(times)) if times[r][k] > 0) for k in range(n)]
    total = sum(per_rank)
    return {"duration_s_per_checkpoint": dur, "throughput_min_rank_GB_per_s_per_checkpoint": [x / 1e9 for x in thr],
            "duration_s_mean": statistics.fmean(dur),
            "throughput_min_rank_GB_per_s_mean": statistics.fmean(thr) / 1e9,
            "aggregate_GB_per_s_mean": statistics.fmean(total / d for d in dur if d > 0) / 1e9}


def _drop_cache(w: CkptWorkload, ranks: int) -> float | None:
    """Clear the page cache of what was written (§2.2.2 "clear the cache"), and say how much stayed."""
    from ..io.pagecache import drop_pages, file_residency

    res = []
    for k in range(w.checkpoints):
        for r in range(ranks):
            p = _path(w.out, k, r)
            drop_pages(p)
            v = file_residency(p)
            if v is not None:
                res.append(v)
    return max(res) if res else None


def run_ckpt_workload(w: CkptWorkload, json_path: str | None = None, say=lambda s: None) -> dict:
    from ..checkpointing.state import checkpoint_bytes, mlperf_reference_bytes, rank_bytes
    from ..config import to_dict
    from ..results import Results

    spec = w.spec()
    n = w.ranks()
    sizes = rank_bytes(spec)[:n]
    full = spec.tp * spec.pp * spec.dp
    if os.path.exists(w.out) and os.listdir(w.out):
        raise ConfigError("--out", f"{w.out} is not empty", "give a new or empty directory (it is removed after)")
    made = not os.path.exists(w.out)
    os.makedirs(w.out, exist_ok=True)
    free = os.statvfs(w.out)
    need = sum(sizes) * w.checkpoints
    if free.f_bavail * free.f_frsize < need:
        raise ConfigError("--out", f"{need / 1e9:.1f} GB needed for {w.checkpoints} checkpoints, "
                                   f"{free.f_bavail * free.f_frsize / 1e9:.1f} GB free", "free space or give --scale")
    runs: list[dict] = []
    resident: list[float] = []
    try:
        for k in range(w.runs):
            wr = _phase("write", w, sizes)
            left = _drop_cache(w, n)
            resident.append(left or 0.0)
            rd = _phase("read", w, sizes)
            runs.append({"write": _summarize(wr, sizes), "read": _summarize(rd, sizes), "resident_after_clear": left})
            say(f"  run {k + 1}/{w.runs}: write {runs[-1]['write']['duration_s_mean']:.2f} s, "
                f"read {runs[-1]['read']['duration_s_mean']:.2f} s per checkpoint")
            for c in range(w.checkpoints):
                for r in range(n):
                    os.unlink(_path(w.out, c, r))
    finally:
        import shutil

        for c in range(w.checkpoints):
            shutil.rmtree(os.path.join(w.out, f"checkpoint-{c:02d}"), ignore_errors=True)
        if made:
            shutil.rmtree(w.out, ignore_errors=True)

    def mean(phase: str, key: str) -> float:
        return statistics.fmean(r[phase][key] for r in runs)

    out = {
        "model": w.model, "mode": w.mode, "processes": n, "ranks_in_model": full, "scale": w.scale,
        "tp_pp_dp": [spec.tp, spec.pp, spec.dp], "zero_stage": spec.zero_stage,
        "checkpoint_bytes_full": checkpoint_bytes(spec), "bytes_written_per_checkpoint": sum(sizes),
        "fraction_of_checkpoint": sum(sizes) / checkpoint_bytes(spec),
        "mlperf_table_bytes": mlperf_reference_bytes(w.model),
        "checkpoints": w.checkpoints, "interval_s": w.interval_s, "runs": w.runs,
        "write": {"duration_s": mean("write", "duration_s_mean"),
                  "throughput_min_rank_GB_per_s": mean("write", "throughput_min_rank_GB_per_s_mean"),
                  "aggregate_GB_per_s": mean("write", "aggregate_GB_per_s_mean"), "fsync": True},
        "read": {"duration_s": mean("read", "duration_s_mean"),
                 "throughput_min_rank_GB_per_s": mean("read", "throughput_min_rank_GB_per_s_mean"),
                 "aggregate_GB_per_s": mean("read", "aggregate_GB_per_s_mean"),
                 "resident_after_clear_max": max(resident)},
        "per_run": runs,
        "timing": "per checkpoint: duration = max over ranks, throughput = min over ranks; the mean over "
                  "checkpoints, then over runs",
    }
    comp = compliance_for(w, out)
    out["compliance"] = comp.as_dict()
    out["rule_compliant"] = comp.compliant
    out["rule_verdict"] = comp.verdict
    out["headline"] = (f"{w.model} ({w.mode}, {n} process(es)): write {out['write']['duration_s']:.2f} s per "
                       f"checkpoint, {out['write']['throughput_min_rank_GB_per_s']:.2f} GB/s per rank (slowest); "
                       f"read {out['read']['duration_s']:.2f} s, {out['read']['throughput_min_rank_GB_per_s']:.2f} "
                       f"GB/s per rank (slowest); {comp.verdict}")
    if json_path:
        Results(command="mlperf ckpt", config=to_dict(w), environment={"fsync": True, "compliance": out["compliance"]},
                metrics={"mlperf": out}).write(json_path)
    return out


def compliance_for(w: CkptWorkload, out: dict) -> R.Compliance:
    G, rule = R.GUIDE, R.rule
    full = out["ranks_in_model"]
    n = out["processes"]
    resident = out["read"]["resident_after_clear_max"]
    return R.Compliance((
        rule("processes", f"{SUBSET_PROCESSES} (subset) or {full} = TP x PP x DP (default)",
             f"{n} ({w.mode})", n == (SUBSET_PROCESSES if w.mode == "subset" else full),
             f"{G} §2.2.1, §2.2.2; mlpstorage/config.py LLM_SUBSET_PROCS, LLM_ALLOWED_VALUES"),
        rule("checkpoint size", "the model's full state (unscaled)", f"x{w.scale:g}", w.scale == 1.0,
             f"{G} §2.2.1 Table 2"),
        rule("checkpoints", f"{CHECKPOINTS} written, then {CHECKPOINTS} read, separate runs",
             f"{w.checkpoints} + {w.checkpoints}", w.checkpoints == CHECKPOINTS,
             f"{_CFG} num_checkpoints_write/num_checkpoints_read; {G} §2.2.5 Table 3"),
        rule("interval", f"{INTERVAL_S:g} s between checkpoints", f"{w.interval_s:g} s", w.interval_s == INTERVAL_S,
             f"{_CFG} time_between_checkpoints"),
        rule("fsync", "every write fsynced", "file and directory fsync", True, f"{_CFG} fsync: True; {G} §2.2.2"),
        rule("cache cleared", "between the write and the read runs",
             "page cache dropped" + (f" ({resident:.0%} still resident)" if resident else ""),
             resident is None or resident < 0.01, f"{G} §2.2.2"),
        rule("metrics", "duration = max over ranks, throughput = min over ranks", "as required", True,
             f"{G} §2.2.3"),
        rule("runs", f"{R.DEFAULT_RUNS}, the result their mean", str(w.runs), w.runs == R.DEFAULT_RUNS,
             f"{G} §2.2.3"),
    ))


def print_ckpt(out: dict) -> None:
    from .report import print_compliance

    print(out["headline"])
    print(f"  {out['bytes_written_per_checkpoint'] / 1e9:.3f} GB per checkpoint from {out['processes']} process(es) "
          f"({out['fraction_of_checkpoint']:.1%} of the {out['checkpoint_bytes_full'] / 1e9:.1f} GB state, "
          f"TP x PP x DP = {' x '.join(map(str, out['tp_pp_dp']))}); {out['checkpoints']} writes + "
          f"{out['checkpoints']} reads, {out['interval_s']:g} s apart, {out['runs']} run(s)")
    print(f"  aggregate: write {out['write']['aggregate_GB_per_s']:.2f} GB/s, read {out['read']['aggregate_GB_per_s']:.2f}"
          " GB/s (bytes / slowest rank's time)")
    print_compliance(out["compliance"])
