"""The `files` format (one file per sample): round trip, labels kept, one sample per file enforced."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from iobench.errors import ConfigError
from iobench.formats import format_names, get_format
from iobench.generate import GenSpec, generate
from iobench.manifest import read_manifest
from iobench.storage import open_backend


def _samples(url):
    b = open_backend(url)
    m = read_manifest(b)
    r = get_format(m.format).reader(m)
    return m, [s for sh in m.shards for s in r.iter_samples(b.cat(sh.path), sh)]


@pytest.mark.parametrize("modality,compression", [("images", "none"), ("tokens", "none"), ("tokens", "zstd:3")])
def test_files_format_matches_raw(tmp_path, modality, compression):
    common = {"modality": modality, "num_samples": 12, "seq_len": 64, "image_width": 48, "image_height": 32,
              "compression": compression}
    generate(GenSpec.from_mapping({**common, "format": "files", "shard_size": "1 samples"}), str(tmp_path / "f"),
             progress=False)
    generate(GenSpec.from_mapping({**common, "format": "raw", "shard_size": "4 samples"}), str(tmp_path / "r"),
             progress=False)
    mf, files = _samples(str(tmp_path / "f"))
    _, raw = _samples(str(tmp_path / "r"))
    assert len(mf.shards) == 12 and all(s.samples == 1 for s in mf.shards)
    assert [s.index for s in files] == list(range(12))
    for a, b in zip(files, raw):
        assert a.label == b.label
        if modality == "tokens":
            assert np.array_equal(a.data, b.data)
        else:
            assert a.data == b.data
    if modality == "images":
        on_disk = (tmp_path / "f" / mf.shards[0].path).read_bytes()
        Image.open(io.BytesIO(on_disk)).verify()   # each file is a valid JPEG, label and all


def test_files_format_is_registered_and_one_sample_per_file(tmp_path):
    assert "files" in format_names()
    with pytest.raises(ConfigError, match="1 samples"):
        generate(GenSpec.from_mapping({"format": "files", "num_samples": 4, "shard_size": "2 samples",
                                       "seq_len": 8}), str(tmp_path / "x"), progress=False)
