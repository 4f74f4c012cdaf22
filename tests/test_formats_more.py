"""The formats users bring from other tools: numpy ``.npy``, Megatron-LM ``.bin``/``.idx``, HDF5
(h5py), HF ``save_to_disk`` Arrow, ImageFolder trees, opaque tars, brace-range and one-shard
URLs.  Each is written by the upstream writer where there is one, indexed with no flags,
loaded by every access pattern (every delivered sample's bytes and id checked against the
source), and verified; and what ``iobench gen`` writes in these formats is read back by the
upstream readers."""

from __future__ import annotations

import io
import json
import struct
import tarfile

import numpy as np
import pytest

from iobench.cli import main
from iobench.errors import ConfigError
from iobench.formats.megatron import decode_index, encode_index
from iobench.generate import GenSpec, generate, make_synth
from iobench.index import IndexOptions, expand_braces, index_dataset, open_dataset, resolve_dataset_url
from iobench.loader.core import LoadConfig, run_load
from iobench.storage import open_backend

ACCESSES = ("map", "stream", "block")


def _delivered(url: str, access: str, workers: int = 1, batch_size: int = 4) -> dict[int, tuple[bytes, int | None]]:
    """{sample id: (its bytes, its label)} for every sample one epoch of ``load`` delivers."""
    seen: dict[int, tuple[bytes, int | None]] = {}

    def deliver(batch):
        ids = batch.indices.tolist()
        labels = batch.labels.tolist() if batch.labels is not None else [None] * len(ids)
        if batch.layout == "array":
            rows = [np.ascontiguousarray(r).tobytes() for r in np.asarray(batch.data)]
        else:
            raw = np.asarray(batch.data).tobytes()
            rows = [raw[int(a):int(b)] for a, b in zip(batch.offsets[:-1], batch.offsets[1:])]
        for i, r, lab in zip(ids, rows, labels):
            assert i not in seen, f"sample {i} delivered twice"
            seen[i] = (r, lab)
        return batch

    m = open_dataset(url)[1]
    run = run_load(LoadConfig(dataset=url, access=access, batch_size=min(batch_size, m.total_samples),
                              workers=workers, shuffle=True, shuffle_buffer=0, epochs=1, drop_last=False,
                              verify_checksums=False, monitor_interval_s=1.0), deliver=deliver)
    assert run.metrics["samples"] == len(seen)
    return seen


def _check_loads(url: str, want: list[bytes], labels: list | None = None, accesses=ACCESSES) -> None:
    for access in accesses:
        got = _delivered(url, access)
        assert sorted(got) == list(range(len(want))), access
        for i, w in enumerate(want):
            assert got[i][0] == w, f"{access}: sample {i}"
            if labels is not None:
                assert got[i][1] == labels[i], f"{access}: label of sample {i}"


def _index(root, *flags) -> dict:
    assert main(["index", str(root), *flags]) == 0
    assert main(["verify", str(root), "--no-checksums"]) == 0
    return json.loads((root / "manifest.json").read_text())


# -- npy -------------------------------------------------------------------------------------------

def test_np_save_token_rows_index_without_flags_and_load_by_offset(tmp_path):
    root = tmp_path / "npy"
    root.mkdir()
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 60000, (n, 24), dtype=np.uint16) for n in (9, 7, 11)]
    for k, a in enumerate(arrays):
        np.save(root / f"part-{k:02d}.npy", a)
    m = _index(root)
    assert (m["format"], m["modality"], m["total_samples"]) == ("npy", "tokens", 27)
    assert m["shards"][0]["offsets"][0] == 128      # np.save's header: rows start right after it
    want = [r.tobytes() for a in arrays for r in a]
    _check_loads(str(root), want)


def test_np_save_of_other_arrays_is_one_record_per_file(tmp_path):
    root = tmp_path / "vol"
    root.mkdir()
    rng = np.random.default_rng(2)
    vols = [rng.random((3, 4, 5), dtype=np.float32) for _ in range(5)]     # unet3d-style volumes
    for k, v in enumerate(vols):
        np.save(root / f"case_{k:03d}.npy", v)
    m = _index(root)
    assert (m["modality"], m["total_samples"]) == ("records", 5)
    _check_loads(str(root), [v.tobytes() for v in vols])


