"""The `report` stage of `iobench run`: plans from the stage results, then the report."""

from __future__ import annotations

from pathlib import Path

from iobench.suite.report import suite_stage
from iobench.results import Results
from results_helpers import load_metrics
from iobench.suite import SuiteContext


def test_suite_stage_renders_stage_results_and_plans(tmp_path):
    ctx = SuiteContext(out_dir=tmp_path / "out", work_dir=tmp_path / "work")
    ctx.out_dir.mkdir()
    load = Results(command="load", metrics=load_metrics(
        stall_ratio=0.1, accelerator_utilization=0.9, batch_bytes=1e6,
        compute_s={"count": 5, "min": 0.005, "mean": 0.005, "p50": 0.005, "p90": 0.005, "p99": 0.005,
                   "p999": 0.005, "max": 0.005},
        batch_io_s={"count": 5, "min": 0.001, "mean": 0.002, "p50": 0.002, "p90": 0.003, "p99": 0.004,
                    "p999": 0.004, "max": 0.004},
        prefetch_recommendation={"depth_min": 1, "depth_recommended": 3, "p99_batch_io_s": 0.004,
                                 "compute_s": 0.005})).write(ctx.out_dir / "load.json")
    ckpt = Results(command="ckpt", metrics={"checkpoint": {
        "blocking_s": {"count": 2, "min": 0.1, "mean": 0.2, "p50": 0.2, "p90": 0.3, "p99": 0.3, "p999": 0.3,
                       "max": 0.3},
        "timeline": [{"step": 1, "status": "committed", "t_call": 0.0, "t_snapshot_done": 0.1, "t_local_done": 0.3,
                      "t_durable": 0.9}]}}).write(ctx.out_dir / "ckpt.json")
    (ctx.out_dir / "junk.json").write_text("{}")
    ctx.results_files += [load, ckpt, load, ctx.out_dir / "missing.json", ctx.out_dir / "junk.json"]
    ctx.row("load", "x", "cold 1 MB/s")
    m = suite_stage(ctx)
    page = Path(m["html"]).read_text()
    assert sorted(m["plans"]) == ["bandwidth", "interval"]
    assert "checkpoint every" in page and "prefetch depth 3" in page and "cold 1 MB/s" in page
    assert "checkpoint saves: snapshot and commit phases" in page
    assert any(r[0] == "report" and r[2].endswith("report.html") for r in ctx.rows)
    assert any(str(p).endswith("interval-ckpt.json") for p in ctx.results_files)
    assert m["results_files"] == 2 and any("junk.json" in w for w in ctx.warnings)
    # the answer first: the run prints this line before its table, and both pages open with it
    assert ctx.verdict == m["verdict"] and ctx.verdict.startswith("Data stall 10.00% in load.json.")
    md = Path(m["markdown"]).read_text().splitlines()
    assert md[2] == f"**{ctx.verdict}**"


def test_suite_stage_with_nothing_measured_still_writes_a_report(tmp_path):
    ctx = SuiteContext(out_dir=tmp_path / "out", work_dir=tmp_path / "work")
    ctx.out_dir.mkdir()
    m = suite_stage(ctx)
    assert Path(m["html"]).exists() and Path(m["markdown"]).exists() and m["plans"] == []


def test_run_table_fits_120_columns_and_says_each_caveat_once():
    # a real make run's table was 200 columns wide and repeated "warm: skipped: ..." 16 times
    import io
    import re

    from rich.console import Console

    from iobench.suite.report import Row, print_summary

    skipped = "warm not measured: skipped: the embedded S3 server's files are in this host's page cache either way"
    unstable = "not stable: after the 5 passes the stall's interval is wider than ±2 pp or the P99's than ±25%"
    rows = [Row("load", f"s3/format{i}-tokens", f"cold {1000 * i:,} samples/s, stall {i}% [{i - 1}%–{i + 1}%]; "
                "num_workers 3, prefetch_factor 4 (12 batches in flight)", (skipped,) + ((unstable,) if i % 2 else ()))
            for i in range(16)]
    rows += [Row("gds", f"path {p}", "unavailable", ("unavailable: no NVIDIA driver (libcuda.so.1 not found)",))
             for p in ("cufile", "kvikio-compat", "bounce")]
    for width in (200, 100):
        buf = io.StringIO()
        print_summary(Console(file=buf, width=width, force_terminal=width == 100), "17 loads: data stall from ...",
                      rows)
        out = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())      # a terminal's colours are not columns
        assert max(len(line) for line in out.splitlines()) <= min(width, 120), out
        flat = " ".join(out.split())                                # footnotes wrap at the width
        assert flat.count("page cache either way") == 1 and flat.count("libcuda.so.1") == 1
        assert flat.count("[1] warm not measured") == 1 and flat.count("[2] not stable") == 1
        assert out.splitlines()[0].startswith("17 loads")
    # the marks: every row carries its notes' numbers
    from iobench.suite.report import footnoted

    lines, notes = footnoted(rows)
    assert lines[1][2].endswith(" [1,2]") and lines[0][2].endswith(" [1]") and lines[-1][2] == "unavailable [3]"
    assert len(notes) == 3
