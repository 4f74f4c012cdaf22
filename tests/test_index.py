"""`iobench index`: datasets written by the peers' own writers (webdataset ShardWriter, pyarrow,
the tfrecord package, numpy, plain files) become loadable, verifiable and stageable, and
indexing changes no data file."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from iobench.cli import main
from iobench.generate import GenSpec, make_synth

IMG = {"modality": "images", "num_samples": 6, "image_width": 48, "image_height": 32, "shard_size": "6 samples"}


def _images(n):
    synth = make_synth(GenSpec.from_mapping(IMG))
    return [synth.sample(i) for i in range(n)]


def _fingerprint(root):
    """(path, size, sha256, mtime) of every file: indexing must leave them all as they were."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            if f == "manifest.json":
                continue
            st = os.stat(p)
            out[p] = (st.st_size, st.st_mtime_ns, hashlib.sha256(open(p, "rb").read()).hexdigest())
    return out


def _index_then_use(tmp_path, root, fmt, samples, *extra):
    before = _fingerprint(root)
    assert main(["index", str(root), "--format", fmt, *extra, "--json", str(tmp_path / "i.json")]) == 0
    assert _fingerprint(root) == before  # no data file touched
    m = json.loads((root / "manifest.json").read_text())
    assert m["total_samples"] == samples
    for s in m["shards"]:  # every path inside the root
        assert not s["path"].startswith("/") and ".." not in s["path"].split("/")
    # load reads every sample; verify checks sizes and counts
    assert main(["load", str(root), "--batch-size", "2", "--no-shuffle", "--json", str(tmp_path / "l.json")]) == 0
    load = json.loads((tmp_path / "l.json").read_text())
    assert load["metrics"]["samples"] == samples
    assert main(["verify", str(root), "--no-checksums"]) == 0
    return m


def test_index_webdataset_shardwriter(tmp_path):
    wds = pytest.importorskip("webdataset")
    root = tmp_path / "wds"
    root.mkdir()
    samples = _images(7)
    with wds.ShardWriter(str(root / "shard-%04d.tar"), maxcount=3) as w:
        for i, s in enumerate(samples):
            w.write({"__key__": f"s{i:05d}", "jpg": s.data, "cls": s.label})
    m = _index_then_use(tmp_path, root, "tar", 7)
    assert m["modality"] == "images" and len(m["shards"]) == 3
    # the per-sample offsets are right: a range read decodes sample 4 exactly
    from iobench.formats import get_format
    from iobench.manifest import Manifest

    man = Manifest.from_dict(m)
    shard = man.shards[1]
    reader = get_format("tar").reader(man)
    off, n = reader.sample_range(shard, 1)
    data = (root / shard.path).read_bytes()[off:off + n]
    got = reader.sample_from_range(shard, 1, data)
    assert got.data == samples[4].data and got.label == samples[4].label


def test_index_pyarrow_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    root = tmp_path / "pq"
    (root / "train").mkdir(parents=True)
    toks = [np.arange(i, i + 16, dtype=np.uint32) for i in range(10)]
    for k, part in enumerate((toks[:4], toks[4:])):
        pq.write_table(pa.table({"input_ids": pa.array([t.tolist() for t in part], pa.list_(pa.uint32()))}),
                       root / "train" / f"part-{k}.parquet", row_group_size=3)
    m = _index_then_use(tmp_path, root, "parquet", 10)
    assert m["modality"] == "tokens" and [s["path"] for s in m["shards"]] == ["train/part-0.parquet",
                                                                               "train/part-1.parquet"]


@pytest.mark.parametrize("with_index", [True, False])
def test_index_tfrecord_package(tmp_path, with_index):
    writer = pytest.importorskip("tfrecord.writer")
    root = tmp_path / "tfr"
    root.mkdir()
    samples = _images(5)
    path = root / "train-0.tfrecord"
    w = writer.TFRecordWriter(str(path))
    for s in samples:
        w.write({"image/encoded": (s.data, "byte"), "image/class/label": (s.label, "int")})
    w.close()
    if with_index:
        from tfrecord.tools.tfrecord2idx import create_index

        create_index(str(path), str(root / "train-0.tfrecord.index"))
    m = _index_then_use(tmp_path, root, "tfrecord", 5)
    assert m["modality"] == "images"
    assert (m["shards"][0].get("index_path") is not None) == with_index
    assert len(m["shards"][0]["offsets"]) == 6


def test_index_files_and_checksums(tmp_path):
    root = tmp_path / "imgs"
    (root / "a").mkdir(parents=True)
    for i, s in enumerate(_images(4)):
        (root / "a" / f"{i}.jpg").write_bytes(s.data)
    _index_then_use(tmp_path, root, "files", 4, "--checksums", "--modality", "images")
    assert main(["verify", str(root)]) == 0   # checksums recorded: plain verify checks them
    (root / "a" / "2.jpg").write_bytes(b"\xff\xd8" + b"x" * (os.path.getsize(root / "a" / "2.jpg") - 2))
    assert main(["verify", str(root)]) == 1


def test_index_refuses_bad_input_before_work(tmp_path, capsys):
    root = tmp_path / "empty"
    root.mkdir()
    assert main(["index", str(root), "--format", "tar"]) == 2
    assert "no .tar" in capsys.readouterr().err
    assert main(["index", str(root), "--format", "zip"]) == 2
    (root / "x.tar").write_bytes(b"\0" * 1024)
    (root / "manifest.json").write_text("{}")
    assert main(["index", str(root), "--format", "tar"]) == 2  # existing manifest: --force needed
    assert "exists" in capsys.readouterr().err


def test_verify_on_a_foreign_directory_says_what_to_do(tmp_path, capsys):
    (tmp_path / "x.tar").write_bytes(b"\0" * 1024)
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "iobench index" in out and "of 0 shards" not in out