def test_gen_npy_is_read_by_np_load(tmp_path):
    spec = GenSpec.from_mapping({"format": "npy", "num_samples": 50, "seq_len": 16, "vocab_size": 70000,
                                 "shard_size": "20 samples", "fsync": False})
    m = generate(spec, str(tmp_path / "g"), progress=False)
    synth = make_synth(spec)
    rows = np.concatenate([np.load(tmp_path / "g" / s.path) for s in m.shards])
    assert rows.dtype == np.uint32 and rows.shape == (50, 16)
    for i in (0, 19, 20, 49):
        np.testing.assert_array_equal(rows[i], synth.sample(i).data)
    assert main(["verify", str(tmp_path / "g")]) == 0
    _check_loads(str(tmp_path / "g"), [r.tobytes() for r in rows])


def test_npy_truncated_file_is_refused_naming_it(tmp_path, capsys):
    root = tmp_path / "bad"
    root.mkdir()
    np.save(root / "a.npy", np.zeros((4, 8), dtype=np.uint16))
    (root / "a.npy").write_bytes((root / "a.npy").read_bytes()[:-3])
    assert main(["index", str(root)]) == 1
    assert "a.npy" in capsys.readouterr().err


# -- megatron --------------------------------------------------------------------------------------

def _megatron_reference_idx(lengths, dtype_code: int, itemsize: int, documents) -> bytes:
    """The .idx as Megatron-LM's _IndexWriter lays it out, field by field from the published layout."""
    out = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", dtype_code)
    out += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(documents))
    ptr, ptrs = 0, []
    for n in lengths:
        ptrs.append(ptr)
        ptr += n * itemsize
    out += b"".join(struct.pack("<i", n) for n in lengths)
    out += b"".join(struct.pack("<q", p) for p in ptrs)
    out += b"".join(struct.pack("<q", d) for d in documents)
    return out


def test_megatron_index_matches_the_published_layout_byte_for_byte():
    lengths = [5, 1, 7, 3]
    assert encode_index(lengths, np.dtype("<u2")) == _megatron_reference_idx(lengths, 8, 2, [0, 1, 2, 3, 4])
    assert encode_index(lengths, np.dtype("<i4"), documents=[0, 2, 4]) == \
        _megatron_reference_idx(lengths, 4, 4, [0, 2, 4])
    idx = decode_index(_megatron_reference_idx(lengths, 8, 2, [0, 2, 4]), "x.idx")
    assert idx.lengths.tolist() == lengths and idx.pointers.tolist() == [0, 10, 12, 26]
    assert idx.documents.tolist() == [0, 2, 4] and idx.dtype == np.dtype("<u2")


def _megatron_dataset(root, docs_per_file, dtype=np.uint16, code=8):
    """Files as Megatron's preprocess_data.py leaves them: tokens back to back, .idx beside."""
    root.mkdir()
    rng = np.random.default_rng(3)
    want = []
    for k, n in enumerate(docs_per_file):
        docs = [rng.integers(0, 30000, int(rng.integers(1, 40)), dtype=dtype) for _ in range(n)]
        (root / f"corpus_{k}_text_document.bin").write_bytes(b"".join(d.tobytes() for d in docs))
        (root / f"corpus_{k}_text_document.idx").write_bytes(
            _megatron_reference_idx([len(d) for d in docs], code, np.dtype(dtype).itemsize, list(range(n + 1))))
        want.extend(docs)
    return want


def test_megatron_documents_index_and_load_by_pointer(tmp_path):
    root = tmp_path / "meg"
    docs = _megatron_dataset(root, (6, 9))
    m = _index(root)
    assert (m["format"], m["total_samples"], m["spec"]["documents"]) == ("megatron", 15, 15)
    assert m["shards"][0]["index_path"] == "corpus_0_text_document.idx"
    _check_loads(str(root), [d.tobytes() for d in docs])


def test_megatron_gpt_windows_span_documents(tmp_path):
    root = tmp_path / "win"
    docs = _megatron_dataset(root, (8,), dtype=np.int32, code=4)
    seq = 10
    m = _index(root, "--seq-len", str(seq))
    stream = np.concatenate(docs)
    n = (len(stream) - 1) // seq
    assert m["total_samples"] == n and m["spec"]["megatron_window"] == seq
    want = [stream[k * seq:k * seq + seq + 1].tobytes() for k in range(n)]   # GPTDataset: seq_len + 1 tokens
    _check_loads(str(root), want)


