"""The `iobench run` stage: a few seconds of probing on each embedded tier."""

from __future__ import annotations

from ..units import format_rate, format_seconds


def suite_stage(ctx) -> dict | None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ..results import Results
    from iobench.probe.runner import Target, build_config, run_tier

    from .intervals import REPEATS

    size_cap = 256 * 2**20
    local = ["file", "metadata", "smallfiles"]
    plans = [(Target("nvme", str(ctx.local_dir("nvme") / "probe")), local,
              {p: build_config(p, {}, quick=True) for p in local})]
    if ctx.s3_url:
        remote = ["s3", "metadata"]
        plans.append((Target("object", ctx.s3_url.rstrip("/") + "/probe"), remote,
                      {p: build_config(p, {}, quick=True, protocol="s3") for p in remote}))
    # Each quick probe point is one ~0.1 s measurement: the whole probe runs REPEATS times and every
    # rate is the mean with its 95% interval (suite.intervals), so two runs compare on intervals.  The
    # repeats are spread over the run (ctx.repeated): back to back they missed the disk's drift.
    def measure():
        res = Results(command="probe", config={"probe": "suite", "quick": True, "repeats": REPEATS})
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      console=Console(stderr=True), transient=True,
                      disable=not Console(stderr=True).is_terminal) as progress:
            for target, probes, configs in plans:
                # force: the tier folder may hold other stages' data; the probe works in its own subfolder
                run_tier(res, target, probes, configs, size_cap, force=True, endpoint_url=ctx.endpoint_url,
                         storage_options=ctx.s3_storage_options if target.url.startswith("s3://") else None,
                         progress=progress)
        return res

    return ctx.repeated("probe", measure, lambda runs: _finish(ctx, runs))


def _finish(ctx, runs: list) -> dict:
    from .intervals import REPEATS_NOTE, merge_repeats

    results = runs[0]
    results.metrics = merge_repeats([r.metrics for r in runs])
    results.metrics["repeats"] = dict(REPEATS_NOTE)
    for r in runs[1:]:
        for w in r.warnings:
            results.warn(w)
    path = results.write(ctx.out_dir / "probe.json")
    ctx.results_files.append(path)
    for w in results.warnings:
        ctx.warnings.append(f"probe: {w}")
    summary = results.metrics["summary"]
    for tier, row in summary.items():
        if row.get("seq_read_bytes_per_s"):
            ctx.row("probe", f"{tier} sequential read", format_rate(row["seq_read_bytes_per_s"]))
        if row.get("rand_read_iops_qd32"):
            ctx.row("probe", f"{tier} random read IOPS (qd {row.get('rand_read_iops_qd32_actual_qd')})",
                    f"{row['rand_read_iops_qd32']:,.0f}")
        if row.get("p99_read_latency_s"):
            ctx.row("probe", f"{tier} p99 read latency (qd 1)", format_seconds(row["p99_read_latency_s"]))
        if row.get("metadata_ops_per_s"):
            ctx.row("probe", f"{tier} metadata ops/s", f"{row['metadata_ops_per_s']:,.0f}")
        if row.get("smallfile_penalty"):
            ctx.row("probe", f"{tier} small-file penalty", f"{row['smallfile_penalty']:.1f}×")
    # No probe table here: its numbers are rows of the run's summary (printed after the verdict)
    # and of the report; a table of its own printed at the end of the run came before the answer.
    return {"summary": summary, "results_file": str(path)}
