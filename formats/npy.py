"""`npy`: numpy ``.npy`` files (``np.save``), read by header offset and ranged reads.

A ``.npy`` file is a header (magic, version, a dict of dtype, order and shape, padded to 64
bytes) followed by the array's bytes, so samples are byte ranges of the file and nothing is
parsed per sample:

- tokens: a 2-D C-order array of a token dtype (uint16, uint32, int32, int64) holds one
  sample per row; a 1-D one holds one sample (a document of any length);
- records (any other array, e.g. a DLIO/unet3d volume): the file is one sample, the
  array's bytes after the header.

``iobench gen --format npy`` writes token rows as one (samples, seq_len) array per shard
(``np.load`` reads it back) and records/images one sample per file (a 1-D uint8 array of
the sample's bytes: use ``--shard-size "1 samples"``).  Every shard's per-sample offsets go
in the manifest (the header's length plus whole rows), so ``map`` reads one row with one
ranged read, and ``block``/``stream`` cut rows arithmetically.  No compression (numpy has
none).
"""

from __future__ import annotations

import io
from typing import Iterator

import numpy as np

from iobench.errors import ConfigError, IntegrityError

from .base import FormatSpec, Reader, Sample, ShardLayout, Writer, agree

TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")
MAGIC = b"\x93NUMPY"
# Enough bytes for any version-1 header numpy writes for arrays of up to a few dimensions;
# a longer header (version 2/3, a big structured dtype) is read again in full.
HEAD_PROBE = 4096


def header_length(head: bytes, where: str) -> int:
    """Bytes before the array data, from the first 12 bytes of a ``.npy`` file."""
    if len(head) < 10 or head[:6] != MAGIC:
        raise IntegrityError(f"{where}: offset 0: not a .npy file (magic {bytes(head[:6])!r})")
    major = head[6]
    if major == 1:
        return 10 + int.from_bytes(head[8:10], "little")
    if major in (2, 3) and len(head) >= 12:
        return 12 + int.from_bytes(head[8:12], "little")
    raise IntegrityError(f"{where}: offset 6: unknown .npy version {major}")


# Parsed headers by their bytes: a dataset's files mostly share dtype and shape, and numpy's header
# parser (ast.literal_eval) costs more than the rest of reading a small file.
_PARSED: dict[bytes, tuple[np.dtype, tuple[int, ...], bool, int]] = {}


def parse_header(head: bytes, where: str) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """(dtype, shape, fortran order, header length) of a ``.npy`` file whose first bytes are ``head``."""
    n = header_length(head, where)
    if len(head) < n:
        raise IntegrityError(f"{where}: offset {len(head)}: .npy header runs to {n}, file has {len(head)} bytes")
    key = bytes(head[:n])
    got = _PARSED.get(key)
    if got is None:
        got = _parse_header(key, where)
        if len(_PARSED) >= 1024:
            _PARSED.clear()
        _PARSED[key] = got
    return got


def _parse_header(head: bytes, where: str) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    n = len(head)
    buf = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(buf)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(buf)
    except ValueError as e:
        raise IntegrityError(f"{where}: offset 8: bad .npy header ({e})") from None
    if dtype.hasobject:
        raise IntegrityError(f"{where}: .npy array holds Python objects (pickles), not data")
    return dtype, tuple(shape), bool(fortran), n


def is_token_array(dtype: np.dtype, shape: tuple[int, ...]) -> bool:
    """Whether an array reads as token samples (rows of a 2-D array, or one 1-D document)."""
    return dtype.kind in "ui" and dtype.newbyteorder("=").name in TOKEN_DTYPES and len(shape) in (1, 2)


