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


def _pieces(reader, backend, shard, arrays: bool) -> list:
    data = backend.cat(shard.path)
    return list(reader.pieces(shard, lambda a, n, first: (data[a:a + n], 0.0, int(first)), 0, arrays=arrays))


@pytest.mark.parametrize("token_dtype", ["uint16", "uint32"])
def test_parquet_stream_pieces_equal_iter_samples(monkeypatch, token_dtype):
    """Row groups streamed (decoded one ahead on the thread pool) give iter_samples' rows in order,
    as Samples or, with arrays, as (rows, seq_len) arrays; the footer is the one request."""
    import iobench.formats.parquet as pqfmt

    monkeypatch.setattr(pqfmt, "ROW_GROUP_BYTES", 1000)
    m, backend = _dataset("parquet", "none", token_dtype)
    reader = get_format("parquet").reader(m)
    assert reader.stream_arrays()
    data0 = backend.cat(m.shards[0].path)
    early = reader.pieces(m.shards[0], lambda a, n, first: (data0[a:a + n], 0.0, int(first)), 0, arrays=True)
    next(early)
    early.close()   # stopped mid-shard with a decode in flight: the reused buffer is safe afterwards
    for shard in m.shards:
        want = list(reader.iter_samples(backend.cat(shard.path), shard))
        as_samples = _pieces(reader, backend, shard, arrays=False)
        as_arrays = _pieces(reader, backend, shard, arrays=True)
        assert sum(p[2] for p in as_arrays) == 1
        assert len(as_arrays) > 1 or shard is m.shards[-1]
        got = [s for p in as_samples for s in p[0]]
        assert [s.index for s in got] == [s.index for s in want]
        _same(np.stack([s.data for s in got]), want)
        _same(np.concatenate([p[0] for p in as_arrays]), want)


def test_parquet_stream_arrays_refuse_rows_the_manifest_does_not_describe():
    m, backend = _dataset("parquet", "none", "uint16")
    reader = get_format("parquet").reader(m)
    shard = m.shards[0]
    data = _parquet_bytes([list(range(48))] * 3 + [list(range(47))])
    sh = type(shard)(path=shard.path, bytes=len(data), samples=4, checksum=shard.checksum)
    with pytest.raises(IntegrityError, match="seq_len"):
        list(reader.pieces(sh, lambda a, n, first: (data[a:a + n], 0.0, 1), 0, arrays=True))
    indexed = get_format("parquet").reader(type(m)(**{**m.__dict__, "spec": {"indexed_from": "x"}}))
    assert not indexed.stream_arrays()


def test_parquet_stream_load_delivers_the_stored_rows(tmp_path, monkeypatch):
    """End to end through stream workers' row store, with a first shard of smaller row groups than
    the rest (the store grows), every delivered row is the stored one for its index."""
    import json

    import iobench.formats.parquet as pqfmt
    from iobench.loader.core import LoadConfig, run_load

    monkeypatch.setattr(pqfmt, "ROW_GROUP_BYTES", 1000)       # 11 rows of 48 x u16 per row group
    url = tmp_path / "pq"
    m = generate(GenSpec.from_mapping({"format": "parquet", "modality": "tokens", "num_samples": 96, "seq_len": 48,
                                       "vocab_size": 1000, "shard_size": "24 samples", "fsync": False}),
                 str(url), progress=False)
    reader = get_format("parquet").reader(m)
    first = m.shards[0]
    rows = reader.tokens((url / first.path).read_bytes(), first)
    pq.write_table(pa.table({"tokens": pa.array(list(rows), pa.list_(pa.uint16()))}), url / first.path,
                   row_group_size=1, use_dictionary=False, compression="none")
    man = json.loads((url / "manifest.json").read_text())
    man["shards"][0]["bytes"] = (url / first.path).stat().st_size
    (url / "manifest.json").write_text(json.dumps(man))
    from iobench.manifest import read_manifest
    m2 = read_manifest(open_backend(str(url)))
    want = np.concatenate([reader.tokens((url / sh.path).read_bytes(), sh) for sh in m2.shards])
    for workers, shuffle in ((1, False), (2, True)):   # in order: the 1-row pieces come first
        seen = []

        def deliver(batch):
            seen.append((batch.indices.copy(), np.array(batch.data, copy=True)))
            return batch
        r = run_load(LoadConfig(dataset=str(url), access="stream", batch_size=8, workers=workers, shuffle=shuffle,
                                shuffle_buffer=10 if shuffle else 0,
                                epochs=1, verify_checksums=False), deliver=deliver)
        assert r.metrics["samples"] == 96
        idx = np.concatenate([i for i, _ in seen])
        assert sorted(idx.tolist()) == list(range(96))
        assert np.array_equal(np.concatenate([d for _, d in seen]), want[idx])


