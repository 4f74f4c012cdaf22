"""benchmarks/bench_front_door.py refuses what it cannot measure before any work, and never writes a
report whose tables are empty (a throttled row skipped on a host without a throttle once did)."""

from __future__ import annotations

import pytest

from bench_helpers import load_benchmark

from iobench.schema import STALL_RATIO


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_front_door")


@pytest.mark.parametrize("args, says", [
    (["--rows", "tar,webdataset"], "--rows: unknown row 'webdataset'"),
    (["--rows", ""], "--rows: no row given"),
    (["--rows", "host", "--rounds", "0"], "--rounds"),
    (["--rows", "tar", "--work", "/proc"], "need a kernel read throttle"),
    (["--rows", "torch-map", "--peer-python", "/nonexistent/python"], "--peer-python"),
])
def test_refused_before_any_work(bench, tmp_path, capsys, args, says):
    out = tmp_path / "fd" / "front_door"
    assert bench.main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not out.parent.exists()


def test_markdown_has_no_empty_table(bench):
    meta = {"command": "x", "started": "t", "seconds": 1.0, "machine": {"cpu_count": 2, "load_avg_at_start": [1, 1, 1]},
            "step": "64ms", "batch": 32, "workers": 1, "samples": 64, "sample_bytes": 131072, "s3_emulate": "e",
            "throttle_bytes_per_s": 50 * 2**20, "read_ahead_kb": 8192}
    side = {STALL_RATIO: 0.2, "steady_stall_ratio": 0.21, "read_amplification": 1.0, "steps": 10,
            "command": "load D --access map"}
    r = {"row": "torch-map", "seed": 1, "iobench": side, "torch": side, "diff_pp": 0.0, "met": True}
    s = {"row": "torch-map", "rounds": [r], "n": 1, "met_rounds": 1, "iobench_mean_stall": 0.2,
         "torch_mean_stall": 0.2, "mean_diff_pp": 0.0, "met": True}
    md = bench.to_markdown(meta, [s], notes="a note")
    tables = [ln for ln in md.splitlines() if ln.startswith("|")]
    heads = [i for i, ln in enumerate(md.splitlines()) if ln.startswith("|---")]
    assert heads and all(md.splitlines()[i + 1].startswith("|") for i in heads)   # every table has a row
    assert "| 1 | 20.0% | 20.0% | +0.00 |" in tables[-1] and md.rstrip().endswith("a note")