def test_gen_megatron_is_the_layout_megatron_reads(tmp_path):
    spec = GenSpec.from_mapping({"format": "megatron", "num_samples": 30, "seq_len": 12, "vocab_size": 50257,
                                 "shard_size": "16 samples", "fsync": False})
    m = generate(spec, str(tmp_path / "g"), progress=False)
    synth = make_synth(spec)
    assert [s.index_path for s in m.shards] == ["shard-000000.idx", "shard-000001.idx"]
    for s in m.shards:
        raw = (tmp_path / "g" / s.index_path).read_bytes()
        assert raw == _megatron_reference_idx([12] * s.samples, 8, 2, list(range(s.samples + 1)))
        idx = decode_index(raw, s.index_path)
        tokens = np.frombuffer((tmp_path / "g" / s.path).read_bytes(), dtype=np.uint16)
        for j in range(s.samples):   # what MMapIndexedDataset[i] returns: pointer + length
            p, n = int(idx.pointers[j]), int(idx.lengths[j])
            np.testing.assert_array_equal(tokens[p // 2:p // 2 + n], synth.sample(s.first_sample + j).data)
    assert main(["verify", str(tmp_path / "g")]) == 0
    _check_loads(str(tmp_path / "g"), [synth.sample(i).data.astype("<u2").tobytes() for i in range(30)])


def test_megatron_idx_that_does_not_tile_the_bin_is_refused(tmp_path, capsys):
    root = tmp_path / "bad"
    _megatron_dataset(root, (4,))
    b = root / "corpus_0_text_document.bin"
    b.write_bytes(b.read_bytes() + b"\0\0")
    assert main(["index", str(root)]) == 1
    assert "corpus_0_text_document" in capsys.readouterr().err


# -- tar with arbitrary keys, ImageFolder ----------------------------------------------------------

def _tar(path, members):
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))


def test_tar_with_arbitrary_member_keys_indexes_as_opaque_records(tmp_path):
    root = tmp_path / "opaque"
    root.mkdir()
    want, labels = [], []
    for k in range(2):
        members = []
        for j in range(5):
            key = f"s{k}_{j}"
            a, b = bytes([k, j]) * (j + 3), f"meta-{k}-{j}".encode()
            members += [(f"{key}.feat.bin", a), (f"{key}.json", b), (f"{key}.cls", str(j).encode())]
            want.append(a + b)
            labels.append(j)
        _tar(root / f"part-{k}.tar", members)
    m = _index(root)
    assert (m["format"], m["modality"], m["total_samples"]) == ("tar", "records", 10)
    _check_loads(str(root), want, labels)


def test_image_folder_labels_come_from_folder_names(tmp_path):
    pytest.importorskip("PIL")
    root = tmp_path / "folder"
    synth = make_synth(GenSpec.from_mapping({"modality": "images", "num_samples": 6, "image_width": 32,
                                             "image_height": 24}))
    classes = ["cat", "dog", "zebra"]
    want, labels = [], []
    for i in range(6):
        cls = classes[i % 3]
        (root / cls).mkdir(parents=True, exist_ok=True)
        data = synth.sample(i).data
        (root / cls / f"img_{i}.jpg").write_bytes(data)
    for rel in sorted(str(p.relative_to(root)) for p in root.rglob("*.jpg")):   # the index's order
        want.append((root / rel).read_bytes())
        labels.append(classes.index(rel.split("/")[0]))
    m = _index(root)
    assert (m["format"], m["modality"], m["spec"]["classes"]) == ("files", "images", classes)
    _check_loads(str(root), want, labels, accesses=("map", "stream"))


# -- URLs naming shards ----------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,names", [
    ("train-{000000..000003}.tar", [f"train-{i:06d}.tar" for i in range(4)]),
    ("s-{8..11}.tar", ["s-8.tar", "s-9.tar", "s-10.tar", "s-11.tar"]),
    ("s-{0..6..3}.tar", ["s-0.tar", "s-3.tar", "s-6.tar"]),
    ("{a,b}-{1,2}.npy", ["a-1.npy", "a-2.npy", "b-1.npy", "b-2.npy"]),
    ("x{a,{b,c}}.tar", ["xa.tar", "xb.tar", "xc.tar"]),
    ("plain.tar", ["plain.tar"]),
])
def test_brace_expansion_as_webdataset_writes_it(pattern, names):
    assert expand_braces(pattern) == names


