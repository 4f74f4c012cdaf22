"""Nothing outside its own data: hostile or broken manifests are refused (exit 2, the field named)
by every command that reads them, and no file outside the dataset/tier/checkpoint is read or touched."""

from __future__ import annotations

import json
import os
import threading

import pytest
import xxhash
from test_tiers_util import local_tiers, make_dataset

from iobench.cli import main
from iobench.errors import ConfigError
from iobench.paths import contained_rel
from iobench.storage import open_backend
from iobench.tiers.config import write_tiers_file

HOSTILE = ["../victim/shard-00000.bin", "/etc/hostname", "a/../../victim/shard-00000.bin", "%2e%2e/victim/x.bin",
           "%252e%252e/victim/x.bin", "..%2fvictim%2fx.bin", "C:\\victim", "s3://bucket/x", "sub\\..\\..\\x",
           "x\x00.bin"]


@pytest.mark.parametrize("rel", HOSTILE)
def test_contained_rel_refuses_every_escape(rel):
    with pytest.raises(ConfigError, match="manifest.shards.0..path"):
        contained_rel(rel, "manifest.shards[0].path")


def test_contained_rel_normalises_harmless_forms():
    assert contained_rel("./a//b/./c.bin", "f") == "a/b/c.bin"
    assert contained_rel("a..b/c..d", "f") == "a..b/c..d"   # dots inside a name are fine


def test_backend_path_never_leaves_its_root(tmp_path):
    b = open_backend(str(tmp_path / "root"))
    assert b.path("/x/y") == str(tmp_path / "root" / "x" / "y")
    for bad in ("../x", "a/../../x", "a/.."):
        with pytest.raises(ConfigError, match="path:"):
            b.path(bad)


@pytest.fixture
def world(tmp_path):
    """A victim dataset, and an attacker dataset whose manifest can be rewritten at will."""
    victim = tmp_path / "victim"
    make_dataset(str(victim), shards=2, shard_bytes=4096, seed=1)
    attacker = tmp_path / "attacker"
    make_dataset(str(attacker), shards=2, shard_bytes=4096, seed=2)
    snapshot = {p: p.read_bytes() for p in victim.iterdir()}
    return tmp_path, victim, attacker, snapshot


def _rewrite(attacker, rel: str, victim_file=None) -> None:
    m = json.loads((attacker / "manifest.json").read_text())
    m["shards"][0]["path"] = rel
    if victim_file is not None:  # make size and checksum match the victim's bytes: only containment stops it
        data = victim_file.read_bytes()
        m["shards"][0]["bytes"] = len(data)
        m["shards"][0]["checksum"] = "xxh64:" + xxhash.xxh64(data).hexdigest()
    (attacker / "manifest.json").write_text(json.dumps(m))