def _parquet_bytes(rows, dtype=None, compression="none") -> bytes:
    dtype = pa.uint16() if dtype is None else dtype
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


def _corrupt_tfrecord(where: str, k: int):
    """(reader, shard, its bytes with record ``k`` corrupted at ``where``, record size)."""
    m, backend = _dataset("tfrecord", "none", "uint16")
    reader = get_format("tfrecord").reader(m)
    shard = m.shards[0]
    data = bytearray(backend.cat(shard.path))
    length = struct.unpack_from("<Q", data, 0)[0]
    rec = 16 + length
    if where == "length":
        struct.pack_into("<Q", data, k * rec, length + 1)        # the length CRC no longer matches
    else:
        data[k * rec + {"length_crc": 8, "payload": 12 + length - 3, "payload_crc": 12 + length + 1}[where]] ^= 0xFF
    return reader, shard, data, rec


@pytest.mark.parametrize("where", ["length", "length_crc", "payload", "payload_crc"])
def test_tfrecord_fast_path_keeps_crc_checks(where):
    reader, shard, data, _ = _corrupt_tfrecord(where, 5)
    with pytest.raises(IntegrityError) as slow:
        list(reader.iter_samples(bytes(data), shard))
    if where == "length":
        # Lengths differ, so the records are not fixed-size: the fast path steps aside.
        assert reader.tokens(bytes(data), shard) is None
        return
    with pytest.raises(IntegrityError) as fast:
        reader.tokens(bytes(data), shard)
    assert str(fast.value) == str(slow.value)


def _array_pieces(reader, data, shard, size):
    return list(reader.pieces(shard, lambda a, n, first: (data[a:a + n], 0.0, int(first)), size, arrays=True))


@pytest.mark.parametrize("compression", ["none", "zstd:3"])
@pytest.mark.parametrize("token_dtype", ["uint16", "uint32"])
def test_tfrecord_array_pieces_equal_iter_samples(compression, token_dtype):
    """Stream pieces of whole records, cut into (records, seq_len) arrays, give iter_samples' rows in
    order, for any piece size (down to less than a record); one request per shard."""
    m, backend = _dataset("tfrecord", compression, token_dtype)
    reader = get_format("tfrecord").reader(m)
    assert reader.stream_arrays()
    for shard in m.shards:
        data = backend.cat(shard.path)
        want = list(reader.iter_samples(data, shard))
        for size in (1, 300, 1000, 1 << 20):
            pieces = _array_pieces(reader, data, shard, size)
            assert sum(p[2] for p in pieces) == 1
            if compression == "none" and size == 1:
                assert [len(p[0]) for p in pieces] == [1] * len(want)
            _same(np.concatenate([p[0] for p in pieces]), want)
    indexed = get_format("tfrecord").reader(type(m)(**{**m.__dict__, "spec": {"indexed_from": "x"}}))
    assert not indexed.stream_arrays()


@pytest.mark.parametrize("where", ["length_crc", "payload", "payload_crc"])
def test_tfrecord_array_pieces_keep_crc_checks(where):
    """A corrupt record in a later piece raises iter_samples' error, at the same shard offset."""
    reader, shard, data, rec = _corrupt_tfrecord(where, 7)
    with pytest.raises(IntegrityError) as slow:
        list(reader.iter_samples(bytes(data), shard))
    with pytest.raises(IntegrityError) as fast:
        _array_pieces(reader, bytes(data), shard, 3 * rec)
    assert str(fast.value) == str(slow.value) and f"offset {7 * rec}:" in str(fast.value)


