"""`load --verify-checksums`: each shard's checksum is checked as it streams in; a flipped byte fails
the run (exit 1, the shard named) instead of being delivered; the cost is in the results."""

from __future__ import annotations

import json

import pytest

from iobench.cli import main
from iobench.generate import GenSpec, generate


@pytest.fixture(scope="module", params=["tar", "raw"])
def ds(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("verify") / request.param
    m = generate(GenSpec.from_mapping({"format": request.param, "num_samples": 64, "seq_len": 32,
                                       "shard_size": "16 samples"}), str(root), progress=False)
    return root, m


@pytest.mark.parametrize("access", ["stream", "block", "map"])
def test_clean_dataset_verifies_and_reports_cost(ds, tmp_path, access):
    root, m = ds
    out = tmp_path / "r.json"
    assert main(["load", str(root), "-W", "1", "-B", "8", "--epochs", "1", "--no-shuffle", "--verify-checksums",
                 "--set", f"load.access={access}", "--json", str(out)]) == 0
    v = json.loads(out.read_text())["metrics"]["verify_checksums"]
    assert v["shards"] >= len(m.shards) and v["bytes"] >= m.total_bytes and v["seconds"] > 0


@pytest.mark.parametrize("access", ["stream", "block", "map"])
def test_flipped_byte_fails_the_run_naming_the_shard(ds, tmp_path, capsys, access):
    import shutil

    root, m = ds
    if m.format != "raw":
        pytest.skip("the flip must land in token bytes, which raw shards lay out plainly")
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    p = bad / m.shards[2].path
    data = bytearray(p.read_bytes())
    data[64 + 100] ^= 0x01       # a token byte past the 64-byte header: the shard still parses
    p.write_bytes(bytes(data))
    assert main(["load", str(bad), "-W", "1", "-B", "8", "--epochs", "1", "--no-shuffle",
                 "--set", f"load.access={access}"]) == 0          # without the flag: delivered silently
    capsys.readouterr()
    rc = main(["load", str(bad), "-W", "1", "-B", "8", "--epochs", "1", "--no-shuffle", "--verify-checksums",
               "--set", f"load.access={access}"])
    err = capsys.readouterr().err
    assert rc == 1 and m.shards[2].path in err and "checksum" in err, err