def layout(dtype: np.dtype, shape: tuple[int, ...], fortran: bool, head_len: int, modality: str
           ) -> tuple[int, tuple[int, ...] | None]:
    """(samples, offsets or None) of an array file read as ``modality``: the one rule the
    index, the writer and the reader share."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if modality == "tokens":
        if len(shape) == 2 and fortran and min(shape) > 1:
            return shape[0], None      # rows are not contiguous: whole-file reads only
        if len(shape) == 2:
            row = shape[1] * dtype.itemsize
            return shape[0], tuple(head_len + i * row for i in range(shape[0] + 1))
        if len(shape) == 1:
            return 1, (head_len, head_len + nbytes)
        raise IntegrityError(f"token .npy arrays are 1-D or 2-D, this one has shape {shape}")
    return 1, (head_len, head_len + nbytes)


def _header_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    return buf.getvalue()


def scan(backend, rel: str, facts: dict, modality: str | None) -> tuple[int, tuple | None, None, str]:
    """``iobench index``: the header only (one short ranged read): dtype and shape give the rows' offsets."""
    head = backend.cat(rel, 0, HEAD_PROBE)
    n = header_length(head[:12], rel)
    if n > len(head):
        head = backend.cat(rel, 0, n)
    dtype, shape, fortran, hl = parse_header(head, rel)
    size = backend.size(rel)
    need = hl + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size != need:
        raise IntegrityError(f"{rel}: offset {min(size, need)}: .npy header says {need} bytes, the file holds {size}")
    seen = modality or ("tokens" if is_token_array(dtype, shape) else "records")
    if seen == "tokens":
        if not is_token_array(dtype, shape):
            raise ConfigError("--modality", f"{rel} holds a {dtype.str}{list(shape)} array, not token rows",
                              "index it as --modality records (one sample per file)")
        agree(facts, "npy_dtype", dtype.str, rel)
        agree(facts, "token_dtype", dtype.newbyteorder("=").name, rel)
    samples, offsets = layout(dtype, shape, fortran, hl, seen)
    return samples, offsets, None, seen


class NpyWriter(Writer):
    """What ``np.save`` writes: the version-1.0 header numpy makes for the array, then its bytes."""

    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        self._count = 0
        self._pending: bytes | None = None
        if self.modality == "tokens":
            if self.num_samples is None or not self.seq_len:
                raise ConfigError("gen.shard_size", "the npy format writes each shard's header first",
                                  "generate with a fixed --seq-len")
            self._dtype = np.dtype(self.token_dtype).newbyteorder("<")
            head = _header_bytes(self._dtype, (self.num_samples, self.seq_len))
            self._head = len(head)
            f.write(head)
        elif self.num_samples is not None and self.num_samples != 1:
            raise ConfigError("gen.shard_size", f"npy {self.modality} files hold one sample each, "
                              f"not {self.num_samples}", "use --shard-size '1 samples'")

    def write(self, sample: Sample) -> None:
        if self.modality == "tokens":
            self.write_batch(sample.index, np.asarray(sample.data).reshape(1, -1))
            return
        if self._count:
            raise ConfigError("gen.shard_size", f"npy {self.modality} files hold one sample each",
                              "use --shard-size '1 samples'")
        self._pending = bytes(sample.data)
        self._count = 1

    def write_batch(self, first_index: int, tokens) -> None:
        if self.modality != "tokens":
            return super().write_batch(first_index, tokens)
        arr = np.ascontiguousarray(tokens, dtype=self._dtype)
        if arr.ndim != 2 or arr.shape[1] != self.seq_len:
            raise ValueError(f"npy token rows must be {self.seq_len} long, got shape {arr.shape}")
        self.f.write(memoryview(arr).cast("B"))
        self._count += arr.shape[0]

    def finish(self) -> ShardLayout:
        if self.modality == "tokens":
            if self._count != self.num_samples:
                raise ValueError(f"npy shard promised {self.num_samples} rows, got {self._count}")
            row = self.seq_len * self._dtype.itemsize
            return ShardLayout(samples=self._count,
                               offsets=tuple(self._head + i * row for i in range(self._count + 1)))
        payload = self._pending or b""
        head = _header_bytes(np.dtype(np.uint8), (len(payload),))
        self.f.write(head)
        self.f.write(payload)
        return ShardLayout(samples=self._count, offsets=(len(head), len(head) + len(payload)))


