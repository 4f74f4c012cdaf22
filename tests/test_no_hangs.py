"""No hangs: a killed `gen` or `load` takes its workers with it within a second; the temp files a
killed first run leaves are reported by `verify` and removed (and reported) by the next `gen`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from iobench.cli import main

PY = sys.executable


def _children_when(proc: subprocess.Popen, n: int, timeout_s: float = 60.0) -> list[psutil.Process]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        kids = psutil.Process(proc.pid).children(recursive=True)
        # workers named by their target: forked children of the iobench parent
        if len(kids) >= n:
            return kids
        if proc.poll() is not None:
            pytest.fail(f"the command ended (rc {proc.returncode}) before its workers were seen")
        time.sleep(0.05)
    pytest.fail("workers did not start")


def _all_gone(kids: list[psutil.Process], within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids):
            return True
        time.sleep(0.02)
    return False


def test_killed_gen_takes_its_writers_and_next_gen_cleans_up(tmp_path, capsys):
    out = tmp_path / "ds"
    cmd = [PY, "-m", "iobench.cli", "gen", "--num-samples", "200000", "--seq-len", "512", "--shard-size", "4MiB",
           "--workers", "2", "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        kids = _children_when(proc, 2)
        deadline = time.monotonic() + 30   # wait for at least one temp file: the writers are writing
        while time.monotonic() < deadline and not any(n.endswith(".tmp") for n in os.listdir(out)):
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _all_gone(kids, 1.0), "writers outlived their killed parent by more than a second"
    finally:
        if proc.poll() is None:
            proc.kill()
    temps = [n for n in os.listdir(out) if n.endswith(".tmp")]
    assert temps, "the killed run left no temp file to clean (the test did not exercise the case)"
    # verify names the leftovers
    assert main(["verify", str(out), "--json", str(tmp_path / "v.json")]) == 1
    v = json.loads((tmp_path / "v.json").read_text())["metrics"]
    assert "temp file" in capsys.readouterr().out + json.dumps(v)
    # the next gen (smaller, same shard names) removes and reports them
    assert main(["gen", "--num-samples", "2000", "--seq-len", "512", "--shard-size", "4MiB", "--out", str(out),
                 "--no-progress", "--json", str(tmp_path / "g.json")]) == 0
    g = json.loads((tmp_path / "g.json").read_text())["metrics"]
    assert g["leftover_temp_files_removed"] >= 1
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_killed_load_takes_its_workers(tmp_path):
    from iobench.generate import GenSpec, generate

    ds = tmp_path / "ds"
    generate(GenSpec.from_mapping({"num_samples": 2000, "seq_len": 64, "shard_size": "100 samples"}), str(ds),
             progress=False)
    cmd = [PY, "-m", "iobench.cli", "load", str(ds), "-W", "2", "-B", "8", "--epochs", "1000",
           "--compute-ms", "50"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        kids = [k for k in _children_when(proc, 2)]
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _all_gone(kids, 1.0), "loader workers outlived their killed parent by more than a second"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_dead_writer_fails_gen_with_exit_1_and_cleans_up(tmp_path):
    out = tmp_path / "ds"
    cmd = [PY, "-m", "iobench.cli", "gen", "--num-samples", "200000", "--seq-len", "512", "--shard-size", "4MiB",
           "--workers", "2", "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        kids = _children_when(proc, 2)
        os.kill(kids[-1].pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "died" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (out / "manifest.json").exists()
    left = os.listdir(out) if out.exists() else []   # the directory it made goes too once empty
    assert not [n for n in left if n.endswith(".tmp") or n.endswith(".bin")], left
