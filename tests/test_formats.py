"""The shared round-trip suite: every format x modality x compression writes and reads back
exactly the samples the generator made, with the manifest's sizes, counts and byte ranges."""

from __future__ import annotations

import itertools
import uuid

import numpy as np
import pytest

from iobench.formats import get_format
from iobench.formats.compression import parse_compression
from iobench.generate import GenSpec, generate, make_synth
from iobench.manifest import read_manifest
from iobench.storage import open_backend
from iobench.errors import ConfigError

FORMATS = ("raw", "parquet", "tfrecord", "tar")
SMALL = {
    "tokens": {"num_samples": 70, "seq_len": 64, "vocab_size": 70000, "shard_size": "32 samples"},
    "images": {"num_samples": 7, "image_width": 64, "image_height": 48, "shard_size": "3 samples"},
}


def _spec(fmt, modality, compression, **kw):
    return GenSpec.from_mapping({"format": fmt, "modality": modality, "compression": compression, "seed": 7,
                                 **SMALL[modality], **kw})


def _read_all(url, manifest):
    backend = open_backend(url)
    reader = get_format(manifest.format).reader(manifest)
    out = []
    for shard in manifest.shards:
        out.extend(reader.iter_samples(backend.cat(shard.path), shard))
    return out


@pytest.mark.parametrize("fmt,modality,compression",
                         list(itertools.product(FORMATS, ("tokens", "images"), ("none", "zstd:3"))))
def test_round_trip(fmt, modality, compression):
    spec = _spec(fmt, modality, compression)
    url = f"memory://rt-{uuid.uuid4().hex}"
    manifest = generate(spec, url, progress=False)
    assert read_manifest(open_backend(url)).to_dict() == manifest.to_dict()
    assert manifest.total_samples == spec.num_samples
    assert [s.samples for s in manifest.shards] == ([32, 32, 6] if modality == "tokens" else [3, 3, 1])
    assert manifest.compression == str(parse_compression(compression))
    synth = make_synth(spec)
    samples = _read_all(url, manifest)
    assert [s.index for s in samples] == list(range(spec.num_samples))
    for s in samples:
        want = synth.sample(s.index)
        if modality == "tokens":
            assert s.data.dtype == np.uint32          # vocab 70000 needs 32-bit ids
            np.testing.assert_array_equal(s.data, want.data)
        else:
            assert bytes(s.data) == want.data and bytes(s.data[:2]) == b"\xff\xd8"
            assert s.label == want.label
    backend = open_backend(url)
    reader = get_format(fmt).reader(manifest)
    for shard in manifest.shards:
        assert backend.size(shard.path) == shard.bytes
        for i in range(shard.samples):
            rng = reader.sample_range(shard, i)
            if rng is None:
                continue
            one = reader.sample_from_range(shard, i, backend.cat(shard.path, rng[0], rng[0] + rng[1]))
            want = synth.sample(shard.first_sample + i)
            if modality == "tokens":
                np.testing.assert_array_equal(one.data, want.data)
            else:
                assert one.data == want.data and one.label == want.label


def test_indexable_formats_give_ranges_when_uncompressed():
    for fmt in ("raw", "tar", "tfrecord"):
        spec = _spec(fmt, "images", "none")
        m = generate(spec, f"memory://ix-{uuid.uuid4().hex}", progress=False)
        reader = get_format(fmt).reader(m)
        for shard in m.shards:
            assert len(shard.offsets) == shard.samples + 1
            assert reader.sample_range(shard, 0) is not None
            assert reader.sample_range(shard, shard.samples) is None


def test_raw_token_shard_is_memory_mappable(tmp_path):
    spec = _spec("raw", "tokens", "none", vocab_size=1000)
    m = generate(spec, str(tmp_path), progress=False)
    shard = m.shards[0]
    arr = np.memmap(tmp_path / shard.path, dtype="<u2", mode="r", offset=64).reshape(-1, 64)
    np.testing.assert_array_equal(arr[5], make_synth(spec).tokens(5))
    assert (tmp_path / shard.path).read_bytes()[:8] == b"IOBTOKS\0"


def test_zipf_tokens_are_skewed_and_in_range():
    spec = GenSpec.from_mapping({"distribution": "zipf", "vocab_size": 1000, "seq_len": 4096})
    t = make_synth(spec).tokens(3)
    counts = np.bincount(t, minlength=1000)
    assert t.max() < 1000 and counts[0] > 10 * counts[100] > 0


def test_images_look_like_imagenet():
    spec = GenSpec.from_mapping({"modality": "images"})
    synth = make_synth(spec)
    sizes = [len(synth.sample(i).data) for i in range(12)]
    assert 70_000 < np.mean(sizes) < 200_000
    assert np.std(sizes) > 5_000                       # sizes spread, not one fixed size
    from PIL import Image
    import io

    img = Image.open(io.BytesIO(synth.sample(0).data))
    assert img.format == "JPEG" and img.mode == "RGB"


@pytest.mark.parametrize("value", ["gzip", "zstd:0", "zstd:99", "zstd:x"])
def test_bad_compression_is_a_config_error(value):
    with pytest.raises(ConfigError, match="compression"):
        parse_compression(value)


def test_unknown_format_names_nearest():
    with pytest.raises(ConfigError, match="did you mean 'parquet'"):
        get_format("parqet")
