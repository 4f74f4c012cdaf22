"""`iobench run` checkpoint stage: a scaled Llama-3 8B state, async commit to the object tier,
then a cold restore from the object tier alone, verified."""

from __future__ import annotations


def suite_stage(ctx) -> dict:
    from iobench.config import to_dict
    from iobench.results import Results
    from iobench.units import format_bytes, format_rate, format_seconds

    from iobench.checkpointing.runner import CkptConfig, open_tiers, run_restore, run_saves

    from .intervals import REPEATS, REPEATS_NOTE, merge_repeats

    scale = float(ctx.config.get("checkpoint", {}).get("scale", 1e-4 if ctx.quick else 1e-3))
    opts = ctx.s3_storage_options if ctx.s3_url else None

    def durable_url(i: int) -> str:
        return (ctx.s3_url.rstrip("/") + f"/ckpt/{i}") if ctx.s3_url else str(ctx.local_dir(f"ckpt-durable/{i}"))

    # A quick save takes a fraction of a second: the save + restore cycle runs REPEATS times, each into
    # its own directories, and every rate is the mean with its 95% interval (suite.intervals).
    cycles = []
    for i in range(REPEATS):
        cfg = CkptConfig(preset="llama3-8b", scale=scale, count=4, interval_ms=200, mode="async",
                         local=str(ctx.local_dir(f"ckpt-local/{i}")), durable=durable_url(i),
                         endpoint_url=ctx.endpoint_url, keep_local=1, keep_durable=2)
        local, durable = open_tiers(cfg.local, cfg.durable, cfg.endpoint_url, storage_options=opts)
        m = run_saves(cfg, local, durable, progress=False)
        got, rm = run_restore(None, durable, verify=True)
        cycles.append((cfg, m, got, rm))
    cfg, _, got, _ = cycles[0]
    m = merge_repeats([c[1] for c in cycles])
    rm = merge_repeats([c[3] for c in cycles])
    repeats = dict(REPEATS_NOTE)
    res = Results(command="ckpt", config=to_dict(cfg))
    res.metrics["checkpoint"] = m
    res.metrics["repeats"] = repeats
    res.environment["staging"] = m["staging_kind"]
    path = ctx.out_dir / "ckpt.json"
    res.write(path)
    ctx.results_files.append(path)

    rres = Results(command="ckpt restore", config={"durable": cfg.durable, "verify": True})
    rres.metrics["checkpoint"] = rm
    rres.metrics["repeats"] = repeats
    rpath = ctx.out_dir / "ckpt-restore.json"
    rres.write(rpath)
    ctx.results_files.append(rpath)
    for c, _, g, _ in cycles:
        if g.step != c.count:
            ctx.warnings.append(f"checkpoint: restored step {g.step} from {c.durable}, expected {c.count}")
    rm = dict(rm, verified=all(c[3]["verified"] for c in cycles))

    st = m["state"]
    ctx.row("checkpoint", "state", f"{st['name']} ×{st['scale']:g}: {format_bytes(st['bytes_per_save'])}, "
                                   f"{st['ranks']} ranks")
    ctx.row("checkpoint", "blocking pause p50", format_seconds(m["blocking_s"]["p50"] or 0))
    ctx.row("checkpoint", "local write", format_rate(m["local_write_bytes_per_s"] or 0))
    ctx.row("checkpoint", "commit latency p50 (to S3)", format_seconds(m["commit_latency_s"]["p50"] or 0))
    ctx.row("checkpoint", "restore (cold, verified)", f"step {got.step}: {format_rate(rm['restore_bytes_per_s'])}")
    return {"bytes_per_save": st["bytes_per_save"], "saves_committed": m["saves"]["committed"],
            "blocking_s_p50": m["blocking_s"]["p50"], "backlog_max": m["backlog_max"],
            "commit_latency_s_p50": m["commit_latency_s"]["p50"], "restore_s": rm["restore_s"],
            **{k: d[k] for d, keys in ((m, ("local_write_bytes_per_s", "local_write_bytes_per_s_ci95")),
                                       (rm, ("restore_bytes_per_s", "restore_bytes_per_s_ci95")))
               for k in keys if k in d},
            "restored_step": got.step, "verified": rm["verified"], "repeats": REPEATS}
