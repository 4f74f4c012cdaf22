"""`iobench run` checkpoint stage: a scaled Llama-3 8B state, async commit to the object tier,
then a cold restore from the object tier alone, verified."""

from __future__ import annotations


def suite_stage(ctx) -> dict:
    from iobench.config import to_dict
    from iobench.results import Results
    from iobench.units import format_bytes, format_rate, format_seconds

    from iobench.checkpointing.runner import CkptConfig, open_tiers, run_restore, run_saves

    scale = float(ctx.config.get("checkpoint", {}).get("scale", 1e-4 if ctx.quick else 1e-3))
    durable_url = (ctx.s3_url.rstrip("/") + "/ckpt") if ctx.s3_url else str(ctx.local_dir("ckpt-durable"))
    cfg = CkptConfig(preset="llama3-8b", scale=scale, count=4, interval_ms=200, mode="async",
                     local=str(ctx.local_dir("ckpt-local")), durable=durable_url, endpoint_url=ctx.endpoint_url,
                     keep_local=1, keep_durable=2)
    opts = ctx.s3_storage_options if ctx.s3_url else None
    local, durable = open_tiers(cfg.local, cfg.durable, cfg.endpoint_url, storage_options=opts)
    res = Results(command="ckpt", config=to_dict(cfg))
    m = run_saves(cfg, local, durable, progress=False)
    res.metrics["checkpoint"] = m
    res.environment["staging"] = m["staging_kind"]
    path = ctx.out_dir / "ckpt.json"
    res.write(path)
    ctx.results_files.append(path)

    got, rm = run_restore(None, durable, verify=True)
    live_ok = got.step == cfg.count
    rres = Results(command="ckpt restore", config={"durable": durable_url, "verify": True})
    rres.metrics["checkpoint"] = rm
    rpath = ctx.out_dir / "ckpt-restore.json"
    rres.write(rpath)
    ctx.results_files.append(rpath)
    if not live_ok:
        ctx.warnings.append(f"checkpoint: restored step {got.step}, expected {cfg.count}")

    st = m["state"]
    ctx.row("checkpoint", "state", f"{st['name']} ×{st['scale']:g}: {format_bytes(st['bytes_per_save'])}, "
                                   f"{st['ranks']} ranks")
    ctx.row("checkpoint", "blocking pause p50", format_seconds(m["blocking_s"]["p50"] or 0))
    ctx.row("checkpoint", "local write", format_rate(m["local_write_bytes_per_s"] or 0))
    ctx.row("checkpoint", "commit latency p50 (to S3)", format_seconds(m["commit_latency_s"]["p50"] or 0))
    ctx.row("checkpoint", "restore (cold, verified)", f"step {got.step}: {format_rate(rm['restore_bytes_per_s'])}")
    return {"bytes_per_save": st["bytes_per_save"], "saves_committed": m["saves"]["committed"],
            "blocking_s_p50": m["blocking_s"]["p50"], "local_write_bytes_per_s": m["local_write_bytes_per_s"],
            "commit_latency_s_p50": m["commit_latency_s"]["p50"], "backlog_max": m["backlog_max"],
            "restore_s": rm["restore_s"], "restore_bytes_per_s": rm["restore_bytes_per_s"],
            "restored_step": got.step, "verified": rm["verified"]}
