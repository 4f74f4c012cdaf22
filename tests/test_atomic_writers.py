"""Temp files carry their writer (host, pid, process start time): clean-ups remove only those of dead
writers.  A second `gen` into a directory another `gen` is writing leaves the live one's temp files;
the next prestage of a dataset, and `tiers reconcile`, remove a killed stager's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_tiers_util import local_tiers, make_dataset

from iobench.io import atomic
from iobench.io.atomic import final_name_of, temp_file, writer_alive


def _name_for(pid: int, start: str, host: str | None = None, final: str = "shard-000000.bin") -> str:
    return f".{final}.{host or atomic._host()}-{pid}-{start}-abcd.tmp"


@pytest.fixture
def sleeper():
    """A live process other than this one, and its start time."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield p.pid, atomic._start_time(p.pid)
    finally:
        p.kill()
        p.wait()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("who, alive", [
    ("this process", True), ("a live process", True), ("a dead process", False),
    ("a reused pid (other start time)", False), ("another host", True), ("the old convention", False),
])
def test_writer_alive(who, alive, sleeper, tmp_path):
    pid, start = sleeper
    name = {
        "this process": lambda: os.path.basename(_own_temp(tmp_path)),
        "a live process": lambda: _name_for(pid, start),
        "a dead process": lambda: _name_for(_dead_pid(), "12345"),
        "a reused pid (other start time)": lambda: _name_for(pid, str(int(start) + 1)),
        "another host": lambda: _name_for(_dead_pid(), "1", host="ffffff" if atomic._host() != "ffffff" else "eeeeee"),
        "the old convention": lambda: ".shard-000000.bin.a1b2c3d4.tmp",
    }[who]()
    assert final_name_of(name) == "shard-000000.bin"
    assert writer_alive(name) is alive


def _own_temp(d) -> str:
    # in the test's own directory: a temp dir of its own in /tmp outlived every run
    fd, path = temp_file(os.path.join(d, "shard-000000.bin"))
    os.close(fd)
    return path


def test_a_second_gen_leaves_a_live_writers_temp_files(tmp_path, sleeper):
    from iobench.cli import main

    pid, start = sleeper
    out = tmp_path / "ds"
    assert main(["gen", "--num-samples", "16", "--seq-len", "8", "--out", str(out), "--no-progress"]) == 0
    live = out / _name_for(pid, start, final="shard-000001.bin")
    dead = out / _name_for(_dead_pid(), "12345", final="shard-000002.bin")
    live.write_bytes(b"being written")
    dead.write_bytes(b"left by a killed run")
    assert main(["gen", "--num-samples", "16", "--seq-len", "8", "--out", str(out), "--no-progress"]) == 0
    assert live.read_bytes() == b"being written"     # the live writer's: untouched
    assert not dead.exists()                         # the dead one's: cleaned up


def test_the_next_prestage_and_reconcile_remove_a_killed_stagers_temp_files(tmp_path, sleeper):
    from iobench.tiers.manager import TierManager

    pid, start = sleeper
    m = make_dataset(str(tmp_path / "src"), shards=2, shard_bytes=4096)
    mgr = TierManager(local_tiers(tmp_path)).open()
    try:
        ds = mgr.register(str(tmp_path / "src"))
        copy_dir = tmp_path / "nvme" / ds.id
        copy_dir.mkdir(parents=True, exist_ok=True)
        live = copy_dir / _name_for(pid, start, final=m.shards[0].path)
        dead = copy_dir / _name_for(_dead_pid(), "7", final=m.shards[1].path)
        live.write_bytes(b"x")
        dead.write_bytes(b"y")
        mgr.prestage(ds, "nvme")
        assert live.exists() and not dead.exists()
        dead.write_bytes(b"y")
        mgr.reconcile("nvme")
        assert live.exists() and not dead.exists()
    finally:
        mgr.close()


def test_temp_names_stay_unique_and_recognised(tmp_path):
    names = set()
    for _ in range(50):
        fd, path = temp_file(tmp_path / "f.json")
        os.close(fd)
        names.add(os.path.basename(path))
        assert final_name_of(os.path.basename(path)) == "f.json" and writer_alive(os.path.basename(path))
    assert len(names) == 50
    t0 = time.monotonic()
    assert all(writer_alive(n) for n in names) and time.monotonic() - t0 < 1
