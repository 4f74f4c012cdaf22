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
from typing import Iterator

import crc32c as _crc32c
import numpy as np

from iobench.errors import IntegrityError

from .base import FormatSpec, Reader, Sample, ShardLayout, Writer
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


def iter_records(data, where: str = "shard") -> Iterator[tuple[int, memoryview]]:
    """(record offset, payload) of each record, checking both CRCs."""
    mv = memoryview(data)
    pos, n = 0, len(mv)
    while pos < n:
        if pos + 12 > n:
            raise IntegrityError(f"{where}: offset {pos}: truncated record header")
        length = struct.unpack_from("<Q", mv, pos)[0]
        if struct.unpack_from("<I", mv, pos + 8)[0] != masked_crc(mv[pos:pos + 8]):
            raise IntegrityError(f"{where}: offset {pos}: bad length CRC")
        end = pos + 12 + length
        if end + 4 > n:
            raise IntegrityError(f"{where}: offset {pos}: record runs past the end of the shard")
        payload = mv[pos + 12:end]
        if struct.unpack_from("<I", mv, end)[0] != masked_crc(payload):
            raise IntegrityError(f"{where}: offset {pos}: bad payload CRC")
        yield pos, payload
        pos = end + 4


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

    def tokens(self, data, shard) -> np.ndarray | None:
        """The shard's tokens as one (samples, seq_len) array, or None to use ``iter_samples``.

        Applies when every record has the same length and the same bytes outside the token
        value (what the generator writes for fixed-length samples): the records are then
        rows of one uint8 matrix.  Checks what ``iter_records`` checks, every record: the
        length and its CRC (vectorised; equal lengths have equal CRCs) and the payload CRC
        (crc32c per record), and that all payloads match the first one's Example structure,
        which is decoded as ``iter_samples`` decodes it.  A bad CRC raises the same
        IntegrityError as ``iter_samples``.  None when the shape does not fit: images,
        variable lengths, int64 token lists, an empty shard.  Rows equal ``iter_samples``' arrays.
        """
        if self.manifest.modality != "tokens":
            return None
        if is_zstd(data):
            data = decompress(data)
        mv = memoryview(data).cast("B")
        total = len(mv)
        if total < 16:
            return None
        length = struct.unpack_from("<Q", mv, 0)[0]
        rec = 16 + length
        if length == 0 or total % rec:
            return None
        n = total // rec
        arr = np.frombuffer(mv, dtype=np.uint8).reshape(n, rec)
        if not (arr[:, :8] == arr[0, :8]).all():
            return None                                  # lengths differ: not fixed-size records
        if not (np.ascontiguousarray(arr[:, 8:12]).view("<u4")[:, 0] == masked_crc(mv[0:8])).all():
            return self._integrity_error(mv, shard)
        crc = np.fromiter((_crc32c.crc32c(mv[o:o + length]) for o in range(12, total, rec)),
                          dtype=np.uint64, count=n)
        masked = (((crc >> np.uint64(15)) | (crc << np.uint64(17))) + np.uint64(0xA282EAD8)) & np.uint64(0xFFFFFFFF)
        if not (np.ascontiguousarray(arr[:, 12 + length:]).view("<u4")[:, 0] == masked).all():
            return self._integrity_error(mv, shard)
        first = mv[12:12 + length]
        try:
            self._sample(shard.first_sample, first, shard.path)   # the per-sample decode of record 0
            span = _token_span(first)
        except Exception:  # noqa: BLE001 — malformed: iter_samples reports it the usual way
            return None
        dtype = np.dtype(self.manifest.spec.get("token_dtype", "uint16")).newbyteorder("<")
        if span is None or span[1] == span[0] or (span[1] - span[0]) % dtype.itemsize:
            return None
        a, b = 12 + span[0], 12 + span[1]
        # Every payload must be record 0's bytes outside the token value, so it decodes the same way.
        if not ((arr[:, 12:a] == arr[0, 12:a]).all() and (arr[:, b:12 + length] == arr[0, b:12 + length]).all()):
            return None
        return np.ascontiguousarray(arr[:, a:b]).view(dtype)

    @staticmethod
    def _integrity_error(mv, shard) -> None:
        for _ in iter_records(mv, shard.path):   # raises the error iter_samples would, at its offset
            pass
        return None

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