@pytest.mark.parametrize("bad", ["a-{0..3.tar", "a-}0.tar", "a-{0..3..0}.tar"])
def test_bad_brace_patterns_are_usage_errors(bad):
    with pytest.raises(ConfigError):
        expand_braces(bad)


def test_brace_range_and_single_shard_urls_index_only_those_files(tmp_path):
    root = tmp_path / "wds"
    root.mkdir()
    for k in range(4):
        _tar(root / f"train-{k:06d}.tar", [(f"k{k}_{j}.npy", _npy_bytes(np.full(6, k * 10 + j, np.uint16)))
                                           for j in range(3)])
    ref = resolve_dataset_url(str(root) + "/train-{000001..000002}.tar")
    assert ref.root == str(root) and ref.only == ("train-000001.tar", "train-000002.tar")
    m = index_dataset(open_backend(ref.root), IndexOptions(), only=ref.only)
    assert [s.path for s in m.shards] == list(ref.only) and m.total_samples == 6 and m.modality == "tokens"
    one = resolve_dataset_url(str(root / "train-000003.tar"))
    assert one.only == ("train-000003.tar",)
    assert main(["index", str(root) + "/train-{000000..000001}.tar"]) == 0
    assert json.loads((root / "manifest.json").read_text())["total_samples"] == 6
    assert main(["index", str(root) + "/train-{000000..000009}.tar", "--force"]) == 2   # names missing shards


