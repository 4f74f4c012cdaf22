"""`hdf5`: HDF5 files through h5py, one dataset of samples per file (DLIO's unet3d/cosmoflow style).

A file holds one array dataset whose first axis is the sample: ``tokens`` (samples, seq_len)
of token ids, or ``records`` (samples, ...) of any dtype — DLIO's generator writes
``records`` (samples, d1, d2) uint8 plus a ``labels`` dataset — or, for samples of varying
size (JPEGs), a variable-length uint8 dataset with ``labels``.

Stored contiguously and unfiltered (h5py's default), a sample is a byte range of the file
(the dataset's data offset plus whole rows): ``map`` reads one row with one ranged read and
``block``/``stream`` cut token rows arithmetically, with no HDF5 parse per sample.  Chunked
or compressed datasets (DLIO's ``enable_chunking``, gzip) have no such ranges: the file is
read whole and h5py decodes it (``map`` falls back to ``stream``).  Labels are delivered
only for variable-length image datasets: a fixed-row sample is its row's bytes.

``iobench index`` reads only the metadata (h5py over ranged reads): the sample dataset is
the one named ``tokens``, ``input_ids``, ``records``, ``x``, ``data`` or ``images``, else the
largest.  A file whose other datasets all differ from its first-axis length (CosmoFlow's
``full`` volume beside its ``unitPar`` targets) is one sample, the whole dataset.  ``iobench gen --format hdf5`` writes ``tokens`` / ``records`` (fixed-size records)
contiguously, or variable-length ``records`` + ``labels`` (images, records of varying size),
with no timestamps, so a seed gives byte-identical files.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from typing import Iterator

import h5py
import numpy as np

from iobench.errors import IntegrityError

from .base import FormatSpec, Reader, Sample, ShardLayout, Writer, agree

SIGNATURE = b"\x89HDF\r\n\x1a\n"
PREFERRED = ("tokens", "input_ids", "records", "x", "data", "images")
LABELS = ("labels", "label", "y")
TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")


def _pick(f: "h5py.File", where: str) -> str:
    arrays = {k: v for k, v in f.items() if isinstance(v, h5py.Dataset) and v.ndim >= 1}
    for name in PREFERRED:
        if name in arrays:
            return name
    candidates = [k for k in arrays if k not in LABELS]
    if not candidates:
        raise IntegrityError(f"{where}: no array dataset at the file's top level (has {sorted(f)})")
    return max(candidates, key=lambda k: (arrays[k].size * arrays[k].dtype.itemsize, k))


def _is_vlen_bytes(d: "h5py.Dataset") -> bool:
    base = h5py.check_vlen_dtype(d.dtype)
    return base is not None and np.dtype(base).kind in "ui" and np.dtype(base).itemsize == 1


def _is_tokens(d: "h5py.Dataset") -> bool:
    return d.ndim == 2 and d.dtype.kind in "ui" and d.dtype.newbyteorder("=").name in TOKEN_DTYPES


def row_offsets(d: "h5py.Dataset") -> tuple[int, ...] | None:
    """Per-sample byte boundaries of a contiguous, unfiltered, allocated dataset; else None."""
    if d.chunks is not None or d.compression is not None or h5py.check_vlen_dtype(d.dtype) is not None:
        return None
    off = d.id.get_offset()
    if off is None:
        return None
    row = int(np.prod(d.shape[1:], dtype=np.int64)) * d.dtype.itemsize
    return tuple(int(off) + i * row for i in range(d.shape[0] + 1))


def scan(backend, rel: str, facts: dict, modality: str | None) -> tuple[int, tuple | None, None, str]:
    """``iobench index``: the file's metadata only (h5py reads it with ranged reads)."""
    from .base import MODALITIES

    with backend.open(rel, "rb") as fo:
        try:
            f = h5py.File(fo, "r")
        except OSError as e:
            raise IntegrityError(f"{rel}: offset 0: not a readable HDF5 file ({e})") from None
        with f:
            name = _pick(f, rel)
            d = f[name]
            if modality is None:
                if _is_tokens(d):
                    modality = "tokens"
                elif _is_vlen_bytes(d) and d.shape[0] and bytes(np.asarray(d[0])[:3]) in (b"\xff\xd8\xff", b"\x89PN"):
                    modality = "images"
                else:
                    modality = "records"
            assert modality in MODALITIES
            if modality == "tokens" and not _is_tokens(d):
                from iobench.errors import ConfigError

                raise ConfigError("--modality", f"{rel}: dataset {name!r} is {d.dtype}{list(d.shape)}, not token rows",
                                  "index it as --modality records")
            agree(facts, "hdf5_dataset", name, rel)
            if modality == "tokens":
                agree(facts, "token_dtype", d.dtype.newbyteorder("=").name, rel)
                agree(facts, "hdf5_dtype", d.dtype.str, rel)
            elif one_sample_per_file(f, name):
                agree(facts, "hdf5_one_sample_per_file", True, rel)
                rows = row_offsets(d)
                return 1, (rows[0], rows[-1]) if rows is not None else None, None, modality
            return int(d.shape[0]), row_offsets(d), None, modality


