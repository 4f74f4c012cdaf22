"""`iobench gen` / `iobench verify` on the command line: flags, workloads, --set, results, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from iobench.cli import main
from iobench.manifest import MANIFEST_NAME


def _gen(*args):
    return main(["gen", "--no-progress", *args])


def test_gen_flags_write_dataset_and_results(tmp_path):
    out, res = tmp_path / "ds", tmp_path / "gen.json"
    assert _gen("--format", "tfrecord", "--modality", "tokens", "--num-samples", "100", "--shard-size", "30 samples",
                "--seq-len", "64", "--compression", "zstd:5", "--seed", "3", "--workers", "2", "--checksum", "crc32c",
                "--out", str(out), "--json", str(res)) == 0
    man = json.loads((out / MANIFEST_NAME).read_text())
    assert man["version"] == 1 and man["format"] == "tfrecord" and man["compression"] == "zstd:5"
    assert [s["samples"] for s in man["shards"]] == [30, 30, 30, 10]
    assert all(s["checksum"].startswith("crc32c:") for s in man["shards"])
    assert man["spec"]["seed"] == 3 and man["spec"]["token_dtype"] == "uint16"
    r = json.loads(res.read_text())
    assert r["schema_version"] == 1 and r["command"] == "gen"
    assert r["metrics"]["bytes"] == man["total_bytes"] and r["metrics"]["samples"] == 100
    assert r["metrics"]["throughput"]["bytes_per_s"] > 0
    assert main(["verify", str(out)]) == 0


def test_workload_then_flags_then_set(tmp_path):
    out = tmp_path / "ds"
    assert _gen("--workload", "llm-tokens", "--num-samples", "40", "--set", "gen.seq_len=128",
                "--set", "gen.shard_size=16 samples", "--out", str(out)) == 0
    man = json.loads((out / MANIFEST_NAME).read_text())
    assert man["spec"]["distribution"] == "zipf" and man["spec"]["seq_len"] == 128
    assert man["total_samples"] == 40 and len(man["shards"]) == 3


def test_imagenet_workload_is_valid():
    from iobench.config import load_workload
    from iobench.generate import GenSpec

    spec = GenSpec.from_mapping(load_workload("imagenet-like")["gen"])
    assert spec.format == "tar" and spec.modality == "images"


@pytest.mark.parametrize("args,needle", [
    (["--shard-size", "0"], "gen.shard_size"),
    (["--shard-size=-4MiB"], "gen.shard_size"),
    (["--num-samples", "0"], "gen.num_samples"),
    (["--format", "zarr"], "gen.format"),
    (["--modality", "video"], "gen.modality"),
    (["--workload", "llm-tokenz"], "did you mean 'llm-tokens'"),
    (["--set", "gen.seqlen=5"], "did you mean 'seq_len'"),
    (["--set", "load.x=1"], "--set"),
    (["--compression", "brotli"], "gen.compression"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, needle):
    assert _gen(*args, "--out", str(tmp_path / "x")) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_unwritable_path_exits_2(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert _gen("--num-samples", "4", "--out", str(tmp_path / "file" / "ds")) == 2
    assert "--out" in capsys.readouterr().err


def test_unreachable_endpoint_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    assert _gen("--num-samples", "4", "--out", "s3://nobucket/ds", "--endpoint-url", "http://127.0.0.1:9") == 2
    err = capsys.readouterr().err
    assert "cannot reach" in err and "y" not in err.split("cannot reach")[0][-3:]


def test_missing_optional_package_exits_2_with_install_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.delitem(sys.modules, "iobench.formats.parquet", raising=False)
    assert _gen("--format", "parquet", "--num-samples", "4", "--out", str(tmp_path / "x")) == 2
    assert "pip install 'iobench[parquet]'" in capsys.readouterr().err


def test_gen_and_verify_on_s3_from_environment(s3_env, s3_prefix, capsys):
    url = s3_prefix + "/img"
    assert _gen("--format", "parquet", "--modality", "images", "--num-samples", "6", "--shard-size", "2 samples",
                "--out", url) == 0
    assert main(["verify", url]) == 0
    assert "OK: 3 shards, 6 samples" in capsys.readouterr().out


def test_disk_full_on_the_command_line_is_one_clear_line(tmp_path):
    import os
    import shutil

    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount is not permitted here: {r.stderr.strip()}")
    try:
        # tar members of 1 KiB for 32 payload bytes: past the up-front space check, full while writing
        p = subprocess.run([sys.executable, "-m", "iobench.cli", "gen", "--no-progress", "--num-samples", "2000",
                            "--format", "tar", "--seq-len", "16", "--shard-size", "256KiB", "--out", str(mnt / "ds")],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 1
        assert "no space left" in p.stderr and "no manifest written" in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
        assert not (mnt / "ds" / MANIFEST_NAME).exists()
        # the directory this run made is removed when nothing is left in it; else verify refuses it
        assert not (mnt / "ds").exists() or subprocess.run(
            [sys.executable, "-m", "iobench.cli", "verify", str(mnt / "ds")], capture_output=True,
            timeout=120).returncode == 1
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_dataset_larger_than_the_free_space_is_refused_before_writing(tmp_path):
    p = subprocess.run([sys.executable, "-m", "iobench.cli", "gen", "--no-progress", "--num-samples", "1e11",
                        "--out", str(tmp_path / "ds")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--num-samples" in p.stderr and "free" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ds").exists()