def test_tfrecord_array_pieces_decode_other_layouts_and_refuse_other_lengths():
    """Records that do not share the shard's first layout are decoded one by one (same rows); rows of
    another length than spec.seq_len are refused, naming the sample."""
    m, _ = _dataset("tfrecord", "none", "uint16")
    reader = get_format("tfrecord").reader(m)
    shard = m.shards[0]
    toks = [np.full(48, i, "<u2").tobytes() for i in range(6)]
    mixed = [encode_example({"tokens": t, "x": b"ab" * (i % 3)}) for i, t in enumerate(toks)]

    def shard_of(payloads):
        recs = [frame(p) for p in payloads]
        offs = np.concatenate([[0], np.cumsum([len(r) for r in recs])]).tolist()
        return b"".join(recs), type(shard)(path=shard.path, bytes=offs[-1], samples=len(recs),
                                           checksum=shard.checksum, offsets=tuple(offs))
    data, sh = shard_of(mixed)
    for size in (1, 200, 1 << 20):
        _same(np.concatenate([p[0] for p in _array_pieces(reader, data, sh, size)]),
              list(reader.iter_samples(data, sh)))
    data, sh = shard_of([encode_example({"tokens": t}) for t in toks[:3]] + [encode_example({"tokens": toks[3][:-2]})])
    with pytest.raises(IntegrityError, match="sample 3 has 47 tokens.*seq_len"):
        _array_pieces(reader, data, sh, 1 << 20)


@pytest.mark.parametrize("compression", ["none", "zstd:3"])
def test_tfrecord_stream_load_delivers_the_stored_rows(tmp_path, compression):
    """End to end through stream workers' row store (W=1 in order, W=2 shuffled): every delivered row
    is the stored one for its index."""
    from iobench.loader.core import LoadConfig, run_load

    url = tmp_path / "tfr"
    m = generate(GenSpec.from_mapping({"format": "tfrecord", "modality": "tokens", "num_samples": 96, "seq_len": 48,
                                       "vocab_size": 1000, "shard_size": "24 samples", "fsync": False,
                                       "compression": compression}), str(url), progress=False)
    reader = get_format("tfrecord").reader(m)
    want = np.concatenate([reader.tokens((url / sh.path).read_bytes(), sh) for sh in m.shards])
    for workers, shuffle in ((1, False), (2, True)):
        seen = []

        def deliver(batch):
            seen.append((batch.indices.copy(), np.array(batch.data, copy=True)))
            return batch
        r = run_load(LoadConfig(dataset=str(url), access="stream", batch_size=8, workers=workers, shuffle=shuffle,
                                shuffle_buffer=10 if shuffle else 0, stream_read_size="500",
                                epochs=1, verify_checksums=False), deliver=deliver)
        assert r.metrics["samples"] == 96
        idx = np.concatenate([i for i, _ in seen])
        assert sorted(idx.tolist()) == list(range(96))
        if not shuffle:
            assert idx.tolist() == list(range(96))
        assert np.array_equal(np.concatenate([d for _, d in seen]), want[idx])


def test_loader_uses_fast_path_and_matches(monkeypatch):
    """The worker's block read takes tokens() when given and gets the same rows as iter_samples."""
    from iobench.loader import worker as w

    for fmt, comp in itertools.product(("parquet", "tfrecord"), ("none", "zstd:3")):
        m, backend = _dataset(fmt, comp, "uint16")
        reader = get_format(fmt).reader(m)

        from iobench.loader.source import ShardSource

        class Src(ShardSource):   # the one required read: the base class's defaults do the rest
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


# --- tar: the slim header parser of iter_entries agrees with tarfile -------------------------------

import io  # noqa: E402
import tarfile  # noqa: E402

from iobench.formats import tar as tarfmt  # noqa: E402

LONG = "d" * 70 + "/" + "e" * 60 + ".jpg"                  # 135 chars: ustar prefix, GNU 'L', pax path


