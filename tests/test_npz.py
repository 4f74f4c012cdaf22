"""The `npz` format and the `records` modality (MLPerf Storage-style opaque samples)."""

from __future__ import annotations

import numpy as np
import pytest

from iobench.formats import get_format
from iobench.generate import GenSpec, generate, make_synth
from iobench.manifest import Manifest, ShardEntry
from iobench.verify import verify_dataset


def _gen(tmp_path, name, **kw):
    spec = GenSpec.from_mapping({"format": "npz", "seed": 3, **kw})
    url = str(tmp_path / name)
    return spec, url, generate(spec, url, progress=False)


def test_records_round_trip_and_numpy_reads_ours(tmp_path):
    spec, url, m = _gen(tmp_path, "rec", modality="records", num_samples=7, shard_size="3 samples",
                        record_bytes=5000, record_bytes_stdev=1500)
    assert [s.samples for s in m.shards] == [3, 3, 1]
    synth = make_synth(spec)
    reader = get_format("npz").reader(m)
    got = []
    for shard in m.shards:
        path = tmp_path / "rec" / shard.path
        data = path.read_bytes()
        got.extend(reader.iter_samples(data, shard))
        # numpy itself opens the archive: x holds the samples' bytes at the offsets, y the labels
        with np.load(path) as z:
            assert sorted(z.files) == ["offsets", "x", "y"]
            for j in range(shard.samples):
                want = synth.sample(shard.first_sample + j)
                assert z["x"][z["offsets"][j]:z["offsets"][j + 1]].tobytes() == want.data
                assert int(z["y"][j]) == want.label
    assert [s.index for s in got] == list(range(7))
    for s in got:
        want = synth.sample(s.index)
        assert s.data == want.data and s.label == want.label
    sizes = {len(s.data) for s in got}
    assert len(sizes) > 1                                  # sizes vary (stdev > 0)
    assert verify_dataset(url).ok


def test_tokens_round_trip(tmp_path):
    spec, url, m = _gen(tmp_path, "tok", modality="tokens", num_samples=10, seq_len=16, vocab_size=70000,
                        shard_size="4 samples")
    synth = make_synth(spec)
    with np.load(tmp_path / "tok" / m.shards[0].path) as z:
        assert z["x"].shape == (4, 16) and z["x"].dtype == np.uint32
        np.testing.assert_array_equal(z["x"][1], synth.tokens(1))
    reader = get_format("npz").reader(m)
    arr = reader.tokens((tmp_path / "tok" / m.shards[2].path).read_bytes(), m.shards[2])
    np.testing.assert_array_equal(arr, np.stack([synth.tokens(8), synth.tokens(9)]))


def test_same_seed_gives_identical_bytes(tmp_path):
    kw = dict(modality="records", num_samples=4, shard_size="2 samples", record_bytes=3000, workers=1)
    _, _, a = _gen(tmp_path, "a", **kw)
    _, _, b = _gen(tmp_path, "b", **{**kw, "workers": 2})
    assert [s.checksum for s in a.shards] == [s.checksum for s in b.shards]


def test_we_read_an_archive_numpy_wrote(tmp_path):
    """A DLIO-style archive (np.savez with x and y, no offsets) is one sample: x's bytes."""
    x = np.random.default_rng(0).random((8, 8, 1))
    path = tmp_path / "img_0.npz"
    np.savez(path, x=x, y=np.zeros(1, dtype=np.int64))
    m = Manifest(format="npz", modality="records", compression="none", seed=0, spec={}, shards=())
    shard = ShardEntry(path="img_0.npz", bytes=path.stat().st_size, samples=1, checksum="", first_sample=0)
    (s,) = list(get_format("npz").reader(m).iter_samples(path.read_bytes(), shard))
    assert s.data == x.tobytes() and s.label == 0


def test_corruption_is_found(tmp_path):
    _, url, m = _gen(tmp_path, "bad", modality="records", num_samples=2, shard_size="1 samples", record_bytes=2000)
    p = tmp_path / "bad" / m.shards[1].path
    data = bytearray(p.read_bytes())
    data[300] ^= 0xFF
    p.write_bytes(bytes(data))
    rep = verify_dataset(url)
    assert not rep.ok and m.shards[1].path in str(rep.first_bad)


def test_record_sizes_follow_mean_and_stdev():
    spec = GenSpec.from_mapping({"modality": "records", "record_bytes": 146_600_628, "record_bytes_stdev": 68_341_808,
                                 "scale": 0.0001})
    synth = make_synth(spec)
    sizes = np.array([synth.size_and_label(i)[0] for i in range(4000)])
    assert abs(sizes.mean() - 14660) < 14660 * 0.05
    assert abs(sizes.std() - 6834) < 6834 * 0.1


def test_npz_refuses_compression():
    from iobench.errors import ConfigError

    with pytest.raises(ConfigError, match="gen.compression"):
        GenSpec.from_mapping({"format": "npz", "compression": "zstd:3"})


@pytest.mark.parametrize("name,fmt,per_file", [("unet3d", "npz", 1), ("resnet50", "tfrecord", 1251),
                                               ("cosmoflow", "tfrecord", 1)])
def test_mlperf_workloads_generate_scaled_down(tmp_path, name, fmt, per_file):
    from iobench.cli import main
    from iobench.manifest import read_manifest
    from iobench.storage import open_backend

    out = tmp_path / name
    n = per_file * 2
    assert main(["gen", "--workload", name, "--scale", "0.001", "--num-samples", str(n), "--out", str(out),
                 "--no-progress"]) == 0
    m = read_manifest(open_backend(str(out)))
    assert m.format == fmt and m.modality == "records" and m.spec["scale"] == 0.001
    assert [s.samples for s in m.shards] == [per_file, per_file]
    assert verify_dataset(str(out)).ok
