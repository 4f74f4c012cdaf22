"""`parquet`: Apache Parquet via pyarrow, row groups of a few MiB so readers can stream.

Tokens are one column ``tokens`` of list<uint16|uint32>; images are ``image`` (binary,
JPEG bytes) and ``label`` (int64).  ``zstd:LEVEL`` is Parquet's own page compression.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .base import FormatSpec, Reader, Sample, ShardLayout, Writer
from .compression import parse_compression

ROW_GROUP_BYTES = 4 * 2**20


class ParquetWriter(Writer):
    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        comp = parse_compression(self.compression)
        if self.modality == "tokens":
            self._schema = pa.schema([("tokens", pa.list_(pa.from_numpy_dtype(np.dtype(self.token_dtype))))])
        else:
            self._schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])
        self._pw = pq.ParquetWriter(f, self._schema, compression=comp.kind if comp.enabled else "none",
                                    compression_level=comp.level if comp.enabled else None,
                                    use_dictionary=False)  # random ids and JPEGs gain nothing from dictionaries
        self._rows: list = []
        self._labels: list[int] = []
        self._buffered = 0
        self._count = 0

    def write(self, sample: Sample) -> None:
        if self.modality == "tokens":
            arr = np.asarray(sample.data, dtype=self.token_dtype)
            self._rows.append(arr)
            self._buffered += arr.nbytes
        else:
            self._rows.append(bytes(sample.data))
            self._labels.append(int(sample.label if sample.label is not None else -1))
            self._buffered += len(sample.data)
        self._count += 1
        if self._buffered >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        if self.modality == "tokens":
            lengths = np.fromiter((len(r) for r in self._rows), dtype=np.int64, count=len(self._rows))
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            values = pa.array(np.concatenate(self._rows))
            table = pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), values)}, schema=self._schema)
        else:
            table = pa.table({"image": pa.array(self._rows, pa.binary()), "label": pa.array(self._labels, pa.int64())},
                             schema=self._schema)
        self._pw.write_table(table, row_group_size=len(self._rows))
        self._rows, self._labels, self._buffered = [], [], 0

    def finish(self) -> ShardLayout:
        self._flush()
        self._pw.close()
        return ShardLayout(samples=self._count)


class ParquetReader(Reader):
    def iter_samples(self, data, shard) -> Iterator[Sample]:
        pf = pq.ParquetFile(pa.BufferReader(data))
        index = shard.first_sample
        for rg in range(pf.num_row_groups):
            samples = self._table_samples(pf.read_row_group(rg), index)
            index += len(samples)
            yield from samples

    def _table_samples(self, table, index: int) -> list[Sample]:
        out = []
        if self.manifest.modality == "tokens":
            col = table.column(_pick(table, ("tokens", "input_ids", "ids"))).combine_chunks()
            values = col.values.to_numpy(zero_copy_only=False)
            offs = col.offsets.to_numpy()
            for j in range(len(col)):
                out.append(Sample(index=index + j, data=values[offs[j]:offs[j + 1]]))
            return out
        images = table.column(_pick(table, ("image", "jpg", "image/encoded"))).to_pylist()
        lname = next((n for n in ("label", "cls", "image/class/label") if n in table.column_names), None)
        labels = table.column(lname).to_pylist() if lname else [None] * len(images)
        for j, (img, lab) in enumerate(zip(images, labels)):
            out.append(Sample(index=index + j, data=img, label=None if lab is None else int(lab)))
        return out

    def row_group_pieces(self, shard, read) -> Iterator[tuple[list[Sample], float, int, float]]:
        """A streaming reader's view of the shard: the footer (one request), then each row group's
        byte range in order.  ``read(offset, length, first)`` returns (bytes, seconds, requests);
        yields (samples, storage seconds, requests, parse seconds) per row group."""
        import struct
        import time

        from iobench.errors import IntegrityError

        tail, t_io, n_req = read(shard.bytes - 8, 8, True)
        if bytes(tail[4:]) != b"PAR1":
            raise IntegrityError(f"{shard.path}: offset {shard.bytes - 4}: not a Parquet file (no PAR1 trailer)")
        flen = struct.unpack("<I", bytes(tail[:4]))[0]
        foot, t, n = read(shard.bytes - 8 - flen, flen, False)
        t_io, n_req = t_io + t, n_req + n
        buf = np.zeros(shard.bytes, dtype=np.uint8)   # sparse: only the footer and the row groups read so far
        buf[-8:] = np.frombuffer(tail, dtype=np.uint8)
        buf[shard.bytes - 8 - flen:-8] = np.frombuffer(foot, dtype=np.uint8)
        pf = pq.ParquetFile(pa.py_buffer(buf))
        md = pf.metadata
        index = shard.first_sample
        for rg in range(md.num_row_groups):
            g = md.row_group(rg)
            spans = []
            for c in range(g.num_columns):
                col = g.column(c)
                start = col.dictionary_page_offset if col.has_dictionary_page and col.dictionary_page_offset \
                    else col.data_page_offset
                spans.append((start, start + col.total_compressed_size))
            a, b = min(x for x, _ in spans), max(y for _, y in spans)
            data, t, n = read(a, b - a, False)
            buf[a:b] = np.frombuffer(data, dtype=np.uint8)
            t0 = time.perf_counter()
            samples = self._table_samples(pf.read_row_group(rg), index)
            index += len(samples)
            yield samples, t_io + t, n_req + n, time.perf_counter() - t0
            t_io, n_req = 0.0, 0

    def count_samples(self, data, shard) -> int:
        return pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows

    def tokens(self, data, shard) -> np.ndarray | None:
        """The shard's token column as one (samples, seq_len) array, or None to use ``iter_samples``.

        Reads the whole column (pyarrow decompresses Parquet's pages, whatever codec they use)
        and reshapes the list column's flat values buffer: a zero-copy view when the shard has
        one row group, one concatenation otherwise.  Rows equal ``iter_samples``' arrays.
        None when that does not apply: image shards, nulls, rows of different lengths, no rows.
        """
        if self.manifest.modality != "tokens":
            return None
        pf = pq.ParquetFile(pa.BufferReader(data))
        if pf.metadata.num_rows == 0:
            return None
        names = pf.schema_arrow.names
        name = next((n for n in ("tokens", "input_ids", "ids") if n in names), None)
        if name is None:
            return None   # iter_samples raises the error that names the columns
        if not (pa.types.is_list(pf.schema_arrow.field(name).type)
                or pa.types.is_large_list(pf.schema_arrow.field(name).type)):
            return None
        seq_len = None
        parts = []
        for chunk in _decode_row_groups(data, pf, name):
            if len(chunk) == 0:
                continue
            if chunk.null_count or chunk.values.null_count:
                return None
            offs = chunk.offsets.to_numpy()
            lengths = np.diff(offs)
            if seq_len is None:
                seq_len = int(lengths[0])
            if seq_len == 0 or (lengths != seq_len).any():
                return None
            values = chunk.values.to_numpy(zero_copy_only=False)
            parts.append(values[int(offs[0]):int(offs[-1])].reshape(-1, seq_len))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


_POOL: tuple[int, object] | None = None   # (pid, pool): a forked child has none of its parent's threads


def _decode_row_groups(data, pf, name: str) -> list:
    """The column's chunks, row groups decoded concurrently.

    Decoding a list column is most of a Parquet read, and pyarrow's ``use_threads`` only
    parallelises across columns, so a one-column shard decodes on one core.  Row groups are
    independent and pyarrow releases the GIL while decoding, so a small thread pool (one per
    core, shared by the process) decodes them side by side; the chunks stay in file order.
    """
    global _POOL
    n = pf.metadata.num_row_groups
    if n == 1 or (os.cpu_count() or 1) == 1:
        return pf.read(columns=[name], use_threads=False).column(name).chunks
    if _POOL is None or _POOL[0] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor

        _POOL = (os.getpid(), ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="iobench-parquet"))

    def one(rg: int):
        # One ParquetFile per thread: a reader is not safe to share between threads.
        return pq.ParquetFile(pa.BufferReader(data)).read_row_group(rg, columns=[name], use_threads=False).column(name)
    return [c for col in _POOL[1].map(one, range(n)) for c in col.chunks]


def _pick(table, names) -> str:
    from iobench.errors import IntegrityError

    for n in names:
        if n in table.column_names:
            return n
    raise IntegrityError(f"parquet shard has none of the columns {names} (has {table.column_names})")


FORMAT = FormatSpec(name="parquet", extension=".parquet", writer=ParquetWriter, reader=ParquetReader,
                    indexable=False, compression_scope=(("tokens", "page"), ("images", "page")))