def _tar_bytes(fmt, members) -> bytes:
    """members: (name, payload | None for a directory | str for a symlink target, TarInfo overrides)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for i, (name, payload, extra) in enumerate(members):
            ti = tarfile.TarInfo(name)
            ti.mtime = 1_700_000_000 + i                    # varying mtimes: the field cache misses
            for k, v in extra.items():
                setattr(ti, k, v)
            if payload is None:
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif isinstance(payload, str):
                ti.type, ti.linkname = tarfile.SYMTYPE, payload
                tf.addfile(ti)
            else:
                ti.size = len(payload)
                tf.addfile(ti, io.BytesIO(payload))
    return buf.getvalue()


def _members(fmt):
    out = [("000000000.jpg", b"\xff\xd8" + bytes(range(256)) * 3, {}),
           ("000000000.cls", b"7", {}),
           ("sub", None, {}),
           ("sub/000000001.jpg", b"x" * 512, {}),          # exactly one block: no padding
           ("sub/000000001.cls", b"", {}),                 # empty payload
           ("link.jpg", "000000000.jpg", {}),
           (LONG, b"long name payload", {}),
           ("000000002.jpg", b"big ids", {"uid": 3_000_000, "gid": 3_000_001})]  # > 7 octal digits
    if fmt != tarfile.USTAR_FORMAT:
        out.append(("\u00e9t\u00e9/000000003.jpg", b"accent", {}))
    if fmt == tarfile.USTAR_FORMAT:                         # ustar cannot hold uid 3,000,000
        out[-1] = ("000000002.jpg", b"big ids", {})
    return out


def _tarfile_listing(data: bytes):
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return [(m.name, m.offset_data, tf.extractfile(m).read()) for m in tf.getmembers() if m.isreg()]


def _our_listing(data: bytes):
    return [(e.name, e.end - len(e.payload) - (-len(e.payload) % tarfmt.BLOCK), bytes(e.payload))
            for e in tarfmt.iter_entries(data)]


def _headers(data: bytes):
    """Every header block tarfile visits, as (offset, 512 bytes)."""
    out, pos = [], 0
    while pos + 512 <= len(data) and any(data[pos:pos + 512]):
        ti = tarfile.TarInfo.frombuf(data[pos:pos + 512], "utf-8", "surrogateescape")
        out.append((pos, data[pos:pos + 512]))
        pos += 512 + ti.size + (-ti.size % 512)
    return out


def _fix_chksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:155] = b"%06o\0" % (256 + sum(block) - 256)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT],
                         ids=["ustar", "gnu", "pax"])
def test_tar_slim_parser_matches_tarfile(fmt):
    data = _tar_bytes(fmt, _members(fmt))
    want = _tarfile_listing(data)
    assert LONG in [n for n, _, _ in want] and len(want) == len(_members(fmt)) - 2
    assert _our_listing(data) == want
    # Header by header: where the slim parser answers, it answers what tarfile.TarInfo.frombuf does.
    fast = 0
    for _pos, hdr in _headers(data):
        ti = tarfile.TarInfo.frombuf(hdr, "utf-8", "surrogateescape")
        got = tarfmt._slim_header(hdr)
        if got is not None:
            fast += 1
            assert got == (ti.name, ti.size, ti.type)
    assert fast >= len(want)
    if fmt == tarfile.GNU_FORMAT:                           # base-256 uid/gid: tarfile decides
        assert any(tarfmt._slim_header(h) is None for _, h in _headers(data))


def test_tar_gnu_base256_size_and_signed_checksum():
    data = bytearray(_tar_bytes(tarfile.GNU_FORMAT, [("a.jpg", b"0123456789", {}), ("a.cls", b"\xe9", {})]))
    blk = bytearray(data[:512])
    blk[124:136] = b"\x80" + (10).to_bytes(11, "big")       # GNU base-256 size
    _fix_chksum(blk)
    data[:512] = blk
    second = 512 + 512                                      # a.cls header
    blk = bytearray(data[second:second + 512])
    blk[0:5] = "\u00e9.cls".encode("latin-1")               # a high byte in the name ...
    blk[148:156] = b" " * 8
    signed = tarfile.calc_chksums(bytes(blk))[1]            # ... and the signed-char checksum
    blk[148:155] = b"%06o\0" % signed
    data[second:second + 512] = blk
    data = bytes(data)
    assert tarfmt._slim_header(data[:512]) is None and tarfmt._slim_header(data[second:second + 512]) is None
    assert _our_listing(data) == _tarfile_listing(data)
    assert [n for n, _, _ in _our_listing(data)] == ["a.jpg", "\udce9.cls"]


def test_tar_pax_size_record_overrides_header():
    ti = tarfile.TarInfo("p.jpg")
    ti.size = 5
    ti.pax_headers = {"size": "5", "path": "q/p.jpg"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(ti, io.BytesIO(b"hello"))
        tf.addfile(tarfile.TarInfo("next.cls"), io.BytesIO(b""))
    data = bytearray(buf.getvalue())
    (pos, hdr), = [(p, h) for p, h in _headers(bytes(data)) if h[156:157] == b"0" and h.startswith(b"p.jpg")]
    blk = bytearray(hdr)
    blk[124:136] = b"%011o\0" % 0                          # the header says 0; the pax record says 5
    _fix_chksum(blk)
    data[pos:pos + 512] = blk
    data = bytes(data)
    assert _tarfile_listing(data) == [("q/p.jpg", pos + 512, b"hello"), ("next.cls", pos + 1536, b"")]
    assert _our_listing(data) == _tarfile_listing(data)


def test_tar_v7_directory_and_end_of_archive():
    data = bytearray(_tar_bytes(tarfile.USTAR_FORMAT, [("olddir/", b"", {}), ("olddir/x.jpg", b"x", {})]))
    blk = bytearray(data[:512])
    blk[156:157] = b"\0"                                    # AREGTYPE + trailing slash = directory
    _fix_chksum(blk)
    data[:512] = blk
    body = bytes(data)
    assert _our_listing(body) == _tarfile_listing(body) == [("olddir/x.jpg", 1024, b"x")]
    # Anything after the first zero block is not read.
    end = 1536                                              # header, header, payload block
    assert body[end:end + 1024] == bytes(1024)
    assert _our_listing(body[:end] + bytes(512) + b"garbage" * 100) == _our_listing(body)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT],
                         ids=["ustar", "gnu", "pax"])
def test_tar_corrupted_checksum_raises_integrity_error(fmt):
    data = _tar_bytes(fmt, _members(fmt))
    heads = _headers(data)
    for pos, _hdr in (heads[1], heads[-1]):
        bad = bytearray(data)
        bad[pos + 3] ^= 0x01                                 # a name byte: checksum no longer matches
        with pytest.raises(IntegrityError) as e:
            list(tarfmt.iter_entries(bytes(bad), "s.tar"))
        assert str(e.value) == f"s.tar: offset {pos}: bad tar header (bad checksum)"
        with pytest.raises(tarfile.InvalidHeaderError, match="bad checksum"):   # tarfile rejects it too
            tarfile.TarInfo.frombuf(bytes(bad[pos:pos + 512]), "utf-8", "surrogateescape")
    bad = bytearray(data)
    bad[heads[0][0] + 100:heads[0][0] + 102] = b"9z"         # a non-octal mode ...
    blk = bytearray(bad[:512])
    _fix_chksum(blk)                                         # ... under a valid checksum
    bad[:512] = blk
    with pytest.raises(IntegrityError, match=r"offset 0: bad tar header \(invalid header\)"):
        list(tarfmt.iter_entries(bytes(bad), "s.tar"))


def test_tar_reader_over_generated_shards_matches_tarfile():
    spec = GenSpec.from_mapping({"format": "tar", "modality": "images", "seed": 3, "num_samples": 40,
                                 "shard_size": "16 samples"})
    url = f"memory://fast-{uuid.uuid4().hex}"
    m = generate(spec, url, progress=False)
    backend = open_backend(url)
    reader = get_format("tar").reader(m)
    for shard in m.shards:
        data = backend.cat(shard.path)
        assert _our_listing(data) == _tarfile_listing(data)
        samples = list(reader.iter_samples(data, shard))
        assert len(samples) == shard.samples and len(samples) * 2 == len(_our_listing(data))
        pos = _headers(data)[3][0]
        bad = bytearray(data)
        bad[pos + 20] ^= 0xFF                                           # inside the name field
        with pytest.raises(IntegrityError, match=f"offset {pos}: bad tar header"):
            list(reader.iter_samples(bytes(bad), shard))


def test_npy_array_header_cache_matches_numpy():
    """npy_array caches parsed headers by their bytes: arrays that share one header, and arrays that
    differ only in dtype, shape or memory order, each come back as numpy.load reads them."""
    arrays = [np.arange(6, dtype="<u2"), np.arange(6, dtype="<u2") + 7, np.arange(6, dtype="<i4"),
              np.arange(12, dtype="<u2").reshape(3, 4), np.asfortranarray(np.arange(12, dtype="<f4").reshape(3, 4)),
              np.array(5, dtype="<i8"), np.zeros((0, 3), dtype="<u2")]
    for _ in range(2):                                      # second pass: every header from the cache
        for a in arrays:
            buf = io.BytesIO()
            np.save(buf, a)
            want = np.load(io.BytesIO(buf.getvalue()))
            got = tarfmt.npy_array(buf.getvalue())
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
            assert got.flags.f_contiguous == want.flags.f_contiguous
