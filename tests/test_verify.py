"""`verify`: whole datasets pass; corruption, truncation, missing shards and missing manifests are named."""

from __future__ import annotations

import json

import pytest

from iobench.cli import main
from iobench.errors import ConfigError
from iobench.generate import GenSpec, generate
from iobench.manifest import MANIFEST_NAME
from iobench.verify import verify_dataset


@pytest.fixture(params=["raw", "tar", "tfrecord", "parquet"])
def dataset(request, tmp_path):
    spec = GenSpec.from_mapping({"format": request.param, "modality": "images", "num_samples": 9,
                                 "shard_size": "3 samples", "image_width": 96, "image_height": 64})
    m = generate(spec, str(tmp_path / "ds"), progress=False)
    return tmp_path / "ds", m


def test_whole_dataset_verifies(dataset):
    root, m = dataset
    rep = verify_dataset(str(root))
    assert rep.ok and rep.shards_checked == 3 and rep.samples_checked == 9 and rep.bytes_checked == m.total_bytes
    assert main(["verify", str(root)]) == 0


def test_flipped_byte_names_first_bad_shard_and_offset(dataset, tmp_path, capsys):
    root, m = dataset
    shard = m.shards[1]
    path = root / shard.path
    data = bytearray(path.read_bytes())
    at = shard.bytes // 2
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))
    rep = verify_dataset(str(root))
    assert not rep.ok
    assert rep.first_bad.shard == shard.path and rep.first_bad.problem == "checksum"
    assert rep.first_bad.offset == at
    out = tmp_path / "v.json"
    assert main(["verify", str(root), "--json", str(out)]) == 1
    assert f"{shard.path} at offset {at}" in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["command"] == "verify" and res["metrics"]["ok"] is False
    assert res["metrics"]["first_bad"]["offset"] == at


def test_truncated_and_missing_shards(dataset):
    root, m = dataset
    (root / m.shards[2].path).write_bytes((root / m.shards[2].path).read_bytes()[:100])
    (root / m.shards[0].path).unlink()
    rep = verify_dataset(str(root))
    assert [p.problem for p in rep.problems] == ["missing", "size"]
    assert rep.problems[1].offset == 100


def test_missing_manifest_is_an_incomplete_dataset(dataset):
    root, _ = dataset
    (root / MANIFEST_NAME).unlink()
    rep = verify_dataset(str(root))
    assert not rep.ok and rep.first_bad.problem == "incomplete"
    assert main(["verify", str(root)]) == 1


def test_nothing_there_is_bad_input(tmp_path):
    with pytest.raises(ConfigError):
        verify_dataset(str(tmp_path / "nope"))
    assert main(["verify", str(tmp_path / "nope")]) == 2


def test_sample_count_mismatch_is_caught(tmp_path):
    """A manifest that lies about the sample count (checksums intact) fails the count check."""
    spec = GenSpec.from_mapping({"format": "tar", "modality": "tokens", "num_samples": 10, "seq_len": 8})
    generate(spec, str(tmp_path), progress=False)
    man = json.loads((tmp_path / MANIFEST_NAME).read_text())
    man["shards"][0]["samples"] = 11
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(man))
    rep = verify_dataset(str(tmp_path))
    assert rep.first_bad.problem == "samples"


def test_verify_on_s3(s3_server, s3_prefix):
    opts = {"key": s3_server.access_key, "secret": s3_server.secret_key}
    spec = GenSpec.from_mapping({"format": "tfrecord", "modality": "tokens", "num_samples": 50, "seq_len": 32,
                                 "shard_size": "20 samples"})
    m = generate(spec, s3_prefix, endpoint_url=s3_server.endpoint_url, storage_options=opts, progress=False)
    assert verify_dataset(s3_prefix, endpoint_url=s3_server.endpoint_url, storage_options=opts).ok
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    key = s3_prefix[len("s3://"):] + "/" + m.shards[1].path
    data = bytearray(fs.cat_file(key))
    data[40] ^= 1
    fs.pipe_file(key, bytes(data))
    rep = verify_dataset(s3_prefix, endpoint_url=s3_server.endpoint_url, storage_options=opts)
    assert rep.first_bad.shard == m.shards[1].path and rep.first_bad.offset == 40


def test_missing_side_index_is_reported(tmp_path):
    spec = GenSpec.from_mapping({"format": "tfrecord", "modality": "tokens", "num_samples": 10, "seq_len": 8,
                                 "shard_size": "5 samples"})
    m = generate(spec, str(tmp_path), progress=False)
    (tmp_path / m.shards[1].index_path).unlink()
    rep = verify_dataset(str(tmp_path))
    assert rep.first_bad.shard == m.shards[1].path and "index" in rep.first_bad.detail


def test_files_that_look_like_shards_but_are_not_listed_are_a_warning(tmp_path, caplog):
    import logging
    import shutil

    spec = GenSpec.from_mapping({"format": "tfrecord", "modality": "tokens", "num_samples": 10, "seq_len": 8,
                                 "shard_size": "5 samples"})
    m = generate(spec, str(tmp_path), progress=False)
    shutil.copy(tmp_path / m.shards[0].path, tmp_path / "shard-000007.tfrecord")
    shutil.copy(tmp_path / m.shards[0].index_path, tmp_path / "shard-000007.tfrecord.index")
    (tmp_path / "notes.txt").write_text("not a shard")
    (tmp_path / ".shard-000001.tfrecord.abcd1234.tmp").write_bytes(b"hidden temp")
    (tmp_path / "other").mkdir()
    generate(spec, str(tmp_path / "other"), progress=False)    # a nested dataset is not ours to judge
    with caplog.at_level(logging.WARNING, logger="iobench.verify"):
        rep = verify_dataset(str(tmp_path))
    assert rep.ok and rep.stray_files == ["shard-000007.tfrecord", "shard-000007.tfrecord.index"]
    assert "not in the manifest" in rep.warnings[0] and "shard-000007.tfrecord" in caplog.text
    assert main(["verify", str(tmp_path)]) == 0
    assert verify_dataset(str(tmp_path / "other")).stray_files == []