class NpyReader(Reader):
    def _dtype(self) -> np.dtype:
        # ``iobench index`` records the files' own dtype (byte order included); gen writes little-endian
        spec = self.manifest.spec or {}
        return np.dtype(spec.get("npy_dtype") or np.dtype(spec.get("token_dtype", "uint16")).newbyteorder("<"))

    def _parse(self, data, shard) -> tuple[np.dtype, tuple[int, ...], bool, int]:
        mv = memoryview(data)
        n = header_length(bytes(mv[:12]), shard.path)
        dtype, shape, fortran, hl = parse_header(bytes(mv[:n]), shard.path)
        need = hl + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(mv) != need:
            raise IntegrityError(f"{shard.path}: offset {min(len(mv), need)}: .npy header says {need} bytes, "
                                 f"file holds {len(mv)}")
        return dtype, shape, fortran, hl

    def tokens(self, data, shard) -> np.ndarray | None:
        """The shard's token rows as one (samples, seq_len) view of ``data`` (no copy)."""
        if self.manifest.modality != "tokens":
            return None
        dtype, shape, fortran, hl = self._parse(data, shard)
        if fortran and len(shape) == 2 and min(shape) > 1:
            return None
        arr = np.frombuffer(data, dtype=dtype, offset=hl, count=int(np.prod(shape, dtype=np.int64)))
        return arr.reshape(1, -1) if len(shape) == 1 else arr.reshape(shape)

    def iter_samples(self, data, shard) -> Iterator[Sample]:
        dtype, shape, fortran, hl = self._parse(data, shard)
        first = shard.first_sample
        if self.manifest.modality == "tokens":
            if not is_token_array(dtype, shape):
                raise IntegrityError(f"{shard.path}: .npy array {dtype.name}{list(shape)} is not token rows")
            arr = np.lib.format.read_array(io.BytesIO(bytes(data)), allow_pickle=False) if fortran else \
                np.frombuffer(data, dtype=dtype, offset=hl, count=int(np.prod(shape, dtype=np.int64))).reshape(shape)
            rows = arr.reshape(1, -1) if arr.ndim == 1 else arr
            for j in range(rows.shape[0]):
                yield Sample(index=first + j, data=rows[j])
            return
        # the record as a uint8 view of the shard's buffer: no copy (the batch's collate is the one copy)
        yield Sample(index=first, data=np.frombuffer(data, dtype=np.uint8, offset=hl))

    def count_samples(self, data, shard) -> int:
        dtype, shape, fortran, hl = self._parse(data, shard)
        return layout(dtype, shape, fortran, hl, self.manifest.modality)[0]

    def fixed_records(self, shard) -> tuple[int, int, np.dtype] | None:
        """(offset of row 0, row bytes, dtype): token rows sit at fixed strides after the header."""
        if self.manifest.modality != "tokens" or shard.offsets is None or len(shard.offsets) < 2:
            return None
        return shard.offsets[0], shard.offsets[1] - shard.offsets[0], self._dtype()

    def check_records(self, head, shard, records: int) -> None:
        """The header checks ``tokens`` makes, for rows read apart from the header (loader blocks)."""
        dtype, shape, fortran, hl = parse_header(bytes(head), shard.path)
        fixed = self.fixed_records(shard)
        rows = shape[0] if len(shape) == 2 else 1
        row_bytes = (shape[-1] if shape else 1) * dtype.itemsize
        if fixed is None or hl != fixed[0] or dtype.str != fixed[2].str or rows != records \
                or row_bytes != fixed[1] or (fortran and len(shape) == 2 and min(shape) > 1):
            raise IntegrityError(f"{shard.path}: offset 0: .npy header ({dtype.str}{list(shape)}, header "
                                 f"{hl} bytes) does not match the manifest's {records} rows")

    def sample_from_range(self, shard, i, record) -> Sample:
        if self.manifest.modality == "tokens":
            return Sample(index=shard.first_sample + i, data=np.frombuffer(record, dtype=self._dtype()))
        return Sample(index=shard.first_sample + i, data=np.frombuffer(record, dtype=np.uint8))


FORMAT = FormatSpec(name="npy", extension=".npy", writer=NpyWriter, reader=NpyReader, indexable=True,
                    compressions=("none",), scan=scan)
