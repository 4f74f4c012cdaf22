"""One checkpoint saved by many MPI processes: the commit waits for every one of them.

Each process (world rank) writes the rank files of the checkpoint ranks it holds, makes them
durable, and reports them — paths, sizes, checksums and the wall-clock time they became
durable — to world rank 0.  Rank 0 checks that the reports cover every checkpoint rank,
then publishes the one manifest: the commit point.  A process that dies before reporting
(SIGKILL, OOM) never reaches the gather, so no manifest names a step it had not finished;
the launcher ends the job, and restore returns the previous committed step.  Rank 0 tells
every process the outcome, so each one's commit latency ends at the real commit.

The gathers run on a private communicator (``World.channel``): they happen in the
checkpointer's background thread, and MPI matches collectives per communicator in call
order, so they must never interleave with the main thread's.
"""

from __future__ import annotations

import time
from typing import Any

from iobench.errors import IntegrityError

from . import commit_point as cp
from .hooks import crashpoint


class WorldCommit:
    """``commit(tier, manifest, fsync=)`` for ``Checkpointer``: gather, check, publish on rank 0, tell all."""

    def __init__(self, world: Any):
        self.world = world
        self.comm = world.channel()     # collective: every rank builds its WorldCommit at the same point
        self.history: list[dict] = []   # rank 0: per step, every rank's report and the commit time

    def __call__(self, tier, manifest: cp.CheckpointManifest, fsync: bool = True) -> dict:
        w = self.world
        crashpoint("before_rank_report")
        report = {"rank": w.rank, "host": w.hostname, "durable_at": time.time(), "step": manifest.step,
                  "files": [f.to_dict() for f in manifest.files], "bytes": manifest.total_bytes}
        reports = w.gather(report, what=f"checkpoint step {manifest.step} commit", comm=self.comm)
        outcome: dict
        if w.rank == 0:
            try:
                outcome = self._publish(tier, manifest, reports, fsync)
            except Exception as e:   # every rank must hear of it, or they would wait for a commit
                outcome = {"error": f"{type(e).__name__}: {e}"}
        else:
            outcome = {}
        outcome = w.bcast(outcome, what=f"checkpoint step {manifest.step} outcome", comm=self.comm)
        if "error" in outcome:
            raise IntegrityError(f"step {manifest.step} not committed: {outcome['error']}")
        return outcome

    def _publish(self, tier, manifest: cp.CheckpointManifest, reports: list[dict], fsync: bool) -> dict:
        steps = {r["step"] for r in reports}
        if steps != {manifest.step}:
            raise IntegrityError(f"processes reported different steps {sorted(steps)}")
        files = sorted((cp.RankFile.from_dict(f) for r in reports for f in r["files"]), key=lambda f: f.rank)
        have = [f.rank for f in files]
        if sorted(set(have)) != list(range(manifest.spec.ranks)) or len(have) != len(set(have)):
            raise IntegrityError(f"the ranks reported checkpoint ranks {have}, expected 0..{manifest.spec.ranks - 1} "
                                 "once each")
        durable_at = [r["durable_at"] for r in reports]
        full = cp.CheckpointManifest(step=manifest.step, spec=manifest.spec, files=tuple(files),
                                     extra={**manifest.extra, "world": {
                                         "size": len(reports), "hosts": [r["host"] for r in reports],
                                         "durable_at_by_rank": durable_at}})
        info = dict(cp.publish(tier, full, fsync=fsync))
        info["committed_at"] = time.time()
        info["durable_at_by_rank"] = durable_at
        info["bytes_by_rank"] = [r["bytes"] for r in reports]
        self.history.append({"step": manifest.step, **info})
        return info


def merge_save_ranks(per_rank: list[dict], hosts: list[str]) -> dict:
    """World checkpoint numbers as MLPerf Storage reports them: each save takes as long as its
    slowest rank (max across ranks), bytes add up, throughput = bytes / that max; plus the
    per-rank spread and the straggler."""
    from iobench.dist.aggregate import spread, straggler
    from iobench.metrics import summarize_seconds

    steps: dict[int, list[dict]] = {}
    for m in per_rank:
        for row in m["timeline"]:
            steps.setdefault(row["step"], []).append(row)
    per_step = []
    for step, rows in sorted(steps.items()):
        def worst(key):
            vals = [r[key] for r in rows if r.get(key) is not None]
            return max(vals) if len(vals) == len(rows) else None
        committed = all(r["status"] == "committed" for r in rows)
        nbytes = sum(r["local_bytes"] for r in rows)
        lw = worst("local_write_s")
        per_step.append({"step": step, "status": "committed" if committed else "not committed", "bytes": nbytes,
                         "blocking_s": worst("blocking_s"), "local_write_s": lw, "upload_s": worst("upload_s"),
                         "commit_latency_s": worst("commit_latency_s"),
                         "write_bytes_per_s": nbytes / lw if lw else None,
                         "local_write_s_by_rank": [r.get("local_write_s") for r in rows]})
    done = [p for p in per_step if p["status"] == "committed"]
    lw = [p for p in done if p["local_write_s"]]
    rank0 = per_rank[0]
    commits = rank0.get("commits") or []
    # how long rank 0 published after the slowest rank's files were durable (the commit waits for it)
    after_slowest = [c["committed_at"] - max(c["durable_at_by_rank"]) for c in commits]
    spread_rank = [max(c["durable_at_by_rank"]) - min(c["durable_at_by_rank"]) for c in commits]
    total_write = [sum(r["local_write_s"] or 0 for r in m["timeline"]) for m in per_rank]
    return {
        "ranks": len(per_rank),
        "timing": "max across ranks per save (as MLPerf Storage reports checkpoints)",
        "bytes_per_save": sum(m["state"]["bytes_per_save"] for m in per_rank),
        "saves": {"committed": len(done), "total": len(per_step)},
        "blocking_s": summarize_seconds(p["blocking_s"] for p in per_step if p["blocking_s"] is not None),
        "local_write_s": summarize_seconds(p["local_write_s"] for p in lw),
        "local_write_bytes_per_s": (sum(p["bytes"] for p in lw) / sum(p["local_write_s"] for p in lw)) if lw else None,
        "upload_s": summarize_seconds(p["upload_s"] for p in done if p["upload_s"] is not None),
        "commit_latency_s": summarize_seconds(p["commit_latency_s"] for p in done if p["commit_latency_s"] is not None),
        "per_save": per_step,
        "commit_after_slowest_rank_s": summarize_seconds(after_slowest),
        "durable_spread_s": summarize_seconds(spread_rank),
        "world": {"ranks": len(per_rank), "duration": "max over ranks per save",
                  "spread": {k: spread([m[k]["mean"] for m in per_rank])
                             for k in ("blocking_s", "local_write_s", "commit_latency_s")},
                  "straggler": straggler(total_write, hosts)},
    }


__all__ = ["WorldCommit", "merge_save_ranks"]
