"""Interop: the peers' own readers read what we write, sample for sample, and we read what they write."""

from __future__ import annotations

import io

import numpy as np
import pytest

from iobench.formats import get_format
from iobench.generate import GenSpec, generate, make_synth
from iobench.manifest import Manifest, ShardEntry

IMG = {"modality": "images", "num_samples": 6, "image_width": 64, "image_height": 48, "shard_size": "6 samples"}
TOK = {"modality": "tokens", "num_samples": 20, "seq_len": 32, "shard_size": "20 samples"}


def _gen(tmp_path, fmt, base):
    spec = GenSpec.from_mapping({"format": fmt, **base})
    m = generate(spec, str(tmp_path / fmt), progress=False)
    return spec, m, tmp_path / fmt / m.shards[0].path


def _foreign_manifest(fmt, modality, path, samples, dtype="uint16"):
    m = Manifest(format=fmt, modality=modality, compression="none", seed=0, spec={"token_dtype": dtype},
                 shards=(ShardEntry(path=str(path), bytes=path.stat().st_size, samples=samples, checksum="none:"),))
    return m, m.shards[0]


# -- tar / webdataset -----------------------------------------------------------------------------

def test_webdataset_reads_our_tar(tmp_path):
    wds = pytest.importorskip("webdataset")
    for base in (IMG, TOK):
        spec, m, path = _gen(tmp_path / base["modality"], "tar", base)
        synth = make_synth(spec)
        got = list(wds.WebDataset(str(path), shardshuffle=False, empty_check=False))
        assert len(got) == spec.num_samples
        for i, s in enumerate(got):
            want = synth.sample(i)
            assert s["__key__"] == f"{i:09d}"
            if spec.modality == "images":
                assert s["jpg"] == want.data and int(s["cls"]) == want.label
            else:
                np.testing.assert_array_equal(np.load(io.BytesIO(s["npy"])), want.data)
        decoded = list(wds.WebDataset(str(path), shardshuffle=False, empty_check=False).decode())
        if spec.modality == "tokens":
            np.testing.assert_array_equal(decoded[3]["npy"], synth.tokens(3))
        else:
            assert decoded[3]["cls"] == synth.sample(3).label


def test_we_read_webdataset_tar(tmp_path):
    wds = pytest.importorskip("webdataset")
    synth = make_synth(GenSpec.from_mapping(IMG))
    path = tmp_path / "peer.tar"
    with wds.TarWriter(str(path)) as w:
        for i in range(5):
            s = synth.sample(i)
            w.write({"__key__": f"sample{i:04d}", "jpg": s.data, "cls": s.label})
    m, shard = _foreign_manifest("tar", "images", path, 5)
    got = list(get_format("tar").reader(m).iter_samples(path.read_bytes(), shard))
    assert [(g.data, g.label) for g in got] == [(synth.sample(i).data, synth.sample(i).label) for i in range(5)]


# -- parquet / pyarrow ------------------------------------------------------------------------------

def test_pyarrow_reads_our_parquet(tmp_path):
    import pyarrow.parquet as pq

    for base in (IMG, TOK):
        spec, m, path = _gen(tmp_path / base["modality"], "parquet", base)
        synth = make_synth(spec)
        table = pq.read_table(path)
        assert table.num_rows == spec.num_samples
        if spec.modality == "images":
            assert table.column("image").to_pylist() == [synth.sample(i).data for i in range(spec.num_samples)]
            assert table.column("label").to_pylist() == [synth.sample(i).label for i in range(spec.num_samples)]
        else:
            t = table.schema.field("tokens").type
            assert str(t).startswith("list<") and str(t.value_type) == "uint16"
            rows = table.column("tokens").to_pylist()
            for i, row in enumerate(rows):
                assert row == synth.tokens(i).tolist()


