"""`arrow`: Arrow IPC stream files as Hugging Face ``datasets.save_to_disk`` lays them out.

A ``save_to_disk`` directory holds ``data-0000k-of-0000N.arrow`` (the Arrow IPC *stream*
format, record batches back to back), ``state.json`` (``_data_files``: the files in order)
and ``dataset_info.json`` (the features).  Samples are rows:

- tokens: a list column ``input_ids``, ``tokens`` or ``ids`` of integers;
- images: ``image`` — HF's ``Image`` feature (struct ``bytes``, ``path``) or plain binary —
  with ``label`` where present;
- records: the text or binary column ``text``, ``data`` or ``content`` (else the first
  string/binary column), a row's bytes (UTF-8 for text), with ``label`` where present.

There is no footer and no row index in a stream file, so a shard is read whole (``block``,
``stream``; ``map`` falls back to ``stream``) and counted by reading it once at index time.
``iobench gen --format arrow`` writes the same layout (``input_ids`` list<uint16|uint32>,
``image`` + ``label``, or ``data`` + ``label``, record batches of about 4 MiB) plus
``state.json`` and ``dataset_info.json``, so ``datasets.load_from_disk`` opens it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterator

import numpy as np
import pyarrow as pa

from iobench.errors import IntegrityError

from .base import FormatSpec, Reader, Sample, agree
from .parquet import PartWriter, _rows

TOKEN_COLUMNS = ("input_ids", "tokens", "ids")
IMAGE_COLUMNS = ("image", "img", "jpg")
RECORD_COLUMNS = ("text", "data", "content")
LABEL_COLUMNS = ("label", "labels", "cls")


def _features(modality: str, token_dtype: str) -> dict:
    """The ``datasets`` features JSON of what the writer stores (what ``load_from_disk`` rebuilds)."""
    label = {"dtype": "int64", "_type": "Value"}
    if modality == "tokens":
        return {"input_ids": {"feature": {"dtype": np.dtype(token_dtype).name, "_type": "Value"}, "_type": "Sequence"}}
    if modality == "images":
        return {"image": {"_type": "Image"}, "label": label}
    return {"data": {"dtype": "binary", "_type": "Value"}, "label": label}


def _schema(modality: str, token_dtype: str) -> pa.Schema:
    if modality == "tokens":
        fields = [("input_ids", pa.list_(pa.from_numpy_dtype(np.dtype(token_dtype))))]
    elif modality == "images":
        fields = [("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])), ("label", pa.int64())]
    else:
        fields = [("data", pa.binary()), ("label", pa.int64())]
    meta = {"huggingface": json.dumps({"info": {"features": _features(modality, token_dtype)}})}
    return pa.schema(fields, metadata=meta)


class ArrowWriter(PartWriter):
    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        self._schema = _schema(self.modality, self.token_dtype)
        self._out = pa.ipc.new_stream(f, self._schema)

    def write(self, sample: Sample) -> None:
        if self.modality == "tokens":
            self.write_batch(sample.index, np.asarray(sample.data).reshape(1, -1))
        else:
            self._add_record(sample)

    def write_batch(self, first_index: int, tokens) -> None:
        if self.modality != "tokens":
            return super().write_batch(first_index, tokens)
        arr = np.ascontiguousarray(tokens, dtype=np.dtype(self.token_dtype))
        self._add(arr, arr.nbytes, arr.shape[0])

    def _write_part(self) -> None:
        if self.modality == "tokens":
            arr = np.concatenate(self._rows)
            offs = pa.array(np.arange(arr.shape[0] + 1, dtype=np.int32) * arr.shape[1])
            cols = [pa.ListArray.from_arrays(offs, pa.array(arr.reshape(-1)))]
        elif self.modality == "images":
            cols = [pa.StructArray.from_arrays([pa.array(self._rows, pa.binary()),
                                                pa.nulls(len(self._rows), pa.string())], ["bytes", "path"]),
                    pa.array(self._labels, pa.int64())]
        else:
            cols = [pa.array(self._rows, pa.binary()), pa.array(self._labels, pa.int64())]
        self._out.write_batch(pa.record_batch(cols, schema=self._schema))


def dataset_files(manifest) -> dict[str, bytes]:
    """``state.json`` and ``dataset_info.json`` for the shards, as ``save_to_disk`` writes them."""
    spec = manifest.spec or {}
    fingerprint = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    state = {"_data_files": [{"filename": s.path} for s in manifest.shards], "_fingerprint": fingerprint,
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
             "_split": None}
    info = {"citation": "", "description": "", "features": _features(manifest.modality,
                                                                     spec.get("token_dtype", "uint16")),
            "homepage": "", "license": ""}
    return {"state.json": json.dumps(state, indent=2, sort_keys=True).encode(),
            "dataset_info.json": json.dumps(info, indent=2, sort_keys=True).encode()}


def read_table(data, where: str) -> pa.Table:
    try:
        return pa.ipc.open_stream(pa.BufferReader(pa.py_buffer(data))).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        try:   # the IPC *file* format (Feather v2) is the other Arrow layout people save
            return pa.ipc.open_file(pa.BufferReader(pa.py_buffer(data))).read_all()
        except (pa.ArrowInvalid, OSError):
            raise IntegrityError(f"{where}: offset 0: not an Arrow IPC stream ({e})") from None


def _column(names, preferred, where: str) -> str:
    for n in preferred:
        if n in names:
            return n
    raise IntegrityError(f"{where}: none of the columns {preferred} (has {list(names)})")


def pick_column(schema: pa.Schema, modality: str, where: str) -> str:
    if modality == "tokens":
        return _column(schema.names, TOKEN_COLUMNS, where)
    if modality == "images":
        return _column(schema.names, IMAGE_COLUMNS, where)
    for n in RECORD_COLUMNS:
        if n in schema.names:
            return n
    for field in schema:
        if pa.types.is_binary(field.type) or pa.types.is_string(field.type) or \
                pa.types.is_large_binary(field.type) or pa.types.is_large_string(field.type):
            return field.name
    raise IntegrityError(f"{where}: no text or binary column for records (has {schema.names})")


def detect_modality(schema: pa.Schema) -> str:
    names = set(schema.names)
    for n in TOKEN_COLUMNS:
        if n in names and (pa.types.is_list(schema.field(n).type) or pa.types.is_large_list(schema.field(n).type)) \
                and pa.types.is_integer(schema.field(n).type.value_type):
            return "tokens"
    if names & set(IMAGE_COLUMNS):
        return "images"
    return "records"


def scan(backend, rel: str, facts: dict, modality: str | None) -> tuple[int, None, None, str]:
    """``iobench index``: a stream file has no footer, so it is read once and its rows counted."""
    table = read_table(backend.cat(rel), rel)
    modality = modality or detect_modality(table.schema)
    column = pick_column(table.schema, modality, rel)
    agree(facts, "arrow_column", column, rel)
    if modality == "tokens":
        vt = table.schema.field(column).type.value_type
        name = vt.to_pandas_dtype().__name__ if hasattr(vt, "to_pandas_dtype") else "int64"
        facts.setdefault("token_dtype", name)
    return table.num_rows, None, None, modality


class ArrowReader(Reader):
    def __init__(self, manifest) -> None:
        super().__init__(manifest)
        self.column = (manifest.spec or {}).get("arrow_column")

    def _table(self, data, shard) -> tuple[pa.Table, str]:
        table = read_table(data, shard.path)
        column = self.column or pick_column(table.schema, self.manifest.modality, shard.path)
        if column not in table.schema.names:
            raise IntegrityError(f"{shard.path}: no column {column!r} (has {table.schema.names})")
        return table, column

    def iter_samples(self, data, shard) -> Iterator[Sample]:
        table, column = self._table(data, shard)
        first = shard.first_sample
        col = table.column(column).combine_chunks()
        if self.manifest.modality == "tokens":
            rows = _rows(col)
            if rows is not None:
                for j, r in enumerate(rows):
                    yield Sample(index=first + j, data=r)
                return
            values = col.values.to_numpy(zero_copy_only=False)
            offs = col.offsets.to_numpy()
            for j in range(len(col)):
                yield Sample(index=first + j, data=values[offs[j]:offs[j + 1]])
            return
        if pa.types.is_struct(col.type):
            col = col.field("bytes")
        lname = next((n for n in LABEL_COLUMNS if n in table.schema.names and n != column), None)
        labels = table.column(lname).to_pylist() if lname else [None] * len(col)
        for j, (v, lab) in enumerate(zip(col.to_pylist(), labels)):
            if v is None:
                raise IntegrityError(f"{shard.path}: row {j}: {column!r} is null")
            yield Sample(index=first + j, data=v.encode() if isinstance(v, str) else v,
                         label=int(lab) if isinstance(lab, (int, np.integer)) else None)

    def count_samples(self, data, shard) -> int:
        return read_table(data, shard.path).num_rows

    def tokens(self, data, shard) -> np.ndarray | None:
        """The token column as one (rows, seq_len) array where every row has one length, else None."""
        if self.manifest.modality != "tokens":
            return None
        table, column = self._table(data, shard)
        if table.num_rows == 0:
            return None
        return _rows(table.column(column).combine_chunks())


FORMAT = FormatSpec(name="arrow", extension=".arrow", writer=ArrowWriter, reader=ArrowReader, indexable=False,
                    compressions=("none",), scan=scan, dataset_files=dataset_files)