def _one_line_exit_2(capsys, argv, needle: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("rel", ["../victim/shard-00000.bin", "%2e%2e/victim/shard-00000.bin", "/etc/hostname"])
def test_hostile_shard_path_refused_by_verify_load_stage_gds(world, capsys, rel):
    tmp_path, victim, attacker, snapshot = world
    _rewrite(attacker, rel, victim / "shard-00000.bin")
    field = "manifest.shards[0].path"
    _one_line_exit_2(capsys, ["verify", str(attacker)], field)
    _one_line_exit_2(capsys, ["load", str(attacker), "--steps", "2", "-B", "1", "-W", "1"], field)
    cfg = local_tiers(tmp_path, nvme_capacity="6KiB")
    tiers = write_tiers_file(cfg, str(tmp_path / "tiers.yaml"))
    for mode in ("ondemand", "prestage"):
        _one_line_exit_2(capsys, ["stage", str(attacker), "--tiers", tiers, "--mode", mode], field)
    _one_line_exit_2(capsys, ["gds", "bench", str(attacker), "--paths", "cpu", "--io-size", "4KiB",
                              "--threads", "1", "--cache", "warm", "--qd1-samples", "0"], field)
    assert {p: p.read_bytes() for p in victim.iterdir()} == snapshot   # the victim is untouched


def test_symlink_out_of_the_dataset_is_refused(world, capsys):
    tmp_path, victim, attacker, snapshot = world
    os.unlink(attacker / "shard-00000.bin")
    os.symlink(victim / "shard-00000.bin", attacker / "shard-00000.bin")
    _rewrite(attacker, "shard-00000.bin", victim / "shard-00000.bin")
    line = _one_line_exit_2(capsys, ["verify", str(attacker)], "manifest.shards[0].path")
    assert "symlink" in line
    (attacker / "sub").symlink_to(victim)
    _rewrite(attacker, "sub/shard-00001.bin", victim / "shard-00001.bin")
    _one_line_exit_2(capsys, ["verify", str(attacker)], "manifest.shards[0].path")
    # a symlink that stays inside the dataset is fine
    os.unlink(attacker / "shard-00000.bin")
    os.unlink(attacker / "sub")
    make_dataset(str(attacker), shards=2, shard_bytes=4096, seed=2)
    os.rename(attacker / "shard-00000.bin", attacker / "real.bin")
    os.symlink("real.bin", attacker / "shard-00000.bin")
    assert main(["verify", "--no-samples", str(attacker)]) == 0


def test_tier_delete_never_follows_a_symlinked_directory(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.bin").write_bytes(b"precious")
    tier = tmp_path / "tier"
    tier.mkdir()
    (tier / "ds").symlink_to(victim)
    b = open_backend(str(tier))
    with pytest.raises(ConfigError, match="symlink"):
        b.rm("ds/keep.bin")
    with pytest.raises(ConfigError, match="symlink"):
        b.write_bytes("ds/keep.bin", b"overwritten")
    assert (victim / "keep.bin").read_bytes() == b"precious"


MALFORMED = {
    "a list": ("[1, 2, 3]", "manifest: must be a JSON object"),
    "null": ("null", "manifest: must be a JSON object, got null"),
    "shards a string": (None, "manifest.shards: must be a list"),
    "negative version": (None, "manifest.version"),
    "shard bytes a string": (None, "manifest.shards[0].bytes"),
    "shard missing checksum": (None, "manifest.shards[0].checksum"),
    "not JSON": ("{nope", "is not JSON"),
    "duplicate shard": (None, "manifest.shards[1].path"),
    "seed a string": (None, "manifest.seed"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_manifest_is_exit_2_naming_the_field(tmp_path, capsys, case):
    ds = tmp_path / "ds"
    make_dataset(str(ds), shards=2, shard_bytes=1024)
    raw, needle = MALFORMED[case]
    if raw is None:
        m = json.loads((ds / "manifest.json").read_text())
        if case == "shards a string":
            m["shards"] = "nope"
        elif case == "negative version":
            m["version"] = -1
        elif case == "shard bytes a string":
            m["shards"][0]["bytes"] = "many"
        elif case == "shard missing checksum":
            del m["shards"][0]["checksum"]
        elif case == "duplicate shard":
            m["shards"][1]["path"] = m["shards"][0]["path"]
        elif case == "seed a string":
            m["seed"] = "x"
        raw = json.dumps(m)
    (ds / "manifest.json").write_text(raw)
    for argv in (["verify", str(ds)], ["load", str(ds), "--steps", "1", "-B", "1", "-W", "1"]):
        _one_line_exit_2(capsys, argv, needle)


def test_manifest_that_is_a_directory_or_fifo_never_blocks(tmp_path, capsys):
    ds = tmp_path / "ds"
    make_dataset(str(ds), shards=1, shard_bytes=1024)
    os.unlink(ds / "manifest.json")
    os.mkdir(ds / "manifest.json")
    _one_line_exit_2(capsys, ["verify", str(ds)], "is a directory")
    os.rmdir(ds / "manifest.json")
    os.mkfifo(ds / "manifest.json")
    done = []
    t = threading.Thread(target=lambda: done.append(main(["load", str(ds), "--steps", "1"])), daemon=True)
    t.start()
    t.join(20)
    assert done == [2], "load blocked on a FIFO manifest"
    capsys.readouterr()
    _one_line_exit_2(capsys, ["verify", str(ds)], "FIFO")


def test_dataset_argument_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "file.bin"
    f.write_bytes(b"x")
    _one_line_exit_2(capsys, ["verify", str(f)], "is a file")
    _one_line_exit_2(capsys, ["load", str(f), "--steps", "1"], "is a file")


def test_checkpoint_manifest_escaping_its_step_is_skipped_never_read(tmp_path, capsys):
    from checkpointing import commit_point as cp

    durable = tmp_path / "durable"
    assert main(["ckpt", "--preset", "llama3-8b", "--scale", "1e-5", "--count", "1", "--mode", "sync",
                 "--local", str(tmp_path / "local"), "--durable", str(durable)]) == 0
    capsys.readouterr()
    steps = cp.committed_steps(open_backend(str(durable)))
    mpath = durable / cp.step_dir(steps[-1]) / cp.MANIFEST
    m = json.loads(mpath.read_text())
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"s" * 10)
    m["files"][0]["path"] = "../../secret.bin"
    mpath.write_text(json.dumps(m))
    from checkpointing.restore import restore

    with pytest.raises(Exception) as ei:
        restore([("durable", open_backend(str(durable)))])
    assert "leave its root" in str(ei.value) and "ssss" not in str(ei.value)
    rc = main(["ckpt", "restore", "--durable", str(durable), "--verify"])
    assert rc == 1 and "leave its root" in capsys.readouterr().err
    assert secret.read_bytes() == b"s" * 10
