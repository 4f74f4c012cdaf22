"""`iobench check`: the verdict first, exit status for CI, only its own data removed, and a
verdict whose numbers agree with each other (stall vs delivered/needed bandwidth)."""

from __future__ import annotations

import json
import re

from iobench.cli import main

VERDICT = re.compile(r"^at (?P<step>[\d.]+ ms)/step, batch (?P<b>\d+), (?P<w>\d+) workers?: stall (?P<stall>[\d.]+)% "
                     r"\((±[\d.]+ pp|no interval: too few steps)\), storage delivers (?P<cap>[\d.]+ \w+/s) of the "
                     r"(?P<need>[\d.]+ \w+/s) you need; prefetch depth \d+ is (enough|needed)")


def test_check_prints_the_verdict_first_and_cleans_up(tmp_path, capsys):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("user data")
    rc = main(["check", str(target), "--step-time", "20ms", "--batch-size", "8", "--workers", "2", "--steps", "30",
               "--sample-size", "16KiB", "--max-stall", "0.9", "--no-progress", "--json", str(tmp_path / "c.json")])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert VERDICT.match(out[0]), out[0]
    assert out[1].startswith("pass: data stall ≤ 90.00%")
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]   # only what it created is gone
    doc = json.loads((tmp_path / "c.json").read_text())
    m = doc["metrics"]
    assert doc["command"] == "check" and m["verdict"] == out[0] and m["dataset"]["generated"]
    assert m["need_bytes_per_s"] == m["load"]["batch_bytes"] / 0.02


def test_check_fails_ci_over_max_stall_and_numbers_agree(tmp_path, capsys):
    target = tmp_path / "t"
    target.mkdir()
    rc = main(["check", str(target), "--step-time", "1ms", "--batch-size", "16", "--workers", "1", "--steps", "40",
               "--sample-size", "256KiB", "--max-stall", "0.05", "--no-progress", "--json", str(tmp_path / "c.json")])
    assert rc == 1
    out = capsys.readouterr().out
    assert "FAIL: data stall ≤ 5.00%" in out
    m = json.loads((tmp_path / "c.json").read_text())["metrics"]
    # when storage delivers less than training needs, the consumer waits for the rest:
    # stall ≈ 1 − delivered / needed (the loose bound allows for this shared machine)
    expect = max(0.0, 1 - m["capacity_bytes_per_s"] / m["need_bytes_per_s"])
    assert m["capacity_bytes_per_s"] < m["need_bytes_per_s"]
    assert abs(m["stall_ratio"] - expect) < 0.25, (m["stall_ratio"], expect)


def test_check_on_an_indexed_dataset(tmp_path, capsys):
    ds = tmp_path / "mine"
    assert main(["gen", "--out", str(ds), "--num-samples", "256", "--seq-len", "1024"]) == 0
    before = sorted(p.name for p in ds.iterdir())
    capsys.readouterr()
    assert main(["check", "--dataset", str(ds), "--step-time", "10ms", "--batch-size", "8", "--steps", "20",
                 "--no-progress"]) == 0
    assert VERDICT.match(capsys.readouterr().out.splitlines()[0])
    assert sorted(p.name for p in ds.iterdir()) == before   # the user's dataset is left alone


def test_check_refuses_bad_input_in_one_line(tmp_path, capsys):
    assert main(["check", str(tmp_path), "--step-time", "0ms"]) == 2
    assert main(["check", "--step-time", "10ms"]) == 2
    assert main(["check", str(tmp_path), "--step-time", "10ms", "--max-stall", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all("error" in e for e in err)
