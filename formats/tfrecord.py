"""`tfrecord`: TensorFlow's record framing with ``tf.train.Example`` payloads, no TensorFlow needed.

Record: u64 length | masked crc32c(length) | payload | masked crc32c(payload), all
little-endian.  Payloads are Examples encoded here by hand (a few protobuf fields):
images as ``image/encoded`` (bytes) + ``image/class/label`` (int64), tokens as ``tokens``
(one bytes value: the little-endian token array of the manifest's dtype).  Uncompressed
shards get a side index in the format of the PyPI ``tfrecord`` package ("offset length"
per line); ``zstd`` compresses the whole shard as one stream.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Iterator

import crc32c as _crc32c
import numpy as np

from iobench.errors import IntegrityError

from .base import FormatSpec, Piece, PieceRead, PieceReadInto, Reader, Sample, ShardLayout, Writer
from .compression import decompress, is_zstd, parse_compression

IMAGE_KEYS = ("image/encoded", "image", "jpg", "jpeg")
LABEL_KEYS = ("image/class/label", "label", "cls")
TOKEN_KEYS = ("tokens", "input_ids", "ids")


def masked_crc(data) -> int:
    crc = _crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(payload: bytes) -> bytes:
    n = struct.pack("<Q", len(payload))
    return n + struct.pack("<I", masked_crc(n)) + payload + struct.pack("<I", masked_crc(payload))


# -- a minimal protobuf codec for tf.train.Example ------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    n &= 0xFFFFFFFFFFFFFFFF   # negative int64 values are ten-byte varints
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def encode_example(features: dict[str, bytes | int | list]) -> bytes:
    """Features as bytes (one value), int (one int64) or a list of either kind."""
    entries = []
    for key in sorted(features):
        value = features[key]
        values = value if isinstance(value, list) else [value]
        if values and isinstance(values[0], (bytes, bytearray, memoryview)):
            inner = b"".join(_len_field(1, bytes(v)) for v in values)
            feature = _len_field(1, inner)                       # Feature.bytes_list
        else:
            packed = b"".join(_varint(int(v)) for v in values)
            feature = _len_field(3, _len_field(1, packed))       # Feature.int64_list (packed)
        entries.append(_len_field(1, _len_field(1, key.encode()) + _len_field(2, feature)))
    return _len_field(1, b"".join(entries))                      # Example.features


def _read_varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of each field; LEN values are memoryviews."""
    for num, wt, start, end in _fields_at(buf, 0, len(buf)):
        if wt == 0:
            yield num, wt, _read_varint(buf, start)[0]
        elif wt == 2:
            yield num, wt, buf[start:end]
        else:
            yield num, wt, bytes(buf[start:end])


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def decode_example(payload) -> dict[str, list]:
    """An Example's features as {name: [bytes...] | [int...] | [float...]}."""
    out: dict[str, list] = {}
    for num, _, features in _fields(memoryview(payload)):
        if num != 1:
            continue
        for fnum, _, entry in _fields(features):
            if fnum != 1:
                continue
            key, feature = "", b""
            for enum, _, v in _fields(entry):
                if enum == 1:
                    key = bytes(v).decode()
                elif enum == 2:
                    feature = v
            values: list = []
            for kind, _, lst in _fields(feature):
                for vnum, wt, v in _fields(lst):
                    if vnum != 1:
                        continue
                    if kind == 1:
                        values.append(bytes(v))
                    elif kind == 3:
                        if wt == 2:
                            p = 0
                            while p < len(v):
                                x, p = _read_varint(v, p)
                                values.append(_signed(x))
                        else:
                            values.append(_signed(v))
                    elif kind == 2:
                        values.extend(np.frombuffer(bytes(v), "<f4").tolist() if wt == 2 else
                                      [struct.unpack("<f", v)[0]])
            out[key] = values
    return out