def _npy_bytes(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


# -- hdf5 ------------------------------------------------------------------------------------------

def _dlio_hdf5(root, files: int, samples: int, chunks=None, compression=None) -> list[bytes]:
    """What DLIO's hdf5 generator writes: 'records' (samples, d1, d2) uint8 and 'labels' zeros."""
    h5py = pytest.importorskip("h5py")
    root.mkdir()
    rng = np.random.default_rng(4)
    want = []
    for k in range(files):
        recs = rng.integers(0, 255, (samples, 6, 5), dtype=np.uint8)
        with h5py.File(root / f"img_{k}_of_{files}.h5", "w") as f:
            f.create_dataset("records", data=recs, chunks=chunks, compression=compression)
            f.create_dataset("labels", data=[0] * samples)
        want.extend(r.tobytes() for r in recs)
    return want


def test_h5py_dlio_style_records_index_and_load_by_byte_range(tmp_path):
    root = tmp_path / "h5"
    want = _dlio_hdf5(root, 3, 7)
    m = _index(root)
    assert (m["format"], m["modality"], m["total_samples"], m["spec"]["hdf5_dataset"]) == \
        ("hdf5", "records", 21, "records")
    assert m["shards"][0]["offsets"] is not None       # contiguous: rows are byte ranges (map: one read each)
    _check_loads(str(root), want)


def test_h5py_chunked_compressed_records_load_whole_files(tmp_path):
    root = tmp_path / "h5c"
    want = _dlio_hdf5(root, 2, 5, chunks=(1, 6, 5), compression="gzip")
    m = _index(root)
    assert m["total_samples"] == 10 and "offsets" not in m["shards"][0]
    _check_loads(str(root), want, accesses=("stream", "block"))


def test_h5py_cosmoflow_style_file_is_one_sample(tmp_path):
    h5py = pytest.importorskip("h5py")
    root = tmp_path / "cosmo"
    root.mkdir()
    rng = np.random.default_rng(6)
    vols = [rng.integers(0, 100, (8, 8, 8, 4), dtype=np.int16) for _ in range(3)]
    for k, v in enumerate(vols):
        with h5py.File(root / f"univ_{k}.hdf5", "w") as f:
            f.create_dataset("full", data=v)
            f.create_dataset("unitPar", data=rng.random(4, dtype=np.float32))
    m = _index(root)
    assert (m["modality"], m["total_samples"], m["spec"]["hdf5_dataset"]) == ("records", 3, "full")
    _check_loads(str(root), [v.tobytes() for v in vols])


def test_h5py_token_rows_take_the_fixed_record_path(tmp_path):
    h5py = pytest.importorskip("h5py")
    root = tmp_path / "h5t"
    root.mkdir()
    rng = np.random.default_rng(5)
    arrays = [rng.integers(0, 2**31 - 1, (n, 10), dtype=np.int32) for n in (6, 4)]
    for k, a in enumerate(arrays):
        with h5py.File(root / f"tok-{k}.hdf5", "w") as f:
            f.create_dataset("input_ids", data=a)
    m = _index(root)
    assert (m["modality"], m["spec"]["token_dtype"]) == ("tokens", "int32")
    _check_loads(str(root), [r.tobytes() for a in arrays for r in a])


@pytest.mark.parametrize("modality", ["tokens", "records", "images"])
def test_gen_hdf5_is_read_by_h5py(tmp_path, modality):
    h5py = pytest.importorskip("h5py")
    if modality == "images":
        pytest.importorskip("PIL")
    spec = GenSpec.from_mapping({"format": "hdf5", "modality": modality, "num_samples": 14, "seq_len": 8,
                                 "record_bytes": 40, "image_width": 16, "image_height": 12,
                                 "shard_size": "5 samples", "fsync": False})
    m = generate(spec, str(tmp_path / "g"), progress=False)
    synth = make_synth(spec)
    got = []
    for s in m.shards:
        with h5py.File(tmp_path / "g" / s.path, "r") as f:
            name = "tokens" if modality == "tokens" else "records"
            got.extend(np.asarray(r).tobytes() for r in f[name][()])
            if modality != "tokens":
                assert f["labels"][()].tolist() == [synth.sample(s.first_sample + j).label for j in range(s.samples)]
    want = [np.asarray(synth.sample(i).data, dtype=m.spec["token_dtype"]).tobytes() if modality == "tokens"
            else synth.sample(i).data for i in range(14)]
    assert got == want
    assert main(["verify", str(tmp_path / "g")]) == 0
    again = generate(spec, str(tmp_path / "g2"), progress=False)      # no timestamps: byte-identical
    assert [s.checksum for s in again.shards] == [s.checksum for s in m.shards]
    _check_loads(str(tmp_path / "g"), want, accesses=("map", "stream", "block") if modality != "images"
                 else ("stream", "block"))


# -- arrow (HF save_to_disk) -----------------------------------------------------------------------

HF = __import__("pathlib").Path(__file__).parent / "data" / "hf_save_to_disk"


def _hf_copy(tmp_path, name):
    import shutil

    pytest.importorskip("pyarrow")

    shutil.copytree(HF / name, tmp_path / name)
    return tmp_path / name


def test_hf_save_to_disk_tokens_index_and_load(tmp_path):
    root = _hf_copy(tmp_path, "tok")
    m = _index(root)
    assert (m["format"], m["modality"], m["total_samples"]) == ("arrow", "tokens", 20)
    assert [s["path"] for s in m["shards"]] == ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    _check_loads(str(root), [np.arange(i, i + 8, dtype=np.uint16).tobytes() for i in range(20)],
                 accesses=("stream", "block"))


def test_hf_save_to_disk_text_and_images(tmp_path):
    txt = _hf_copy(tmp_path, "txt")
    m = _index(txt)
    assert (m["modality"], m["spec"]["arrow_column"]) == ("records", "text")
    _check_loads(str(txt), [(f"doc {i} " * i).encode() for i in range(10)], list(range(10)), accesses=("stream",))
    img = _hf_copy(tmp_path, "img")
    m = _index(img)
    assert (m["modality"], m["total_samples"]) == ("images", 6)
    got = _delivered(str(img), "block")
    assert [got[i][1] for i in range(6)] == [i % 3 for i in range(6)]
    assert all(got[i][0][:3] == b"\xff\xd8\xff" for i in range(6))


def test_hf_dataset_dict_asks_for_one_split(tmp_path, capsys):
    import shutil

    pytest.importorskip("pyarrow")

    root = tmp_path / "dd"
    root.mkdir()
    shutil.copytree(HF / "tok", root / "train")
    shutil.copytree(HF / "txt", root / "test")
    (root / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')   # as DatasetDict.save_to_disk writes
    assert main(["index", str(root)]) == 2
    assert f"iobench index {root}/train" in capsys.readouterr().err
    assert main(["index", str(root / "train")]) == 0


@pytest.mark.parametrize("modality", ["tokens", "records"])
def test_gen_arrow_is_save_to_disk_layout_pyarrow_reads(tmp_path, modality):
    pa = pytest.importorskip("pyarrow")

    spec = GenSpec.from_mapping({"format": "arrow", "modality": modality, "num_samples": 25, "seq_len": 8,
                                 "record_bytes": 30, "shard_size": "10 samples", "fsync": False})
    m = generate(spec, str(tmp_path / "g"), progress=False)
    synth = make_synth(spec)
    state = json.loads((tmp_path / "g" / "state.json").read_text())
    assert [d["filename"] for d in state["_data_files"]] == [s.path for s in m.shards]
    info = json.loads((tmp_path / "g" / "dataset_info.json").read_text())
    col = "input_ids" if modality == "tokens" else "data"
    assert col in info["features"]
    rows = []
    for s in m.shards:
        with pa.ipc.open_stream(str(tmp_path / "g" / s.path)) as r:   # the IPC stream format, as HF writes
            t = r.read_all()
        assert json.loads(t.schema.metadata[b"huggingface"])["info"]["features"] == info["features"]
        rows.extend(t.column(col).to_pylist())
    for i in (0, 9, 10, 24):
        want = synth.sample(i).data
        assert (rows[i] == want.tolist()) if modality == "tokens" else (rows[i] == want)
    assert main(["verify", str(tmp_path / "g")]) == 0
    # the dataset-level files are the dataset's: regenerating in its place removes them with the shards
    assert set(m.extra["dataset_files"]) == {"state.json", "dataset_info.json"}
    generate(GenSpec.from_mapping({"format": "raw", "num_samples": 4, "seq_len": 8, "fsync": False}),
             str(tmp_path / "g"), progress=False)
    assert not (tmp_path / "g" / "state.json").exists() and not list((tmp_path / "g").glob("*.arrow"))


def test_load_and_verify_take_a_brace_range_or_one_shard_with_no_manifest(tmp_path):
    root = tmp_path / "wds"
    root.mkdir()
    want = {}
    for k in range(4):
        rows = [np.full(6, k * 10 + j, np.uint16) for j in range(3)]
        _tar(root / f"train-{k:06d}.tar", [(f"k{k}_{j}.npy", _npy_bytes(r)) for j, r in enumerate(rows)])
        want[k] = [r.tobytes() for r in rows]
    pattern = str(root) + "/train-{000001..000002}.tar"
    for access in ("map", "stream", "block"):         # indexed in memory: nothing written
        got = _delivered(pattern, access, batch_size=2)
        assert [got[i][0] for i in range(6)] == want[1] + want[2]
    assert not (root / "manifest.json").exists()
    got = _delivered(str(root / "train-000003.tar"), "map", batch_size=3)
    assert [got[i][0] for i in range(3)] == want[3]
    assert main(["verify", pattern]) == 0 and main(["verify", str(root / "train-000000.tar")]) == 0
    assert main(["load", pattern, "-B", "2", "-W", "1"]) == 0
    # with a manifest at the root, a range is that manifest's entries for those shards
    assert main(["index", str(root), "--checksums"]) == 0
    (root / "train-000002.tar").write_bytes((root / "train-000001.tar").read_bytes())   # same size, other bytes
    assert main(["verify", str(root) + "/train-{000000..000001}.tar"]) == 0
    assert main(["verify", pattern]) == 1            # the listed checksum catches the changed shard


def test_a_missing_h5py_is_one_line_with_the_install_hint(tmp_path, monkeypatch, capsys):
    import sys

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    monkeypatch.setitem(sys.modules, "h5py", None)           # `import h5py` fails as if not installed
    monkeypatch.delitem(sys.modules, "iobench.formats.hdf5", raising=False)
    for argv in (["gen", "--out", str(tmp_path / "g"), "--format", "hdf5", "--num-samples", "4"],
                 ["index", str(tmp_path / "d")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "pip install 'iobench[hdf5]'" in err[0], err
    assert not (tmp_path / "g").exists() or not any((tmp_path / "g").iterdir())