def one_sample_per_file(f: "h5py.File", name: str) -> bool:
    """Whether the file is one sample (CosmoFlow's ``full`` volume + ``unitPar`` targets) rather than
    samples along the first axis (DLIO's ``records`` + ``labels``): other top-level datasets are
    there and none has the sample dataset's first-axis length, so nothing is per-row."""
    d = f[name]
    others = [v for k, v in f.items() if k != name and isinstance(v, h5py.Dataset) and v.ndim >= 1]
    return bool(others) and h5py.check_vlen_dtype(d.dtype) is None and \
        all(v.shape[0] != d.shape[0] for v in others)


class Hdf5Writer(Writer):
    """Samples wait (bounded: one shard) until the shard's dataset shape is known, then h5py writes
    the file in a temp file that is copied into ``f`` (h5py needs a seekable file)."""

    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        self._rows: list[np.ndarray] = []
        self._records: list[bytes] = []
        self._labels: list[int] = []

    def write(self, sample: Sample) -> None:
        if self.modality == "tokens":
            self.write_batch(sample.index, np.asarray(sample.data).reshape(1, -1))
            return
        self._records.append(bytes(sample.data))
        self._labels.append(int(sample.label if sample.label is not None else -1))

    def write_batch(self, first_index: int, tokens) -> None:
        if self.modality != "tokens":
            return super().write_batch(first_index, tokens)
        self._rows.append(np.ascontiguousarray(tokens, dtype=np.dtype(self.token_dtype).newbyteorder("<")))

    def finish(self) -> ShardLayout:
        with tempfile.TemporaryFile() as tmp:
            with h5py.File(tmp, "w", libver="earliest") as f:
                if self.modality == "tokens":
                    arr = np.concatenate(self._rows) if self._rows else \
                        np.zeros((0, max(1, self.seq_len)), dtype=np.dtype(self.token_dtype).newbyteorder("<"))
                    d = f.create_dataset("tokens", data=arr, track_times=False)
                elif self._records and len({len(r) for r in self._records}) == 1 and self.modality == "records":
                    arr = np.frombuffer(b"".join(self._records), dtype=np.uint8).reshape(len(self._records), -1)
                    d = f.create_dataset("records", data=arr, track_times=False)
                else:
                    d = f.create_dataset("records", (len(self._records),), dtype=h5py.vlen_dtype(np.uint8),
                                         track_times=False)
                    for j, r in enumerate(self._records):
                        d[j] = np.frombuffer(r, dtype=np.uint8)
                if self.modality != "tokens":
                    f.create_dataset("labels", data=np.asarray(self._labels, dtype="<i8"), track_times=False)
                n = int(d.shape[0])
                offsets = row_offsets(d)
            tmp.seek(0)
            shutil.copyfileobj(tmp, self.f, 4 * 2**20)
        return ShardLayout(samples=n, offsets=offsets)


