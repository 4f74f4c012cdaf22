"""The vectorised ``tokens()`` fast paths of the parquet and tfrecord readers give exactly
what ``iter_samples`` gives, for every compression setting, keep every integrity check,
and step aside (None) where they cannot apply."""

from __future__ import annotations

import itertools
import struct
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iobench.errors import IntegrityError
from iobench.formats import get_format
from iobench.formats.base import FormatSpec
from iobench.formats.tfrecord import encode_example, frame
from iobench.generate import GenSpec, generate
from iobench.storage import open_backend


def _compressions(fmt: str) -> tuple[str, ...]:
    spec: FormatSpec = get_format(fmt)
    out = []
    for c in spec.compressions:
        out += ["none"] if c == "none" else [f"{c}:1", f"{c}:3", f"{c}:19"]
    return tuple(out)


CASES = [(f, c, d) for f in ("parquet", "tfrecord") for c in _compressions(f) for d in ("uint16", "uint32")]


def _dataset(fmt, compression, token_dtype, **kw):
    vocab = 1000 if token_dtype == "uint16" else 70000
    spec = GenSpec.from_mapping({"format": fmt, "modality": "tokens", "compression": compression, "seed": 11,
                                 "num_samples": 70, "seq_len": 48, "vocab_size": vocab,
                                 "shard_size": "32 samples", **kw})
    url = f"memory://fast-{uuid.uuid4().hex}"
    m = generate(spec, url, progress=False)
    return m, open_backend(url)


def _same(fast: np.ndarray, samples) -> None:
    assert fast.ndim == 2 and fast.shape[0] == len(samples)
    for row, s in zip(fast, samples):
        assert row.dtype == s.data.dtype and row.shape == s.data.shape
        assert row.tobytes() == s.data.tobytes()


@pytest.mark.parametrize("fmt,compression,token_dtype", CASES)
def test_fast_path_equals_iter_samples(fmt, compression, token_dtype):
    m, backend = _dataset(fmt, compression, token_dtype)
    reader = get_format(fmt).reader(m)
    assert m.spec["token_dtype"] == token_dtype
    for shard in m.shards:
        data = backend.cat(shard.path)
        fast = reader.tokens(data, shard)
        assert fast is not None, (fmt, compression, shard.path)
        assert fast.dtype == np.dtype(token_dtype)
        _same(fast, list(reader.iter_samples(data, shard)))


def test_parquet_many_row_groups_and_zero_copy_single_group(monkeypatch):
    import iobench.formats.parquet as pqfmt

    monkeypatch.setattr(pqfmt, "ROW_GROUP_BYTES", 1000)       # ~5 rows of 48 x u32 per row group
    m, backend = _dataset("parquet", "none", "uint32")
    reader = get_format("parquet").reader(m)
    data = backend.cat(m.shards[0].path)
    assert pq.ParquetFile(pa.BufferReader(data)).num_row_groups > 1
    _same(reader.tokens(data, m.shards[0]), list(reader.iter_samples(data, m.shards[0])))


def _parquet_bytes(rows, dtype=pa.uint16(), compression="none") -> bytes:
    sink = pa.BufferOutputStream()
    table = pa.table({"tokens": pa.array(rows, pa.list_(dtype))})
    pq.write_table(table, sink, compression=compression)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("codec", ["snappy", "gzip", "lz4", "brotli", "zstd"])
def test_parquet_other_page_codecs(codec):
    m, _ = _dataset("parquet", "none", "uint16")
    reader = get_format("parquet").reader(m)
    shard = m.shards[0]
    rows = [list(range(i, i + 16)) for i in range(40)]
    data = _parquet_bytes(rows, compression=codec)
    _same(reader.tokens(data, shard), list(reader.iter_samples(data, shard)))


@pytest.mark.parametrize("rows", [[[1, 2, 3], [4, 5]], [[1, 2], None, [3, 4]], [[1, None], [3, 4]], [[], []]])
def test_parquet_falls_back_where_it_cannot_apply(rows):
    m, _ = _dataset("parquet", "none", "uint16")
    reader = get_format("parquet").reader(m)
    assert reader.tokens(_parquet_bytes(rows), m.shards[0]) is None


def _tfrecord_bytes(payloads) -> bytes:
    return b"".join(frame(p) for p in payloads)


def test_tfrecord_falls_back_where_it_cannot_apply():
    m, _ = _dataset("tfrecord", "none", "uint16")
    reader = get_format("tfrecord").reader(m)
    shard = m.shards[0]
    two = np.arange(8, dtype="<u2").tobytes()
    variable = _tfrecord_bytes([encode_example({"tokens": two}), encode_example({"tokens": two[:6]})])
    ints = _tfrecord_bytes([encode_example({"tokens": [1, 2, 3]})] * 3)              # int64 list, not bytes
    other = _tfrecord_bytes([encode_example({"tokens": two, "x": b"ab"}), encode_example({"tokens": two, "x": b"cd"})])
    for data in (variable, ints, other, b""):
        assert reader.tokens(data, shard) is None
    # Same records, different non-token bytes: the per-sample path still reads them all.
    assert len(list(reader.iter_samples(other, shard))) == 2
    # Extra features around the tokens: the fast path picks the token value as _sample does.
    extra = _tfrecord_bytes([encode_example({"a": b"zz", "tokens": np.full(8, i, "<u2").tobytes(), "z": 7})
                             for i in range(5)])
    _same(reader.tokens(extra, shard), list(reader.iter_samples(extra, shard)))


@pytest.mark.parametrize("where", ["length", "length_crc", "payload", "payload_crc"])
def test_tfrecord_fast_path_keeps_crc_checks(where):
    m, backend = _dataset("tfrecord", "none", "uint16")
    reader = get_format("tfrecord").reader(m)
    shard = m.shards[0]
    data = bytearray(backend.cat(shard.path))
    length = struct.unpack_from("<Q", data, 0)[0]
    rec = 16 + length
    k = 5                                               # corrupt record 5
    pos = {"length_crc": 8, "payload": 12 + length - 3, "payload_crc": 12 + length + 1}.get(where)
    if where == "length":
        struct.pack_into("<Q", data, k * rec, length + 1)        # the length CRC no longer matches
        pos = None
    if pos is not None:
        data[k * rec + pos] ^= 0xFF
    with pytest.raises(IntegrityError) as slow:
        list(reader.iter_samples(bytes(data), shard))
    if where == "length":
        # Lengths differ, so the records are not fixed-size: the fast path steps aside.
        assert reader.tokens(bytes(data), shard) is None
        return
    with pytest.raises(IntegrityError) as fast:
        reader.tokens(bytes(data), shard)
    assert str(fast.value) == str(slow.value)


def test_loader_uses_fast_path_and_matches(monkeypatch):
    """The worker's block read takes tokens() when given and gets the same rows as iter_samples."""
    from iobench.loader import worker as w

    for fmt, comp in itertools.product(("parquet", "tfrecord"), ("none", "zstd:3")):
        m, backend = _dataset(fmt, comp, "uint16")
        reader = get_format(fmt).reader(m)

        class Src:
            def read_shard(self, sh):
                return backend.cat(sh.path)

        class Block:
            shards = list(range(len(m.shards)))

        job = w.WorkerJob(wid=0, workers=1, manifest=m, plans=[], total_batches=0, decode=False)
        bd = w._read_block(job, Src(), reader, Block())
        assert bd.array is not None and bd.samples is None
        want = [s for sh in m.shards for s in reader.iter_samples(backend.cat(sh.path), sh)]
        _same(bd.array, want)
        np.testing.assert_array_equal(bd.ids, [s.index for s in want])
