"""CI output a person can act on: check lines name the results file (and dataset/rank), values
carry units (no 5e+08), compare shows A, B and the change and treats overlapping confidence
intervals as no change."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import json
import re

from iobench.cli import main
from iobench.results import Results
from results_helpers import load_metrics


def _load_doc(path, stall, bps, ci=None, dataset="s3://bkt/train", world=1):
    m = {STALL_RATIO: stall, "accelerator_utilization": 1 - stall,
         "throughput": {"bytes_per_s": bps, "samples_per_s": 12345.6},
         "batch_wait_s": {"count": 100, "min": 0.001, "mean": 0.01, "p50": 0.01, "p90": 0.02, "p99": 0.05,
                          "p999": 0.06, "max": 0.07},
         "peak_rss_bytes": {"parent": 92480000.0}}
    if ci:
        m["stall_ratio_ci95"] = ci
        m["accelerator_utilization_ci95"] = [1 - ci[1], 1 - ci[0]]
    r = Results(command="load", config={"dataset": dataset}, metrics=load_metrics(**m), world={"rank": 0, "size": world})
    r.write(path)
    return path


def test_report_check_lines_name_the_file_and_use_units(tmp_path, capsys):
    a = _load_doc(tmp_path / "epoch1.json", 0.42, 5e8)
    b = _load_doc(tmp_path / "epoch2.json", 0.01, 5e8, dataset="/nvme/train")
    rc = main(["report", str(a), str(b), "-o", str(tmp_path / "rep"), "--max-stall", "0.05",
               "--min-throughput", "600MB/s"])
    assert rc == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith(("pass", "FAIL"))]
    assert len(lines) == 4
    for ln in lines:
        assert ("epoch1.json" in ln) != ("epoch2.json" in ln)
        assert not re.search(r"\de[+-]\d", ln), ln   # no exponent notation
    assert any(ln.startswith("FAIL: data stall ≤ 5.00% — epoch1.json · load · dataset s3://bkt/train") and
               ln.endswith("stall_ratio = 42.00%") for ln in lines), lines
    assert any("throughput ≥ 572.2 MiB/s" in ln and "476.8 MiB/s" in ln for ln in lines), lines
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "epoch1.json" in md.split("## Checks")[1]


def test_compare_shows_a_b_and_change_with_units(tmp_path, capsys):
    a = _load_doc(tmp_path / "a.json", 0.10, 5e8)
    b = _load_doc(tmp_path / "b.json", 0.30, 2.5e8)
    assert main(["compare", str(a), str(b), "--max-regression", "0.1", "--json", str(tmp_path / "c.json")]) == 1
    out = capsys.readouterr().out
    assert "476.8 MiB/s" in out and "238.4 MiB/s" in out and "−238.4 MiB/s" in out
    assert "+20.00 pp" in out
    assert not re.search(r"\de[+-]\d", out), out
    assert "FAIL: no drop > 10% — B: " in out
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["metrics"]["passed"] is False


def test_identical_runs_compare_clean(tmp_path, capsys):
    a = _load_doc(tmp_path / "a.json", 0.10, 5e8)
    assert main(["compare", str(a), str(a), "--max-regression", "0"]) == 0
    assert "no metric differs beyond both runs' intervals" in capsys.readouterr().out.splitlines()[0]


def test_overlapping_intervals_are_not_a_change(tmp_path, capsys):
    # two runs of the same setup: point estimates differ, their intervals overlap
    a = _load_doc(tmp_path / "a.json", 0.040, 5e8, ci=[0.030, 0.050])
    b = _load_doc(tmp_path / "b.json", 0.046, 5e8, ci=[0.036, 0.056])
    assert main(["compare", str(a), str(b), "--max-regression", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "PASS: 0 of 0 checks passed; no metric differs beyond both runs' intervals (2 with intervals)" in out
    # disjoint intervals are a change
    c = _load_doc(tmp_path / "c.json", 0.090, 5e8, ci=[0.080, 0.100])
    assert main(["compare", str(a), str(c), "--max-regression", "0.001"]) == 1
    out = capsys.readouterr().out
    assert STALL_RATIO in out and "[3.00%, 5.00%]" in out
