"""`npz`: numpy ``.npz`` archives (what MLPerf Storage's unet3d reads), one or more samples per file.

A shard is an uncompressed ZIP of ``.npy`` members that ``numpy.load`` opens as is:

- tokens: ``x`` — a (samples, seq_len) array of the manifest's token dtype;
- images / records: ``x`` — every sample's bytes concatenated (uint8), ``offsets`` — int64,
  samples + 1 boundaries into ``x`` (sample i is ``x[offsets[i]:offsets[i + 1]]``), ``y`` —
  int64 labels.

Members are stored (uncompressed, as ``numpy.savez`` writes them) with a fixed timestamp
(1980-01-01), so the same seed gives byte-identical files (``numpy.savez`` stamps the
current time).  No compression: zstd is not a ZIP method numpy can read.
A one-sample file is read whole (like ``files``); there are no per-sample byte ranges
inside a multi-sample archive.
"""

from __future__ import annotations

import io
import shutil
import tempfile
import zipfile
from typing import Iterator

import numpy as np

from iobench.errors import IntegrityError

from .base import FormatSpec, Reader, Sample, ShardLayout, Writer

_EPOCH = (1980, 1, 1, 0, 0, 0)
_SPOOL_BYTES = 16 * 2**20


class NpzWriter(Writer):
    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        self._method = zipfile.ZIP_STORED
        self._tokens: list[np.ndarray] = []
        # Record bytes wait in a spool (bounded memory) until the count and offsets are known.
        self._spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)
        self._ends: list[int] = [0]
        self._labels: list[int] = []

    def write(self, sample: Sample) -> None:
        if self.modality == "tokens":
            self._tokens.append(np.ascontiguousarray(sample.data, dtype=np.dtype(self.token_dtype).newbyteorder("<")))
            return
        self._spool.write(sample.data)
        self._ends.append(self._spool.tell())
        self._labels.append(int(sample.label if sample.label is not None else -1))

    def write_batch(self, first_index: int, tokens) -> None:
        if self.modality != "tokens":
            return super().write_batch(first_index, tokens)
        self._tokens.append(np.ascontiguousarray(tokens, dtype=np.dtype(self.token_dtype).newbyteorder("<")))

    def finish(self) -> ShardLayout:
        with zipfile.ZipFile(self.f, "w", allowZip64=True) as zf:
            if self.modality == "tokens":
                arr = np.concatenate([t.reshape(-1, t.shape[-1]) if t.ndim > 1 else t.reshape(1, -1)
                                      for t in self._tokens]) if self._tokens else \
                    np.zeros((0, max(1, self.seq_len)), dtype=np.dtype(self.token_dtype).newbyteorder("<"))
                _add_array(zf, "x", arr, self._method)
                n = arr.shape[0]
            else:
                n = len(self._labels)
                size = self._ends[-1]
                self._spool.seek(0)
                _add_stream(zf, "x", np.dtype(np.uint8), (size,), self._spool, self._method)
                _add_array(zf, "offsets", np.asarray(self._ends, dtype="<i8"), self._method)
                _add_array(zf, "y", np.asarray(self._labels, dtype="<i8"), self._method)
        self._spool.close()
        return ShardLayout(samples=n)


def _header(dtype: np.dtype, shape: tuple) -> dict:
    return {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}


def _add_array(zf: zipfile.ZipFile, name: str, arr: np.ndarray, method: int) -> None:
    info = zipfile.ZipInfo(name + ".npy", date_time=_EPOCH)
    info.compress_type = method
    with zf.open(info, "w", force_zip64=True) as out:
        np.lib.format.write_array_header_1_0(out, _header(arr.dtype, arr.shape))
        out.write(memoryview(np.ascontiguousarray(arr)).cast("B"))


def _add_stream(zf: zipfile.ZipFile, name: str, dtype: np.dtype, shape: tuple, src, method: int) -> None:
    info = zipfile.ZipInfo(name + ".npy", date_time=_EPOCH)
    info.compress_type = method
    with zf.open(info, "w", force_zip64=True) as out:
        np.lib.format.write_array_header_1_0(out, _header(dtype, shape))
        shutil.copyfileobj(src, out, 4 * 2**20)


class NpzReader(Reader):
    def _load(self, data, shard):
        try:
            z = np.load(io.BytesIO(data if isinstance(data, bytes) else bytes(data)), allow_pickle=False)
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
            raise IntegrityError(f"{shard.path}: offset 0: not a readable .npz archive ({e})") from None
        if "x" not in z.files:
            raise IntegrityError(f"{shard.path}: .npz archive has no 'x' member (has {z.files})")
        return z

    def tokens(self, data, shard) -> np.ndarray | None:
        if self.manifest.modality != "tokens":
            return None
        x = self._load(data, shard)["x"]
        return x if x.ndim == 2 else x.reshape(1, -1)

    def iter_samples(self, data, shard) -> Iterator[Sample]:
        z = self._load(data, shard)
        first = shard.first_sample
        if self.manifest.modality == "tokens":
            x = z["x"]
            x = x if x.ndim == 2 else x.reshape(1, -1)
            for j in range(x.shape[0]):
                yield Sample(index=first + j, data=x[j])
            return
        x = z["x"]
        if "offsets" in z.files:
            offs = z["offsets"]
        else:   # an archive written elsewhere (e.g. DLIO): one sample, the whole array
            offs = np.array([0, x.nbytes])
            x = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
        y = z["y"] if "y" in z.files else None
        if len(offs) < 1 or int(offs[-1]) != x.nbytes:
            raise IntegrityError(f"{shard.path}: offsets end at {int(offs[-1]) if len(offs) else 0}, "
                                 f"'x' holds {x.nbytes} bytes")
        raw = memoryview(x).cast("B")
        for j in range(len(offs) - 1):
            label = int(np.ravel(y)[j]) if y is not None and np.size(y) > j else None
            yield Sample(index=first + j, data=bytes(raw[int(offs[j]):int(offs[j + 1])]), label=label)

    def sample_range(self, shard, i):
        if shard.samples != 1 or i != 0:
            return None
        return 0, shard.bytes

    def sample_from_range(self, shard, i, record) -> Sample:
        return next(iter(self.iter_samples(record, shard)))


FORMAT = FormatSpec(name="npz", extension=".npz", writer=NpzWriter, reader=NpzReader, indexable=False,
                    compressions=("none",))
