"""`parquet`: Apache Parquet via pyarrow, row groups of a few MiB so readers can stream.

Tokens are one column ``tokens`` of list<uint16|uint32>; images are ``image`` (binary,
JPEG bytes) and ``label`` (int64).  ``zstd:LEVEL`` is Parquet's own page compression.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .base import FormatSpec, Piece, PieceRead, PieceReadInto, Reader, Sample, ShardLayout, Writer
from .compression import parse_compression

ROW_GROUP_BYTES = 4 * 2**20   # a part: a Parquet row group, an Arrow record batch


class PartWriter(Writer):
    """A writer that buffers rows and writes them as one part of about ``ROW_GROUP_BYTES``: a Parquet
    row group, an Arrow record batch (so that readers can stream a shard part by part)."""

    _out: Any   # the format's writer (closed by finish)

    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        self._rows: list = []
        self._labels: list[int] = []
        self._buffered = 0
        self._count = 0

    def _add(self, row, nbytes: int, count: int = 1) -> None:
        self._rows.append(row)
        self._buffered += nbytes
        self._count += count
        if self._buffered >= ROW_GROUP_BYTES:
            self._flush()

    def _add_record(self, sample: Sample) -> None:
        """A record or an image: its bytes and its label (-1: none)."""
        self._labels.append(int(sample.label if sample.label is not None else -1))
        self._add(bytes(sample.data), len(sample.data))

    def _flush(self) -> None:
        if self._rows:
            self._write_part()
            self._rows, self._labels, self._buffered = [], [], 0

    def _write_part(self) -> None:
        """The buffered rows (``_rows``, ``_labels``) as one part."""
        raise NotImplementedError

    def finish(self) -> ShardLayout:
        self._flush()
        self._out.close()
        return ShardLayout(samples=self._count)


class ParquetWriter(PartWriter):
    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        comp = parse_compression(self.compression)
        if self.modality == "tokens":
            self._schema = pa.schema([("tokens", pa.list_(pa.from_numpy_dtype(np.dtype(self.token_dtype))))])
        else:
            self._schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])
        self._out = pq.ParquetWriter(f, self._schema, compression=comp.kind if comp.enabled else "none",
                                     compression_level=comp.level if comp.enabled else None,
                                     use_dictionary=False)  # random ids and JPEGs gain nothing from dictionaries

    def write(self, sample: Sample) -> None:
        if self.modality == "tokens":
            arr = np.asarray(sample.data, dtype=self.token_dtype)
            self._add(arr, arr.nbytes)
        else:
            self._add_record(sample)

    def _write_part(self) -> None:
        if self.modality == "tokens":
            lengths = np.fromiter((len(r) for r in self._rows), dtype=np.int64, count=len(self._rows))
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            values = pa.array(np.concatenate(self._rows))
            table = pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), values)}, schema=self._schema)
        else:
            table = pa.table({"image": pa.array(self._rows, pa.binary()), "label": pa.array(self._labels, pa.int64())},
                             schema=self._schema)
        self._out.write_table(table, row_group_size=len(self._rows))


class ParquetReader(Reader):
    _scratch: np.ndarray | None = None    # pieces' shard buffer, reused (per process: made after fork)

    def iter_samples(self, data, shard) -> Iterator[Sample]:
        pf = pq.ParquetFile(pa.BufferReader(data))
        index = shard.first_sample
        for rg in range(pf.num_row_groups):
            samples = self._table_samples(pf.read_row_group(rg), index)
            index += len(samples)
            yield from samples

    def _table_samples(self, table, index: int) -> list[Sample]:
        if self.manifest.modality == "tokens":
            col = table.column(_pick(table, ("tokens", "input_ids", "ids"))).combine_chunks()
            rows = _rows(col)
            if rows is not None:   # iterating a 2-D view is ~2x cheaper than slicing by offsets
                return [Sample(index=index + j, data=r) for j, r in enumerate(rows)]
            values = col.values.to_numpy(zero_copy_only=False)
            offs = col.offsets.to_numpy()
            return [Sample(index=index + j, data=values[offs[j]:offs[j + 1]]) for j in range(len(col))]
        images = table.column(_pick(table, ("image", "jpg", "image/encoded"))).to_pylist()
        lname = next((n for n in ("label", "cls", "image/class/label") if n in table.column_names), None)
        labels = table.column(lname).to_pylist() if lname else [None] * len(images)
        return [Sample(index=index + j, data=img, label=None if lab is None else int(lab))
                for j, (img, lab) in enumerate(zip(images, labels))]

    def stream_arrays(self) -> bool:
        """Whether ``pieces(..., arrays=True)`` applies: token shards that ``iobench gen`` wrote
        with one ``seq_len`` (its manifest says so), so each row group is one (rows, seq_len) array.  A
        stream worker then keeps rows in its row store and a batch is one gather, instead of one Sample
        object per row and a stack per batch (that per-row Python cost more than pyarrow's decode)."""
        return self.generated_token_rows()

    def pieces(self, shard, read: PieceRead, size: int, arrays: bool = False,
               read_into: PieceReadInto | None = None) -> Iterator[Piece]:
        """A streaming reader's view of the shard: the footer (one request), then each row group's
        byte range in order (a piece is a row group, whatever ``size``).  ``read(offset, length, first)`` returns (bytes, seconds, requests);
        ``read_into(offset, out, first)``, where given, reads into ``out`` and returns (seconds,
        requests): row groups then land in the shard buffer with no copy.  Yields (samples, storage
        seconds, requests, parse seconds) per row group; with ``arrays`` (see ``stream_arrays``) a
        (rows, seq_len) token array instead of the samples.

        Row groups k+1 .. k+D (D = cores, at most 4) are read, and their decodes started on the
        process's thread pool, before row group k is handed over: pyarrow releases the GIL while it
        decodes, so D row groups decode at once and overlap the worker's own work on the rows it
        already has (the stream reads D row groups ahead).  Parse seconds are the time the worker
        waited for a decode plus the conversion, not the decode's own time on the other thread."""
        import struct
        import time

        from iobench.dist.world import usable_cores
        from iobench.errors import IntegrityError

        tail, t_io, n_req = read(shard.bytes - 8, 8, True)
        if bytes(tail[4:]) != b"PAR1":
            raise IntegrityError(f"{shard.path}: offset {shard.bytes - 4}: not a Parquet file (no PAR1 trailer)")
        flen = struct.unpack("<I", bytes(tail[:4]))[0]
        foot, t, n = read(shard.bytes - 8 - flen, flen, False)
        t_io, n_req = t_io + t, n_req + n
        # Only the footer and the row groups read so far are set.  With ``arrays`` the buffer is reused
        # from shard to shard (a fresh 64 MiB buffer costs a page fault per 4 KiB, more than the copy
        # into it): decoded rows are pyarrow's own memory (checked below), and every decode has ended
        # when this generator does, before the next shard's pieces are read.
        if arrays:
            if self._scratch is None or len(self._scratch) < shard.bytes:
                self._scratch = np.empty(shard.bytes, dtype=np.uint8)
            buf = self._scratch[:shard.bytes]
        else:
            buf = np.empty(shard.bytes, dtype=np.uint8)
        buf[-8:] = np.frombuffer(tail, dtype=np.uint8)
        buf[shard.bytes - 8 - flen:-8] = np.frombuffer(foot, dtype=np.uint8)
        src = pa.py_buffer(buf)
        md = pq.ParquetFile(src).metadata
        names = md.schema.to_arrow_schema().names
        if self.manifest.modality == "tokens":
            name = next((x for x in ("tokens", "input_ids", "ids") if x in names), None)
            if name is None:
                raise IntegrityError(f"{shard.path}: parquet shard has none of the columns ('tokens', 'input_ids', "
                                     f"'ids') (has {names})")
            columns = [name]
        else:
            columns = None
        seq_len = (self.manifest.spec or {}).get("seq_len")

        def decode(rg: int):
            # One ParquetFile per call (a reader is not safe to share between threads); the
            # footer already parsed is passed in, not parsed again.
            return pq.ParquetFile(src, metadata=md).read_row_group(rg, columns=columns, use_threads=False)

        def finish(job, rg: int, index: int):
            fut, t_io, n_req = job
            t0 = time.perf_counter()
            table = fut.result() if hasattr(fut, "result") else decode(rg)
            if arrays and table.num_rows == 0:
                out = np.empty((0, int(seq_len)), dtype=table.schema.field(columns[0]).type.value_type.to_pandas_dtype())
            elif arrays:
                rows = _rows(table.column(columns[0]).combine_chunks())
                if rows is None or rows.shape[1] != seq_len:
                    raise IntegrityError(f"{shard.path}: row group {rg}: token rows are not all {seq_len} long, as "
                                         "the manifest's spec.seq_len says (use --access block, or iobench index)")
                out = rows.copy() if np.may_share_memory(rows, buf) else rows   # the buffer is reused
            else:
                out = self._table_samples(table, index)
            return out, t_io, n_req, time.perf_counter() - t0

        pool = _pool() if md.num_row_groups > 1 else None
        # Decodes in flight: one per core (pyarrow decodes one row group on one core, and the
        # worker's own work on the rows is small), so a 2-core host decodes two row groups at once.
        depth = min(usable_cores(), 4) if pool is not None else 0
        firsts = np.concatenate([[0], np.cumsum([md.row_group(i).num_rows for i in range(md.num_row_groups)])])
        queue: collections.deque = collections.deque()   # (job, row group) read and decoding, in file order
        try:
            for rg in range(md.num_row_groups):
                g = md.row_group(rg)
                spans = []
                for c in range(g.num_columns):
                    col = g.column(c)
                    start = col.dictionary_page_offset if col.has_dictionary_page and col.dictionary_page_offset \
                        else col.data_page_offset
                    spans.append((start, start + col.total_compressed_size))
                a, b = min(x for x, _ in spans), max(y for _, y in spans)
                if read_into is not None:
                    t, n = read_into(a, buf[a:b], False)
                else:
                    data, t, n = read(a, b - a, False)
                    buf[a:b] = np.frombuffer(data, dtype=np.uint8)
                queue.append(((pool.submit(decode, rg) if pool is not None else None, t_io + t, n_req + n), rg))
                t_io, n_req = 0.0, 0
                while len(queue) > depth:
                    job, r = queue.popleft()
                    yield finish(job, r, shard.first_sample + int(firsts[r]))
            while queue:
                job, r = queue.popleft()
                yield finish(job, r, shard.first_sample + int(firsts[r]))
        finally:
            # A generator closed early (a run stopped mid-shard) still has decodes reading ``buf``;
            # wait for them, as the next shard reuses the buffer.
            for (f, _, _), _ in queue:
                if f is not None:
                    f.exception()

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
        parts = []
        for chunk in _decode_row_groups(data, pf, name):
            if len(chunk) == 0:
                continue
            rows = _rows(chunk)
            if rows is None or (parts and rows.shape[1] != parts[0].shape[1]):
                return None
            parts.append(rows)
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _rows(chunk) -> np.ndarray | None:
    """A list array's rows as one (rows, length) view of its values buffer; None when there are
    none, or nulls, or rows of different (or zero) lengths."""
    if len(chunk) == 0 or chunk.null_count or chunk.values.null_count:
        return None
    offs = chunk.offsets.to_numpy()
    lengths = np.diff(offs)
    seq_len = int(lengths[0])
    if seq_len == 0 or (lengths != seq_len).any():
        return None
    values = chunk.values.to_numpy(zero_copy_only=False)
    return values[int(offs[0]):int(offs[-1])].reshape(-1, seq_len)


_POOL: tuple[int, object] | None = None   # (pid, pool): a forked child has none of its parent's threads


def _pool():
    """The process's decode pool (one thread per core), made again in a forked child."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor

        _POOL = (os.getpid(), ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="iobench-parquet"))
    return _POOL[1]


def _decode_row_groups(data, pf, name: str) -> list:
    """The column's chunks, row groups decoded concurrently.

    Decoding a list column is most of a Parquet read, and pyarrow's ``use_threads`` only
    parallelises across columns, so a one-column shard decodes on one core.  Row groups are
    independent and pyarrow releases the GIL while decoding, so a small thread pool (one per
    core, shared by the process) decodes them side by side; the chunks stay in file order.
    """
    n = pf.metadata.num_row_groups
    if n == 1 or (os.cpu_count() or 1) == 1:
        return pf.read(columns=[name], use_threads=False).column(name).chunks
    md = pf.metadata

    def one(rg: int):
        # One ParquetFile per thread: a reader is not safe to share between threads.
        return pq.ParquetFile(pa.BufferReader(data), metadata=md).read_row_group(rg, columns=[name],
                                                                                 use_threads=False).column(name)
    return [c for col in _pool().map(one, range(n)) for c in col.chunks]


def _pick(table, names) -> str:
    from iobench.errors import IntegrityError

    for n in names:
        if n in table.column_names:
            return n
    raise IntegrityError(f"parquet shard has none of the columns {names} (has {table.column_names})")


FORMAT = FormatSpec(name="parquet", extension=".parquet", writer=ParquetWriter, reader=ParquetReader,
                    indexable=False, compression_scope=(("tokens", "page"), ("images", "page")))