class Hdf5Reader(Reader):
    def __init__(self, manifest) -> None:
        super().__init__(manifest)
        spec = manifest.spec or {}
        self.name = spec.get("hdf5_dataset") or ("tokens" if manifest.modality == "tokens" else "records")
        self.dtype = np.dtype(spec.get("hdf5_dtype") or np.dtype(spec.get("token_dtype", "uint16")).newbyteorder("<"))
        self.per_file = bool(spec.get("hdf5_one_sample_per_file")) and manifest.modality != "tokens"

    def _open(self, data, shard) -> "h5py.File":
        try:
            return h5py.File(io.BytesIO(data if isinstance(data, bytes) else bytes(data)), "r")
        except OSError as e:
            raise IntegrityError(f"{shard.path}: offset 0: not a readable HDF5 file ({e})") from None

    def _dataset(self, f, shard) -> "h5py.Dataset":
        if self.name not in f:
            raise IntegrityError(f"{shard.path}: no dataset {self.name!r} (has {sorted(f)})")
        return f[self.name]

    def iter_samples(self, data, shard) -> Iterator[Sample]:
        with self._open(data, shard) as f:
            d = self._dataset(f, shard)
            first = shard.first_sample
            if self.manifest.modality == "tokens":
                rows = d[()]
                for j in range(rows.shape[0]):
                    yield Sample(index=first + j, data=rows[j])
                return
            if self.per_file:       # the whole dataset is the file's one sample
                yield Sample(index=first, data=np.ascontiguousarray(d[()]).tobytes())
                return
            vlen = h5py.check_vlen_dtype(d.dtype) is not None
            labels = None
            if vlen and self.manifest.modality == "images":
                lname = next((n for n in LABELS if n in f), None)
                labels = f[lname][()] if lname else None
            values = d[()]
            for j in range(d.shape[0]):
                raw = np.ascontiguousarray(values[j]).tobytes()
                yield Sample(index=first + j, data=raw,
                             label=int(labels[j]) if labels is not None and j < len(labels) else None)

    def count_samples(self, data, shard) -> int:
        with self._open(data, shard) as f:
            return 1 if self.per_file else int(self._dataset(f, shard).shape[0])

    def tokens(self, data, shard) -> np.ndarray | None:
        if self.manifest.modality != "tokens":
            return None
        fixed = self.fixed_records(shard)
        if fixed is not None and len(data) >= fixed[0] + shard.samples * fixed[1]:
            # rows straight from the bytes (no HDF5 decode); the header is checked as for loader blocks
            self.check_records(memoryview(data)[:fixed[0]], shard, shard.samples)
            return np.frombuffer(data, dtype=fixed[2], count=shard.samples * fixed[1] // fixed[2].itemsize,
                                 offset=fixed[0]).reshape(shard.samples, -1)
        with self._open(data, shard) as f:
            return self._dataset(f, shard)[()]

    def fixed_records(self, shard) -> tuple[int, int, np.dtype] | None:
        if self.manifest.modality != "tokens" or shard.offsets is None or len(shard.offsets) < 2:
            return None
        return shard.offsets[0], shard.offsets[1] - shard.offsets[0], self.dtype

    def check_records(self, head, shard, records: int) -> None:
        if bytes(head[:8]) != SIGNATURE:
            raise IntegrityError(f"{shard.path}: offset 0: not an HDF5 file (signature {bytes(head[:8])!r})")
        if records != shard.samples:
            raise IntegrityError(f"{shard.path}: {records} rows read, the manifest says {shard.samples}")

    def sample_from_range(self, shard, i, record) -> Sample:
        if self.manifest.modality == "tokens":
            return Sample(index=shard.first_sample + i, data=np.frombuffer(record, dtype=self.dtype))
        return Sample(index=shard.first_sample + i, data=bytes(record))


FORMAT = FormatSpec(name="hdf5", extension=".h5", writer=Hdf5Writer, reader=Hdf5Reader, indexable=True,
                    compressions=("none",), scan=scan)