def test_we_read_pyarrow_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    toks = [np.arange(i, i + 10, dtype=np.uint32) for i in range(7)]
    path = tmp_path / "peer.parquet"
    pq.write_table(pa.table({"tokens": pa.array([t.tolist() for t in toks], pa.list_(pa.uint32()))}), path,
                   row_group_size=3)
    m, shard = _foreign_manifest("parquet", "tokens", path, 7, "uint32")
    got = list(get_format("parquet").reader(m).iter_samples(path.read_bytes(), shard))
    assert [g.data.tolist() for g in got] == [t.tolist() for t in toks]


# -- tfrecord / the PyPI tfrecord package ------------------------------------------------------------

def test_tfrecord_package_reads_ours_with_our_index(tmp_path):
    reader = pytest.importorskip("tfrecord.reader")
    spec, m, path = _gen(tmp_path / "img", "tfrecord", IMG)
    synth = make_synth(spec)
    index = str(path) + ".index"
    assert m.shards[0].index_path == m.shards[0].path + ".index"
    got = list(reader.tfrecord_loader(str(path), index, {"image/encoded": "byte", "image/class/label": "int"},
                                      shard=(0, 1)))
    assert len(got) == spec.num_samples
    for i, g in enumerate(got):
        assert bytes(g["image/encoded"]) == synth.sample(i).data
        assert int(g["image/class/label"][0]) == synth.sample(i).label
    spec, m, path = _gen(tmp_path / "tok", "tfrecord", TOK)
    got = list(reader.tfrecord_loader(str(path), None, {"tokens": "byte"}))
    np.testing.assert_array_equal(np.frombuffer(bytes(got[4]["tokens"]), "<u2"), make_synth(spec).tokens(4))


def test_we_read_tfrecord_package_output(tmp_path):
    writer = pytest.importorskip("tfrecord.writer")
    synth = make_synth(GenSpec.from_mapping(IMG))
    path = tmp_path / "peer.tfrecord"
    w = writer.TFRecordWriter(str(path))
    for i in range(4):
        s = synth.sample(i)
        w.write({"image/encoded": (s.data, "byte"), "image/class/label": (s.label, "int"),
                 "extra": ([0.5, 1.5], "float")})
    w.close()
    m, shard = _foreign_manifest("tfrecord", "images", path, 4)
    got = list(get_format("tfrecord").reader(m).iter_samples(path.read_bytes(), shard))
    assert [(g.data, g.label) for g in got] == [(synth.sample(i).data, synth.sample(i).label) for i in range(4)]
    w = writer.TFRecordWriter(str(tmp_path / "t.tfrecord"))
    w.write({"input_ids": ([1, 300, 70000, 5], "int")})
    w.close()
    m, shard = _foreign_manifest("tfrecord", "tokens", tmp_path / "t.tfrecord", 1, "uint32")
    got = list(get_format("tfrecord").reader(m).iter_samples((tmp_path / "t.tfrecord").read_bytes(), shard))
    assert got[0].data.tolist() == [1, 300, 70000, 5]


# -- raw / numpy.memmap -------------------------------------------------------------------------------

def test_numpy_memmap_reads_raw_tokens(tmp_path):
    spec, m, path = _gen(tmp_path, "raw", {**TOK, "vocab_size": 100_000})
    arr = np.memmap(path, dtype="<u4", mode="r", offset=64, shape=(spec.num_samples, spec.seq_len))
    synth = make_synth(spec)
    for i in range(spec.num_samples):
        np.testing.assert_array_equal(arr[i], synth.tokens(i))


def test_we_read_a_numpy_written_token_file(tmp_path):
    """A header written by hand plus ndarray.tofile() is a valid raw shard."""
    import struct

    toks = np.arange(40, dtype="<u2").reshape(4, 10)
    path = tmp_path / "np.bin"
    header = struct.pack("<8sHBBB3xIIQ", b"IOBTOKS\0", 1, 2, ord("<"), 0, 10, 1000, toks.size)
    with open(path, "wb") as f:
        f.write(header + b"\0" * (64 - len(header)))
        toks.tofile(f)
    m, shard = _foreign_manifest("raw", "tokens", path, 4)
    got = list(get_format("raw").reader(m).iter_samples(path.read_bytes(), shard))
    assert [g.data.tolist() for g in got] == toks.tolist()