def _fields_at(buf, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value start, value end) of each field in buf[start:end], as _fields walks them."""
    pos = start
    while pos < end:
        tag, pos = _read_varint(buf, pos)
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            _, p = _read_varint(buf, pos)
        elif wt == 2:
            ln, pos = _read_varint(buf, pos)
            p = pos + ln
        elif wt == 1:
            p = pos + 8
        elif wt == 5:
            p = pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wt}")
        yield num, wt, pos, min(p, end)
        pos = p


def _token_span(payload) -> tuple[int, int] | None:
    """(start, end) in ``payload`` of the bytes value TFRecordReader._sample takes as the tokens.

    Follows decode_example's choices: per key the last entry wins, the first of TOKEN_KEYS
    present is used, and its first bytes value.  None where that value is not a bytes value.
    """
    buf = memoryview(payload).cast("B")
    feats: dict[str, list | None] = {}
    for num, wt, s0, e0 in _fields_at(buf, 0, len(buf)):
        if num != 1 or wt != 2:
            if num == 1:
                return None
            continue
        for fnum, fwt, s1, e1 in _fields_at(buf, s0, e0):
            if fnum != 1:
                continue
            if fwt != 2:
                return None
            key, feature = "", None
            for enum, ewt, s2, e2 in _fields_at(buf, s1, e1):
                if enum == 1:
                    key = bytes(buf[s2:e2]).decode()
                elif enum == 2:
                    feature = (s2, e2) if ewt == 2 else None
            spans: list | None = []
            if feature is not None:
                for kind, kwt, s3, e3 in _fields_at(buf, *feature):
                    if kwt != 2:
                        spans = None
                        break
                    for vnum, vwt, s4, e4 in _fields_at(buf, s3, e3):
                        if vnum != 1:
                            continue
                        if kind != 1 or vwt != 2:
                            spans = None
                            break
                        spans.append((s4, e4))
                    if spans is None:
                        break
            feats[key] = spans
    key = next((k for k in TOKEN_KEYS if k in feats), None)
    if key is None or not feats[key]:
        return None
    return feats[key][0]


# -- format -------------------------------------------------------------------------------------

class TFRecordWriter(Writer):
    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        self._comp = parse_compression(self.compression)
        self._out = self._comp.stream_writer(f) if self._comp.enabled else f
        self._offsets = [0]

    def write(self, sample: Sample) -> None:
        if self.modality == "tokens":
            arr = np.ascontiguousarray(sample.data, dtype=np.dtype(self.token_dtype).newbyteorder("<"))
            payload = encode_example({"tokens": arr.tobytes()})
        else:
            payload = encode_example({"image/encoded": bytes(sample.data),
                                      "image/class/label": int(sample.label if sample.label is not None else -1)})
        rec = frame(payload)
        self._out.write(rec)
        self._offsets.append(self._offsets[-1] + len(rec))

    def finish(self) -> ShardLayout:
        n = len(self._offsets) - 1
        if self._comp.enabled:
            self._out.close()
            return ShardLayout(samples=n)
        index = "".join(f"{a} {b - a}\n" for a, b in zip(self._offsets, self._offsets[1:])).encode()
        return ShardLayout(samples=n, offsets=tuple(self._offsets), index_bytes=index)


def iter_records(data, where: str = "shard", base: int = 0) -> Iterator[tuple[int, memoryview]]:
    """(record offset, payload) of each record, checking both CRCs; ``data`` starts at byte
    ``base`` of the shard (offsets, in the results and in errors, are the shard's)."""
    mv = memoryview(data)
    pos, n = 0, len(mv)
    while pos < n:
        if pos + 12 > n:
            raise IntegrityError(f"{where}: offset {base + pos}: truncated record header")
        length = struct.unpack_from("<Q", mv, pos)[0]
        if struct.unpack_from("<I", mv, pos + 8)[0] != masked_crc(mv[pos:pos + 8]):
            raise IntegrityError(f"{where}: offset {base + pos}: bad length CRC")
        end = pos + 12 + length
        if end + 4 > n:
            raise IntegrityError(f"{where}: offset {base + pos}: record runs past the end of the shard")
        payload = mv[pos + 12:end]
        if struct.unpack_from("<I", mv, end)[0] != masked_crc(payload):
            raise IntegrityError(f"{where}: offset {base + pos}: bad payload CRC")
        yield base + pos, payload
        pos = end + 4


@dataclass(frozen=True)
class _Layout:
    """What a run of same-size token records shares: the framing header (length and its CRC) and the
    payload's bytes outside the token value (the Example structure), decoded once from one record."""

    head: np.ndarray        # 12 bytes: u64 length | masked crc32c of it
    length: int             # payload bytes
    a: int                  # token value's span in the record (framing included)
    b: int
    outside: np.ndarray     # the record's payload bytes outside [a, b), which every record must repeat
    dtype: np.dtype


def _fixed_rows(mv: memoryview, lay: _Layout, where: str, base: int) -> np.ndarray | None:
    """The records in ``mv`` (whole records, shard offset ``base``) as a (records, tokens) view of
    ``mv``, when each has ``lay``'s framing and structure; None when one does not (a different length
    or Example layout: decode record by record).  Checks what ``iter_records`` checks, on every record,
    with numpy over all of them at once (the payload CRCs: one crc32c call per record, no other
    per-record object); a bad CRC raises iter_records' IntegrityError, at the record's shard offset."""
    rec = 16 + lay.length
    total = len(mv)
    if total == 0 or total % rec:
        return None
    n = total // rec
    arr = np.frombuffer(mv, dtype=np.uint8).reshape(n, rec)
    if not (arr[:, :8] == lay.head[:8]).all():
        return None                                  # lengths differ: not this layout
    end = 12 + lay.length
    crc = np.fromiter((_crc32c.crc32c(mv[o:o + lay.length]) for o in range(12, total, rec)), dtype=np.uint64, count=n)
    masked = (((crc >> np.uint64(15)) | (crc << np.uint64(17))) + np.uint64(0xA282EAD8)) & np.uint64(0xFFFFFFFF)
    if not ((arr[:, 8:12] == lay.head[8:]).all()
            and (np.ascontiguousarray(arr[:, end:]).view("<u4")[:, 0] == masked).all()):
        for _ in iter_records(mv, where, base):   # raises the error iter_samples would, at its offset
            pass
        return None
    # Every payload must be the layout record's bytes outside the token value, so it decodes the same way.
    if not ((arr[:, 12:lay.a] == lay.outside[:lay.a - 12]).all() and (arr[:, lay.b:end] == lay.outside[lay.a - 12:]).all()):
        return None
    return arr[:, lay.a:lay.b].view(lay.dtype)


class TFRecordReader(Reader):
    def iter_samples(self, data, shard) -> Iterator[Sample]:
        if is_zstd(data):
            data = decompress(data)
        for j, (_, payload) in enumerate(iter_records(data, shard.path)):
            yield self._sample(shard.first_sample + j, payload, shard.path)

    def count_samples(self, data, shard) -> int:
        if is_zstd(data):
            data = decompress(data)
        return sum(1 for _ in iter_records(data, shard.path))

    def _layout(self, mv: memoryview, index: int, where: str) -> _Layout | None:
        """The layout of the record at the start of ``mv`` (sample ``index``) if it is a token record
        whose tokens are one bytes value (what the generator writes); None otherwise (images, int64
        token lists, a malformed record: those are decoded record by record, which reports errors)."""
        if self.manifest.modality != "tokens" or len(mv) < 16:
            return None
        length = struct.unpack_from("<Q", mv, 0)[0]
        if length == 0 or 16 + length > len(mv):
            return None
        payload = mv[12:12 + length]
        try:
            self._sample(index, payload, where)   # the per-sample decode of this record
            span = _token_span(payload)
        except Exception:  # noqa: BLE001 — malformed: the per-record path reports it the usual way
            return None
        dtype = np.dtype(self.manifest.spec.get("token_dtype", "uint16")).newbyteorder("<")
        if span is None or span[1] == span[0] or (span[1] - span[0]) % dtype.itemsize:
            return None
        rec = np.frombuffer(mv, dtype=np.uint8, count=12 + length)
        a, b = 12 + span[0], 12 + span[1]
        return _Layout(head=rec[:12].copy(), length=length, a=a, b=b,
                       outside=np.concatenate([rec[12:a], rec[b:12 + length]]), dtype=dtype)

    def tokens(self, data, shard) -> np.ndarray | None:
        """The shard's tokens as one (samples, seq_len) array, or None to use ``iter_samples``.

        Applies when every record has the same length and the same bytes outside the token
        value (what the generator writes for fixed-length samples): the records are then
        rows of one uint8 matrix (``_fixed_rows``, which checks both CRCs of every record).
        None when the shape does not fit: images, variable lengths, int64 token lists, an
        empty shard.  Rows equal ``iter_samples``' arrays.
        """
        if is_zstd(data):
            data = decompress(data)
        mv = memoryview(data).cast("B")
        lay = self._layout(mv, shard.first_sample, shard.path)
        rows = _fixed_rows(mv, lay, shard.path, 0) if lay is not None else None
        return None if rows is None else np.ascontiguousarray(rows)

    def stream_arrays(self) -> bool:
        """Whether ``pieces(..., arrays=True)`` cuts (records, seq_len) arrays: token shards that ``iobench gen`` wrote with one ``seq_len``
        (its manifest says so; not ``iobench index`` data).  A stream worker then keeps rows in its row
        store and a batch is one gather, not one Sample object per record and a stack per batch."""
        return self.generated_token_rows()

    def pieces(self, shard, read: PieceRead, size: int, arrays: bool = False,
               read_into: PieceReadInto | None = None) -> Iterator[Piece]:
        """With ``arrays`` (see ``stream_arrays``): the shard streamed in pieces of whole records of
        about ``size`` bytes (at least one record), each as one (records, seq_len) token array, not
        one Sample per record; otherwise the default pieces (runs of records by their byte ranges).

        Records of the shard's first layout are cut out with numpy (``_fixed_rows``: both CRCs of every
        record checked); a piece that does not fit is decoded record by record, and must still give
        rows of ``spec.seq_len`` tokens.  A shard without a record index (zstd: one stream per
        shard) is one piece."""
        if not arrays:
            yield from super().pieces(shard, read, size)
            return
        seq_len = int(self.manifest.spec["seq_len"])
        lay: list = []   # the shard's layout, from its first record

        def rows_of(data, base: int) -> np.ndarray:
            mv = memoryview(data).cast("B")
            if not lay:
                lay.append(self._layout(mv, shard.first_sample, shard.path))
            rows = _fixed_rows(mv, lay[0], shard.path, base) if lay[0] is not None else None
            if rows is None:
                index = shard.first_sample + (int(np.searchsorted(offs, base)) if offs is not None else 0)
                samples = [self._sample(index + j, p, shard.path) for j, (_, p) in enumerate(iter_records(mv, shard.path, base))]
                bad = next((s for s in samples if s.data.shape != (seq_len,)), None)
                if bad is not None:
                    raise IntegrityError(f"{shard.path}: sample {bad.index} has {bad.data.shape[0]} tokens, not "
                                         f"{seq_len} as the manifest's spec.seq_len says (use --access block, or "
                                         "iobench index)")
                dtype = np.dtype(self.manifest.spec.get("token_dtype", "uint16")).newbyteorder("<")
                rows = np.stack([s.data for s in samples]).astype(dtype, copy=False) if samples else \
                    np.empty((0, seq_len), dtype=dtype)
            elif rows.shape[1] != seq_len:
                raise IntegrityError(f"{shard.path}: offset {base}: records hold {rows.shape[1]} tokens, not "
                                     f"{seq_len} as the manifest's spec.seq_len says (use --access block, or "
                                     "iobench index)")
            return rows

        offs = None if shard.offsets is None else np.asarray(shard.offsets, dtype=np.int64)
        if offs is None:
            data, t, n = read(0, shard.bytes, True)
            t0 = time.perf_counter()
            rows = rows_of(decompress(data) if is_zstd(data) else data, 0)
            yield rows, t, n, time.perf_counter() - t0
            return
        i, last, first = 0, len(offs) - 1, True
        while i < last:
            # whole records from i up to ``size`` bytes (at least record i)
            j = max(i + 1, min(last, int(np.searchsorted(offs, offs[i] + size, side="right")) - 1))
            a = int(offs[i])
            data, t, n = read(a, int(offs[j]) - a, first)
            first = False
            t0 = time.perf_counter()
            rows = rows_of(data, a)
            if len(rows) != j - i:
                raise IntegrityError(f"{shard.path}: offset {a}: {len(rows)} records where the index names {j - i}")
            yield rows, t, n, time.perf_counter() - t0
            i = j

    def _sample(self, index: int, payload, where: str) -> Sample:
        feats = decode_example(payload)
        if self.manifest.modality == "tokens":
            key = next((k for k in TOKEN_KEYS if k in feats), None)
            if key is None:
                raise IntegrityError(f"{where}: sample {index}: no token feature (have {sorted(feats)})")
            vals = feats[key]
            dtype = np.dtype(self.manifest.spec.get("token_dtype", "uint16")).newbyteorder("<")
            if vals and isinstance(vals[0], bytes):
                return Sample(index=index, data=np.frombuffer(vals[0], dtype=dtype))
            return Sample(index=index, data=np.asarray(vals, dtype=dtype))
        key = next((k for k in IMAGE_KEYS if k in feats), None)
        if key is None:
            raise IntegrityError(f"{where}: sample {index}: no image feature (have {sorted(feats)})")
        lkey = next((k for k in LABEL_KEYS if k in feats), None)
        label = int(feats[lkey][0]) if lkey and feats[lkey] else None
        return Sample(index=index, data=feats[key][0], label=label)

    def sample_from_range(self, shard, i, record) -> Sample:
        recs = list(iter_records(record, shard.path))
        if len(recs) != 1:
            raise IntegrityError(f"{shard.path}: sample {i}: range holds {len(recs)} records, expected 1")
        return self._sample(shard.first_sample + i, recs[0][1], shard.path)


FORMAT = FormatSpec(name="tfrecord", extension=".tfrecord", writer=TFRecordWriter, reader=TFRecordReader,
                    indexable=True)
