"""`iobench compare`: two runs side by side; thresholds and regressions set the exit code."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import json
import re

import pytest

from iobench.cli import main
from iobench.report.compare import compare
from iobench.results import Results
from results_helpers import load_metrics


def _write(path, au, stall, bps, p99):
    return Results(command="load", metrics=load_metrics(
        accelerator_utilization=au, stall_ratio=stall, throughput={"bytes_per_s": bps},
        batch_wait_s={"count": 10, "min": 0.001, "mean": 0.01, "p50": 0.01, "p90": 0.02, "p99": p99,
                      "p999": p99, "max": p99})).write(path)


def test_rows_pair_metrics_by_path():
    a = {"metrics": {"x": 1.0, "h": {"count": 2, "p50": 1.0, "p99": 2.0}, "only_a": 3}}
    b = {"metrics": {"x": 2.0, "h": {"count": 2, "p50": 1.0, "p99": 4.0}, "only_b": 5}}
    rows = {r.path: r for r in compare(a, b)}
    assert rows["x"].diff == 1.0 and rows["x"].ratio == 2.0
    assert rows["h.p99"].ratio == 2.0 and rows["h.p50"].diff == 0
    assert rows["only_a"].b is None and rows["only_b"].a is None and rows["only_b"].ratio is None


def test_cli_compare_exit_codes(tmp_path, capsys):
    a = _write(tmp_path / "a.json", 0.95, 0.05, 5e8, 0.05)
    b = _write(tmp_path / "b.json", 0.85, 0.15, 3e8, 0.09)
    out = tmp_path / "cmp.json"
    assert main(["compare", str(a), str(b), "--json", str(out), "--markdown", str(tmp_path / "cmp.md")]) == 0
    text = capsys.readouterr().out
    assert "accelerator_utilization" in text and "0.600×" in text
    data = json.loads(out.read_text())
    assert data["command"] == "compare" and data["metrics"]["passed"] is True
    assert "| throughput.bytes_per_s |" in (tmp_path / "cmp.md").read_text()
    assert main(["compare", str(a), str(b), "--min-au", "0.9"]) == 1          # B below MLPerf's 90 %
    assert main(["compare", str(b), str(a), "--min-au", "0.9"]) == 0          # thresholds check B
    assert main(["compare", str(a), str(b), "--max-regression", "0.1"]) == 1
    assert main(["compare", str(a), str(a), "--max-regression", "0.1"]) == 0
    assert main(["compare", str(a), str(b), "--max-wait-p99", "100ms"]) == 0
    assert main(["compare", str(a), str(b), "--max-wait-p99", "50ms"]) == 1
    assert main(["compare", str(a), str(b), "--min-au", "1.5"]) == 2
    assert main(["compare", str(a), str(tmp_path / "nope.json")]) == 2


def test_compare_two_runs_pairs_their_stage_files(tmp_path, capsys):
    runs = []
    for name, bps in (("r1", 5e8), ("r2", 2e8)):
        stage = _write(tmp_path / name / "load" / "cold.json", 0.95, 0.05, bps, 0.05)
        runs.append(Results(command="run", environment={"results_files": [str(stage)]},
                            metrics={"load": {"stage_s": 1.0}}).write(tmp_path / name / "run.json"))
    assert main(["compare", str(runs[0]), str(runs[1]), "--max-regression", "0.2"]) == 1
    out = capsys.readouterr().out
    assert "load/cold.json.throughput.bytes_per_s" in out and "FAIL" in out


def test_compare_json_writes_a_p99_without_upper_bound(tmp_path):
    # a short load's P99 has a lower bound only (intervals.*.high is None): the row's interval runs to inf,
    # which JSON cannot hold; --json must still write (null for the missing bound)
    iv = {"batch_wait_p99_s": {"low": 0.04, "high": None, "value": 0.05}}
    for name, p99 in (("a", 0.05), ("b", 0.06)):
        Results(command="load", metrics=load_metrics(stall_ratio=0.1, intervals=iv,
                                                     batch_wait_s={"count": 10, "p99": p99})
                ).write(tmp_path / f"{name}.json")
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json",
                 str(tmp_path / "c.json")]) == 0
    row = next(r for r in json.loads((tmp_path / "c.json").read_text())["metrics"]["rows"]
               if r["path"] == "batch_wait_s.p99")
    assert row["ci_a"] == [0.04, None] and row["within_noise"]


def test_throughput_with_interval_is_judged_on_the_interval(tmp_path):
    # the suite's generate stage gives each throughput its repeats' 95% interval (bytes_per_s_ci95):
    # two runs whose intervals overlap agree even 20% apart; disjoint intervals still face the 10% rule
    def write(name, bps, ci):
        return Results(command="gen", metrics={"throughput": {"bytes_per_s": bps, "bytes_per_s_ci95": ci}}
                       ).write(tmp_path / f"{name}.json")

    a = write("a", 100.0, [80.0, 125.0])
    b = write("b", 80.0, [70.0, 95.0])
    c = write("c", 60.0, [55.0, 66.0])
    assert main(["compare", str(a), str(b), "--max-regression", "0.1"]) == 0
    assert main(["compare", str(a), str(c), "--max-regression", "0.1"]) == 1
    rows = {r.path: r for r in compare(*(json.loads(p.read_text()) for p in (a, c)))}
    assert rows["throughput.bytes_per_s"].ci_a == (80.0, 125.0) and "throughput.bytes_per_s_ci95" not in rows


def test_intervals_in_table_rows_pair_with_their_numbers():
    # probe points and gds cells are lists of records: an interval inside a row bounds that row's number
    from iobench.report.compare import intervals

    m = {"points": [{"bytes_per_s": 10.0, "bytes_per_s_ci95": [8.0, 12.0]}, {"bytes_per_s": 5.0}]}
    assert intervals(m) == {"points[0].bytes_per_s": (8.0, 12.0)}
    rows = {r.path: r for r in compare({"metrics": m}, {"metrics": {"points": [
        {"bytes_per_s": 8.5, "bytes_per_s_ci95": [7.0, 9.0]}, {"bytes_per_s": 5.0}]}})}
    assert rows["points[0].bytes_per_s"].within_noise and "points[0].bytes_per_s_ci95" not in str(rows)


def test_runs_find_their_own_stage_files_after_a_move(tmp_path, monkeypatch):
    # `iobench run` records its stage files relative to its folder; a run copied elsewhere (make run
    # writes reports/latest each time) must compare its own files, not what now sits at the old path
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "load" / "cold.json", 0.95, 0.05, 1e8, 0.05)        # a later run's file at the old path
    runs = []
    for name, bps in (("r1", 5e8), ("r2", 2e8)):
        _write(tmp_path / name / "load" / "cold.json", 0.95, 0.05, bps, 0.05)
        runs.append(Results(command="run", environment={"results_files": ["load/cold.json"]},
                            metrics={"load": {"stage_s": 1.0}}).write(tmp_path / name / "run.json"))
    assert main(["compare", str(runs[0]), str(runs[1]), "--max-regression", "0.2", "--json", "c.json"]) == 1
    row = next(r for r in json.loads((tmp_path / "c.json").read_text())["metrics"]["rows"]
               if r["path"] == "load/cold.json.throughput.bytes_per_s")
    assert (row["a"], row["b"]) == (5e8, 2e8)


@pytest.mark.parametrize("path, measured", [
    ("per_worker[0].pid", False), ("per_worker[3].worker", False), ("passes[2].server_instance", False),
    ("load/cold.json.per_worker[0].pid", False), ("queue_depth.slots", False), ("queue_depth.slot_bytes", False),
    ("steady_window.from_step", False), ("intervals.stall_ratio.low", False), ("series.wait_s", False),
    ("load/cold.json.intervals.batch_wait_p99_s.high", False), ("steps_planned", False), ("config.seed", False),
    ("stability.rule.min_steps", False), ("dataset_id", False),
    ("throughput.bytes_per_s", True), ("batch_wait_s.p99", True), ("per_worker[0].bytes_per_s", True),
    ("load/cold.json.stall_ratio", True), ("read_latency_s.get.p50", True), ("queue_depth.mean", True),
    ("passes[0].stall_of_pass", True), ("bytes_read", True),
])
def test_only_measurements_are_compared(path, measured):
    from iobench.report.compare import is_measurement

    assert is_measurement(path) is measured


def _load(path, stall, bps, pid, lo_hi=None, fmt="raw", access="map", cache="cold", compute=0.05, tiny=1e-9):
    m = load_metrics(stall_ratio=stall, accelerator_utilization=1 - stall, throughput={"bytes_per_s": bps},
                     per_worker=[{"worker": 0, "pid": pid, "bytes_per_s": bps}],
                     batch_io_s={"count": 10, "min": tiny, "mean": tiny, "p50": tiny, "p90": tiny, "p99": tiny,
                                 "p999": tiny, "max": tiny},
                     intervals={STALL_RATIO: {"low": lo_hi[0], "high": lo_hi[1]}} if lo_hi else {})
    env = {"dataset": {"format": fmt}, "loader": {"access": access, "compute": {"nominal_s": compute}},
           "cache": {"declared": cache}}
    return Results(command="load", metrics=m, environment=env).write(path)


def test_compare_prints_the_verdict_first_and_no_ids_or_meaningless_ratios(tmp_path, capsys):
    a = _load(tmp_path / "a.json", 0.10, 5e8, pid=4242, lo_hi=(0.09, 0.11))
    b = _load(tmp_path / "b.json", 0.30, 5e8, pid=5111807, lo_hi=(0.28, 0.32), tiny=5e-3)
    assert main(["compare", str(a), str(b), "--max-regression", "0.1"]) == 1
    out = capsys.readouterr().out
    first = out.strip().splitlines()[0]
    assert first.startswith("REGRESSION: 2 of 2 checks failed (first: stall_ratio = 30.00%)") and "beyond both" in first
    assert "pid" not in out and "worker" not in out.replace("per_worker", "")
    assert not any(re.search(r"\d{4,}\.\d{3}×", line) for line in out.splitlines())   # no 5111807.000×
    # the same files: a pass, nothing beyond noise
    assert main(["compare", str(a), str(a), "--max-regression", "0.1"]) == 0
    assert capsys.readouterr().out.startswith("PASS: ")


def test_intervals_that_overlap_hide_the_row(tmp_path, capsys):
    a = _load(tmp_path / "a.json", 0.10, 5e8, pid=1, lo_hi=(0.05, 0.15))
    b = _load(tmp_path / "b.json", 0.12, 5e8, pid=2, lo_hi=(0.08, 0.16))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "no metric differs beyond both runs' intervals" in out.splitlines()[0]
    assert "│ stall_ratio" not in out


@pytest.mark.parametrize("field, kw, shown", [
    ("format", {"fmt": "parquet"}, "format raw vs parquet"),
    ("access", {"access": "stream"}, "access map vs stream"),
    ("cache", {"cache": "warm"}, "cache cold vs warm"),
    ("step time", {"compute": 0.2}, "step time 0.05 vs 0.2"),
])
def test_different_setups_are_refused_unless_asked(tmp_path, capsys, field, kw, shown):
    a = _load(tmp_path / "a.json", 0.1, 5e8, pid=1)
    b = _load(tmp_path / "b.json", 0.1, 5e8, pid=1, **kw)
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and shown in err and "--allow-different" in err
    assert main(["compare", str(a), str(b), "--allow-different"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("WARNING: not the same setup") and shown in lines[1]
