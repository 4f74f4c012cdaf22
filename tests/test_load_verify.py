"""`load --verify-checksums`: every shard the run reads has its checksum checked, under every access
pattern, worker count and run length (a run stopped inside a shard reads the rest of it once); a
flipped byte fails the run (exit 1, the shard named) instead of being delivered; a shard whose size is
not the manifest's (bytes appended, which a ranged read never sees) fails before the run, as
`iobench verify` does; the cost is in the results."""

from __future__ import annotations

import json
import shutil

import pytest

from iobench.cli import main
from iobench.generate import GenSpec, generate

ACCESS = ["stream", "block", "map"]
RUNS = {"epoch": ["--epochs", "1"], "partial": ["--steps", "3"]}


@pytest.fixture(scope="module", params=["tar", "raw", "parquet", "tfrecord"])
def ds(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("verify") / request.param
    m = generate(GenSpec.from_mapping({"format": request.param, "num_samples": 64, "seq_len": 32,
                                       "shard_size": "16 samples"}), str(root), progress=False)
    return root, m


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify-raw") / "raw"
    m = generate(GenSpec.from_mapping({"format": "raw", "num_samples": 64, "seq_len": 32,
                                       "shard_size": "16 samples"}), str(root), progress=False)
    return root, m


def _load(root, access, workers, run, *extra) -> list[str]:
    return ["load", str(root), "-W", str(workers), "-B", "8", *RUNS[run], "--set", f"load.access={access}", *extra]


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("access", ACCESS)
def test_clean_dataset_verifies_every_shard_read(ds, tmp_path, access, workers, run):
    root, m = ds
    if access == "map" and m.format == "parquet":
        pytest.skip("parquet has no per-sample ranges: map is refused for it")
    out = tmp_path / "r.json"
    assert main(_load(root, access, workers, run, "--verify-checksums", "--json", str(out))) == 0
    v = json.loads(out.read_text())["metrics"]["verify_checksums"]
    assert v is not None and v["unfinished"] == 0 and v["seconds"] > 0
    if run == "epoch":
        assert v["shards"] >= len(m.shards) and v["bytes"] >= m.total_bytes
    else:   # a shard the run stopped in is read to its end and checked too
        assert v["shards"] >= 1 and v["bytes"] >= min(s.bytes for s in m.shards)


def _flip_every_shard(root, m, dest):
    shutil.copytree(root, dest)
    for sh in m.shards:
        p = dest / sh.path
        data = bytearray(p.read_bytes())
        data[64 + 100] ^= 0x01       # a token byte past the 64-byte header: the shard still parses
        p.write_bytes(bytes(data))


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("access", ACCESS)
def test_flipped_byte_fails_the_run_naming_the_shard(raw, tmp_path, capsys, access, workers, run):
    root, m = raw
    bad = tmp_path / "bad"
    _flip_every_shard(root, m, bad)   # whichever shard the run reads first, it is corrupt
    assert main(_load(bad, access, workers, run)) == 0          # without the flag: delivered silently
    capsys.readouterr()
    rc = main(_load(bad, access, workers, run, "--verify-checksums"))
    err = capsys.readouterr().err
    assert rc == 1 and "checksum" in err and any(s.path in err for s in m.shards), err


@pytest.mark.parametrize("access", ACCESS)
def test_bytes_appended_to_a_shard_fail_before_the_run(raw, tmp_path, capsys, access):
    root, m = raw
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    with open(bad / m.shards[1].path, "ab") as f:
        f.write(b"appended")
    assert main(_load(bad, access, 1, "epoch")) == 0
    capsys.readouterr()
    rc = main(_load(bad, access, 1, "epoch", "--verify-checksums"))
    err = capsys.readouterr().err
    assert rc == 1 and m.shards[1].path in err and "manifest says" in err, err
