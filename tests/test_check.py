"""`iobench check`: the verdict first, exit status for CI, only its own data removed, cold by
default with the residency recorded, the host's ceiling beside the storage number, and a
verdict whose numbers agree with each other (stall vs delivered/needed bandwidth)."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import json
import re

import pytest

from iobench.cli import main

VERDICT = re.compile(r"^at (?P<step>[\d.]+ ms)/step, batch (?P<b>\d+), (?P<w>\d+) workers?: stall (?P<stall>[\d.]+)% "
                     r"\((±[\d.]+ pp|no interval: too few steps)\), storage delivers (?P<cap>[\d.]+ \w+/s)"
                     r"(?P<samples> \([\d.]+ \w+/s of samples: [\d.]+x read per sample byte\))? of the "
                     r"(?P<need>[\d.]+ \w+/s) you need(?P<rest>.*)$")


def test_check_prints_the_verdict_first_and_cleans_up(tmp_path, capsys):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("user data")
    rc = main(["check", str(target), "--step-time", "20ms", "--batch-size", "8", "--workers", "2", "--steps", "30",
               "--sample-size", "16KiB", "--max-stall", "0.9", "--no-progress", "--json", str(tmp_path / "c.json"),
               "--host-ceiling", "cached"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    v = VERDICT.match(out[0])
    assert v, out[0]
    assert "cold: " in v["rest"] and ("host ceiling" in v["rest"] or "host-bound" in v["rest"]), out[0]
    assert out[1].startswith("pass: data stall ≤ 90.00%")
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]   # only what it created is gone
    doc = json.loads((tmp_path / "c.json").read_text())
    m = doc["metrics"]
    assert doc["command"] == "check" and m["verdict"] == out[0] and m["dataset"]["generated"]
    assert m["need_bytes_per_s"] == m["load"]["batch_bytes"] / 0.02
    # cold by default, and the results say what the data really was before, at the start and after
    cache = doc["environment"]["cache"]
    assert cache["declared"] == "cold" and cache["measured_residency"] <= 0.05
    assert {"residency_found", "residency_after"} <= set(cache)
    assert doc["environment"]["host_ceiling"]["bytes_per_s"] > 0
    assert m["load"]["steps"] == 30


@pytest.mark.parametrize("workers", [1, 2])
def test_check_fails_ci_over_max_stall_and_numbers_agree(tmp_path, capsys, workers):
    target = tmp_path / "t"
    target.mkdir()
    # Storage throttled to a known ceiling (emulated bandwidth, the tier's aggregate: W workers
    # share it): a 4 MiB batch takes >= 10 ms, so the per-batch hand-over costs of a busy host
    # (a few ms at most) stay small beside it.
    cap = 400 * 2**20
    rc = main(["check", str(target), "--step-time", "5ms", "--batch-size", "16", "--workers", str(workers),
               "--steps", "40",
               "--sample-size", "256KiB", "--emulate", "bw:400MiB/s", "--max-stall", "0.05", "--no-progress",
               "--cache", "warm",   # the emulation is the storage here, not this VM's disk
               "--json", str(tmp_path / "c.json")])
    assert rc == 1
    out = capsys.readouterr().out
    assert "FAIL: data stall ≤ 5.00%" in out
    # the cause a remedy must address: the tier's bandwidth, or on a host whose other processes keep the
    # worker waiting for a CPU (schedstat run delay; load 12 on 2 cores here), that contention
    assert "limit: storage bandwidth" in out or ("limit: CPU contention" in out and "host-bound" in out)
    m = json.loads((tmp_path / "c.json").read_text())["metrics"]
    # ground truth: the emulation never reads faster than its cap
    assert 0.2 * cap < m["capacity_bytes_per_s"] <= cap * 1.05
    assert m["need_bytes_per_s"] == m["load"]["batch_bytes"] / 0.005
    # when storage delivers less than training needs, the consumer waits for the rest:
    # stall ≈ 1 − delivered / needed, at the step the run emulated (a busy host oversleeps)
    need = m["load"]["batch_bytes"] / m["load"]["compute_s"]["mean"]
    expect = max(0.0, 1 - m["capacity_bytes_per_s"] / need)
    assert expect > 0.4
    assert abs(m[STALL_RATIO] - expect) < 0.12, (m[STALL_RATIO], expect)
    # what the loop received is what storage delivered (capacity spans the whole run, delivered the steady
    # window: on a host at load 8 they differed by up to 27%)
    assert abs(m["delivered_bytes_per_s"] / m["capacity_bytes_per_s"] - 1) < 0.35, m
    assert (m["cause"], m["bound"]) in (("storage bandwidth", "storage"), ("CPU contention", "host"))


def test_check_on_an_indexed_dataset(tmp_path, capsys):
    ds = tmp_path / "mine"
    assert main(["gen", "--out", str(ds), "--num-samples", "256", "--seq-len", "1024"]) == 0
    before = sorted(p.name for p in ds.iterdir())
    capsys.readouterr()
    assert main(["check", "--dataset", str(ds), "--step-time", "10ms", "--batch-size", "8", "--steps", "20",
                 "--no-progress"]) == 0
    assert VERDICT.match(capsys.readouterr().out.splitlines()[0])
    assert sorted(p.name for p in ds.iterdir()) == before   # the user's dataset is left alone


def test_check_indexes_a_dataset_without_manifest_into_the_cache(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("IOBENCH_CACHE_DIR", str(cache))
    ds = tmp_path / "tars"
    assert main(["gen", "--out", str(ds), "--format", "tar", "--num-samples", "256", "--seq-len", "1024",
                 "--shard-size", "64 samples"]) == 0
    (ds / "manifest.json").unlink()            # as if someone else wrote these tars
    before = {p.name: p.stat().st_mtime_ns for p in ds.iterdir()}
    capsys.readouterr()
    assert main(["check", "--dataset", str(ds), "--step-time", "10ms", "--batch-size", "8", "--steps", "20",
                 "--no-progress", "--json", str(tmp_path / "c.json")]) == 0
    io = capsys.readouterr()
    assert VERDICT.match(io.out.splitlines()[0])
    assert "detected tar" in io.err
    assert {p.name: p.stat().st_mtime_ns for p in ds.iterdir()} == before   # nothing written into the data
    m = json.loads((tmp_path / "c.json").read_text())["metrics"]
    assert m["dataset"]["format"] == "tar" and m["dataset"]["indexed_to"].startswith(str(cache))


def test_check_warm_says_page_cache(tmp_path, capsys):
    assert main(["check", str(tmp_path), "--step-time", "10ms", "--batch-size", "8", "--steps", "20", "--cache", "warm",
                 "--sample-size", "16KiB", "--host-ceiling", "off", "--no-progress"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "warm: " in line and "page-cache numbers, not storage" in line and "host ceiling" not in line


def test_check_refuses_bad_input_in_one_line(tmp_path, capsys):
    assert main(["check", str(tmp_path), "--step-time", "0ms"]) == 2
    assert main(["check", "--step-time", "10ms"]) == 2
    assert main(["check", str(tmp_path), "--step-time", "10ms", "--max-stall", "5"]) == 2
    assert main(["check", "--dataset", str(tmp_path / "nothing"), "--step-time", "10ms"]) == 2
    assert main(["check", str(tmp_path), "--step-time", "10ms", "--min-steps", "1"]) == 2
    assert main(["check", str(tmp_path), "--step-time", "10ms", "--max-time", "0s"]) == 2
    assert main(["check", str(tmp_path), "--step-time", "10ms", "--emulate", "bw:1GB,per=wroker"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 7 and all("error" in e for e in err)
    assert list(tmp_path.iterdir()) == []          # refused before anything was generated


def test_check_runs_until_stable_within_its_time_cap(tmp_path, capsys):
    # no --steps: until the stall and P99 intervals are narrow, never under --min-steps, at most --max-time
    assert main(["check", str(tmp_path), "--step-time", "5ms", "--batch-size", "4", "--sample-size", "4KiB",
                 "--min-steps", "30", "--max-time", "3s", "--host-ceiling", "off", "--no-progress",
                 "--json", str(tmp_path.parent / "u.json")]) == 0
    m = json.loads((tmp_path.parent / "u.json").read_text())["metrics"]["load"]
    assert m["steps"] >= 30 and m["stability"]["until_stable"]
    assert m["wall_s"] < 3.0 + 2.0      # the cap, and the last batches in flight


def test_check_reads_tars_with_keys_of_their_own_as_records(tmp_path, capsys):
    # webdataset-style tars (``.bin`` + ``.cls`` per key), written by a tool that is not iobench
    import io
    import tarfile

    ds = tmp_path / "wds"
    ds.mkdir()
    for shard in range(2):
        with tarfile.open(ds / f"shard-{shard:04d}.tar", "w") as tf:
            for i in range(64):
                for ext, data in ((".bin", bytes([i % 251]) * 8192), (".cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{shard:04d}{i:06d}{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    assert main(["check", "--dataset", str(ds), "--step-time", "10ms", "--batch-size", "8", "--workers", "1",
                 "--steps", "12", "--no-progress", "--json", str(tmp_path / "c.json")]) == 0
    io_ = capsys.readouterr()
    assert VERDICT.match(io_.out.splitlines()[0]) and "detected tar" in io_.err
    m = json.loads((tmp_path / "c.json").read_text())
    assert m["environment"]["dataset"]["modality"] == "records" and m["metrics"]["load"]["samples"] == 12 * 8
