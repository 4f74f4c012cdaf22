"""MLPerf Storage's checkpoint workloads (llama3-8b/70b/405b/1t): a write phase and a read
phase through ``iobench ckpt``'s presets, reported in MLPerf's words: GB/s (decimal), seconds
per checkpoint, the maximum over ranks.

Write: synchronous saves to one directory with fsync (MLPerf times a checkpoint until it is
on storage).  Read: restore of the newest committed checkpoint, checksums verified.  One
process writes every rank's shards here, so a checkpoint's time is already the last rank's
finish; with MPI ranks (``iobench ckpt`` under mpirun) the per-rank maximum applies.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import check_choice
from ..errors import ConfigError

MODELS = ("llama3-8b", "llama3-70b", "llama3-405b", "llama3-1t")


@dataclass(frozen=True)
class CkptWorkload:
    model: str
    out: str
    ranks: int = 0              # 0: the preset's TP x PP x DP
    scale: float = 1.0
    checkpoints: int = 1

    def __post_init__(self) -> None:
        check_choice("--model", self.model, MODELS)
        if self.checkpoints < 1 or self.ranks < 0:
            raise ConfigError("--checkpoints/--ranks", "checkpoints must be >= 1 and ranks >= 0", "fix the counts")
        if not 0 < self.scale <= 1:
            raise ConfigError("--scale", f"{self.scale} is outside (0, 1]", "give e.g. 0.001")


def run_ckpt_workload(w: CkptWorkload, json_path: str | None = None) -> dict:
    from ..checkpointing.runner import CkptConfig, open_tiers, run_restore, run_saves
    from ..config import to_dict
    from ..results import Results

    cfg = CkptConfig(preset=w.model, scale=w.scale, count=w.checkpoints, mode="sync", local=w.out,
                     keep_local=max(2, w.checkpoints), ranks=w.ranks or None, fsync=True)
    cfg.spec()
    local, _ = open_tiers(cfg.local, None, None)
    save = run_saves(cfg, local, None, progress=False)
    _, restore = run_restore(local, None)
    per_save = save["state"]["bytes_per_save"]
    write_s = save["blocking_s"]          # sync: snapshot + write + fsync, the pause training sees
    out = {
        "model": w.model, "ranks": save["state"]["ranks"], "scale": w.scale, "checkpoints": w.checkpoints,
        "checkpoint_bytes": per_save,
        "write": {"seconds_per_checkpoint_mean": write_s["mean"], "seconds_per_checkpoint_max": write_s["max"],
                  "GB_per_s": per_save / write_s["mean"] / 1e9 if write_s["mean"] else None, "fsync": True},
        "read": {"seconds": restore["restore_s"], "GB_per_s": (restore["restore_bytes_per_s"] or 0) / 1e9,
                 "bytes": restore["restore_bytes"], "verified": restore["verified"], "cache": restore["cache"]},
        "max_over_ranks": "one process writes every rank: a checkpoint's time is its last rank's finish",
    }
    out["headline"] = (f"{w.model}{' (scaled x' + format(w.scale, 'g') + ')' if w.scale != 1 else ''}: "
                       f"write {out['write']['GB_per_s']:.2f} GB/s ({write_s['mean']:.2f} s per checkpoint), "
                       f"read {out['read']['GB_per_s']:.2f} GB/s ({restore['restore_s']:.2f} s)")
    if json_path:
        Results(command="mlperf ckpt", config=to_dict(w), environment={"fsync": True, "read_cache": restore["cache"]},
                metrics={"mlperf": out, "checkpoint": save, "restore": restore}).write(json_path)
    return out


def print_ckpt(out: dict) -> None:
    from ..units import format_bytes

    print(out["headline"])
    print(f"  {out['ranks']} rank(s), {format_bytes(out['checkpoint_bytes'])} per checkpoint, "
          f"{out['checkpoints']} checkpoint(s); slowest write {out['write']['seconds_per_checkpoint_max']:.2f} s; "
          f"read verified: {out['read']['verified']} ({out['read']['cache']} cache)")
