"""`raw`: iobench's own flat binary shards.

Token shard: a 64-byte header, then the contiguous token array (memory-mappable and
range-readable when uncompressed; with ``zstd`` the array is one zstd stream).

    magic "IOBTOKS\\0" | version u16 | itemsize u8 | endianness u8 ('<') | compression u8 |
    3 pad | seq_len u32 | vocab_size u32 | token_count u64 (all ones: "to end of file") | pad

Image shard: a 64-byte header, an index of ``count + 1`` absolute u64 offsets, then the
records; a record is a little-endian int32 label followed by the JPEG bytes (zstd-compressed
per record with ``zstd``, so the index stays valid).

    magic "IOBIMGS\\0" | version u16 | compression u8 | 5 pad | count u64 | pad
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from typing import Iterator

import numpy as np

from iobench.errors import IntegrityError

from .base import FormatSpec, Reader, Sample, ShardLayout, Writer
from .compression import decompress, parse_compression

HEADER_BYTES = 64
TOKENS_MAGIC = b"IOBTOKS\0"
IMAGES_MAGIC = b"IOBIMGS\0"
VERSION = 1
_TOK = struct.Struct("<8sHBBB3xIIQ")
_IMG = struct.Struct("<8sHB5xQ")
_TO_EOF = 2**64 - 1
_SPOOL_BYTES = 16 * 2**20   # image records beyond this spill to a temp file (bounded memory)


def _pad(b: bytes) -> bytes:
    return b + b"\0" * (HEADER_BYTES - len(b))


class RawWriter(Writer):
    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        self._comp = parse_compression(self.compression)
        self._count = 0
        if self.modality == "tokens":
            self._dtype = np.dtype(self.token_dtype).newbyteorder("<")
            tokens = _TO_EOF if self.num_samples is None or not self.seq_len else self.num_samples * self.seq_len
            f.write(_pad(_TOK.pack(TOKENS_MAGIC, VERSION, self._dtype.itemsize, ord("<"), int(self._comp.enabled),
                                   self.seq_len, self.vocab_size, tokens)))
            self._out = self._comp.stream_writer(f) if self._comp.enabled else f
            self._expected = None if tokens == _TO_EOF else tokens
            self._written_tokens = 0
        else:
            # The index precedes the records, so records wait in a spool until the count is known.
            self._spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)
            self._ends: list[int] = []

    def write(self, sample: Sample) -> None:
        if self.modality == "tokens":
            arr = np.ascontiguousarray(sample.data, dtype=self._dtype)
            self._out.write(memoryview(arr).cast("B"))
            self._written_tokens += arr.size
        else:
            payload = self._comp.compress(sample.data) if self._comp.enabled else sample.data
            self._spool.write(struct.pack("<i", int(sample.label if sample.label is not None else -1)))
            self._spool.write(payload)
            self._ends.append(self._spool.tell())
        self._count += 1

    def write_batch(self, first_index: int, tokens) -> None:
        if self.modality != "tokens":
            return super().write_batch(first_index, tokens)
        arr = np.ascontiguousarray(tokens, dtype=self._dtype)
        self._out.write(memoryview(arr).cast("B"))
        self._written_tokens += arr.size
        self._count += arr.shape[0]

    def finish(self) -> ShardLayout:
        if self.modality == "tokens":
            if self._comp.enabled:
                self._out.close()   # ends the zstd frame; f stays open
            if self._expected is not None and self._written_tokens != self._expected:
                raise ValueError(f"raw token shard promised {self._expected} tokens, got {self._written_tokens}")
            return ShardLayout(samples=self._count)
        n = self._count
        base = HEADER_BYTES + 8 * (n + 1)
        offsets = [base] + [base + e for e in self._ends]
        self.f.write(_pad(_IMG.pack(IMAGES_MAGIC, VERSION, int(self._comp.enabled), n)))
        self.f.write(np.asarray(offsets, dtype="<u8").tobytes())
        self._spool.seek(0)
        shutil.copyfileobj(self._spool, self.f, 4 * 2**20)
        self._spool.close()
        return ShardLayout(samples=n, offsets=tuple(offsets))


class RawReader(Reader):
    def iter_samples(self, data, shard) -> Iterator[Sample]:
        mv = memoryview(data)
        magic = bytes(mv[:8])
        first = shard.first_sample
        if magic == TOKENS_MAGIC:
            tokens = self.tokens(mv, shard)
            for j in range(tokens.shape[0]):
                yield Sample(index=first + j, data=tokens[j])
        elif magic == IMAGES_MAGIC:
            _, _, compressed, n = _IMG.unpack_from(mv, 0)
            offs = np.frombuffer(mv, dtype="<u8", count=n + 1, offset=HEADER_BYTES)
            for j in range(n):
                yield self._record(first + j, mv[int(offs[j]):int(offs[j + 1])], bool(compressed), shard)
        else:
            raise IntegrityError(f"{shard.path}: offset 0: not a raw iobench shard (magic {magic!r})")

    def tokens(self, data, shard) -> np.ndarray:
        """The shard's tokens as a (samples, seq_len) array (a view of ``data`` when uncompressed)."""
        mv = memoryview(data)
        magic, version, itemsize, endian, compressed, seq_len, _vocab, count = _TOK.unpack_from(mv, 0)
        if magic != TOKENS_MAGIC:
            raise IntegrityError(f"{shard.path}: offset 0: not a raw token shard (magic {magic!r})")
        dtype = np.dtype({2: "u2", 4: "u4", 8: "u8", 1: "u1"}[itemsize]).newbyteorder(chr(endian))
        body = decompress(mv[HEADER_BYTES:]) if compressed else mv[HEADER_BYTES:]
        if len(body) % itemsize:
            raise IntegrityError(f"{shard.path}: offset {HEADER_BYTES + len(body)}: truncated token array")
        arr = np.frombuffer(body, dtype=dtype)
        if count != _TO_EOF and arr.size != count:
            raise IntegrityError(f"{shard.path}: offset {HEADER_BYTES + arr.size * itemsize}: "
                                 f"header says {count} tokens, found {arr.size}")
        if seq_len:
            return arr[: arr.size - arr.size % seq_len].reshape(-1, seq_len)
        return arr.reshape(1, -1)

    def check_records(self, head, shard, records: int) -> None:
        """The checks ``tokens`` makes, for a token shard whose records were read apart from its
        header (straight into a loader block): ``head`` is the header, ``records`` the rows read."""
        magic, _v, itemsize, endian, compressed, seq_len, _vocab, count = _TOK.unpack_from(head, 0)
        if magic != TOKENS_MAGIC:
            raise IntegrityError(f"{shard.path}: offset 0: not a raw token shard (magic {magic!r})")
        fixed = self.fixed_records(shard)
        if compressed or fixed is None or itemsize != fixed[2].itemsize or chr(endian) not in "<=" \
                or seq_len * itemsize != fixed[1]:
            raise IntegrityError(f"{shard.path}: offset 0: header (itemsize {itemsize}, seq_len {seq_len}, "
                                 f"compressed {compressed}) does not match the manifest's token layout")
        if count != _TO_EOF and count != records * seq_len:
            raise IntegrityError(f"{shard.path}: offset {HEADER_BYTES + records * fixed[1]}: "
                                 f"header says {count} tokens, found {records * seq_len}")

    def _record(self, index: int, rec, compressed: bool, shard) -> Sample:
        if len(rec) < 4:
            raise IntegrityError(f"{shard.path}: sample {index}: record shorter than its label")
        label = struct.unpack_from("<i", rec, 0)[0]
        payload = decompress(rec[4:]) if compressed else bytes(rec[4:])
        return Sample(index=index, data=payload, label=label)

    def sample_range(self, shard, i):
        if self.manifest.modality == "tokens":
            if self.manifest.compression != "none":
                return None
            spec = self.manifest.spec
            if not spec.get("seq_len"):
                return None
            itemsize = np.dtype(spec.get("token_dtype", "uint16")).itemsize
            n = int(spec["seq_len"]) * itemsize
            if not 0 <= i < shard.samples:
                return None
            return HEADER_BYTES + i * n, n
        return super().sample_range(shard, i)

    def fixed_records(self, shard) -> tuple[int, int, np.dtype] | None:
        """(offset of record 0, record bytes, dtype) when every record is one fixed-size token row:
        a loader may then cut rows arithmetically instead of asking per sample (same bytes, same values)."""
        r = self.sample_range(shard, 0) if self.manifest.modality == "tokens" else None
        if r is None:
            return None
        dtype = np.dtype(self.manifest.spec.get("token_dtype", "uint16")).newbyteorder("<")
        return r[0], r[1], dtype

    def sample_from_range(self, shard, i, record) -> Sample:
        if self.manifest.modality == "tokens":
            spec = self.manifest.spec
            dtype = np.dtype(spec.get("token_dtype", "uint16")).newbyteorder("<")
            return Sample(index=shard.first_sample + i, data=np.frombuffer(record, dtype=dtype))
        return self._record(shard.first_sample + i, memoryview(record), self.manifest.compression != "none", shard)


FORMAT = FormatSpec(name="raw", extension=".bin", writer=RawWriter, reader=RawReader, indexable=True,
                    compression_scope=(("tokens", "shard"), ("images", "sample")))
