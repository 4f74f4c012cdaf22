"""`megatron`: Megatron-LM / NeMo indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``).

The layout is Megatron-LM's ``megatron/core/datasets/indexed_dataset.py`` (MMapIndexedDataset):
``.bin`` is every sequence's tokens back to back, no header; ``.idx`` is, little-endian,

    magic  b"MMIDIDX\\x00\\x00" (9 bytes) | version u64 (1) | dtype code u8 |
    sequence count u64 | document count u64 |
    sequence lengths int32[sequences] (tokens) | sequence pointers int64[sequences] (bytes into .bin) |
    document indices int64[documents] (0, then the sequence index that ends each document)
    [| sequence modes int8[sequences], multimodal datasets only]

with Megatron's dtype codes (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
8 uint16).  A sample is one sequence, read by its pointer and length (one ranged read, no
parse); the manifest records the pointers as per-sample offsets and the ``.idx`` as the
shard's index file.  ``iobench gen --format megatron`` writes one sequence (and document) per
sample, as ``preprocess_data.py`` does for one-sentence documents; vocabularies above 65500
are stored as int32 (Megatron's own choice), below as uint16.

GPTDataset's sampling (``seq_len + 1``-token windows across document boundaries) is
``iobench index --format megatron --seq-len N``: sample k is tokens ``[k*N, k*N + N + 1)`` of
the shard's sequences in stored order, one contiguous byte range.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from iobench.errors import IntegrityError

from .base import FormatSpec, Reader, Sample, ShardLayout, Writer, agree

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# Megatron-LM's DType enum (indexed_dataset.py): code -> numpy dtype name
DTYPE_CODES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
CODE_OF = {v: k for k, v in DTYPE_CODES.items()}
_HEAD = struct.Struct("<9sQBQQ")   # 34 bytes


@dataclass(frozen=True)
class MegatronIndex:
    dtype: np.dtype
    lengths: np.ndarray        # int32 tokens per sequence
    pointers: np.ndarray       # int64 byte offset of each sequence in .bin
    documents: np.ndarray      # int64 document boundaries (sequence indices), starting at 0

    def offsets(self, bin_bytes: int, where: str) -> tuple[int, ...]:
        """Per-sequence byte boundaries (sequences + 1): the pointers must tile ``.bin`` exactly."""
        ends = self.pointers + self.lengths.astype(np.int64) * self.dtype.itemsize
        if len(self.pointers) and (self.pointers[0] != 0 or (self.pointers[1:] != ends[:-1]).any()):
            bad = 0 if self.pointers[0] != 0 else int(np.flatnonzero(self.pointers[1:] != ends[:-1])[0]) + 1
            raise IntegrityError(f"{where}: sequence {bad} starts at byte {int(self.pointers[bad])}, "
                                 "not where the previous one ends (a gap or an overlap in .bin)")
        end = int(ends[-1]) if len(ends) else 0
        if end != bin_bytes:
            raise IntegrityError(f"{where}: sequences end at byte {end}, the .bin file holds {bin_bytes}")
        return tuple(self.pointers.tolist()) + (end,)


def encode_index(lengths, dtype: np.dtype, documents=None) -> bytes:
    """The ``.idx`` bytes for sequences of ``lengths`` tokens of ``dtype`` stored back to back."""
    lengths = np.asarray(lengths, dtype="<i4")
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype="<i8")
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
    docs = np.arange(len(lengths) + 1, dtype="<i8") if documents is None else np.asarray(documents, dtype="<i8")
    head = _HEAD.pack(MAGIC, VERSION, CODE_OF[np.dtype(dtype).name], len(lengths), len(docs))
    return head + lengths.tobytes() + pointers.tobytes() + docs.tobytes()


def decode_index(buf, where: str) -> MegatronIndex:
    mv = memoryview(buf)
    if len(mv) < _HEAD.size:
        raise IntegrityError(f"{where}: offset {len(mv)}: shorter than a Megatron .idx header")
    magic, version, code, n, docs = _HEAD.unpack_from(mv, 0)
    if magic != MAGIC:
        raise IntegrityError(f"{where}: offset 0: not a Megatron .idx file (magic {magic!r})")
    if version != VERSION:
        raise IntegrityError(f"{where}: offset 9: .idx version {version}, this reader knows {VERSION}")
    if code not in DTYPE_CODES:
        raise IntegrityError(f"{where}: offset 17: unknown dtype code {code}")
    need = _HEAD.size + 4 * n + 8 * n + 8 * docs
    if len(mv) < need:
        raise IntegrityError(f"{where}: offset {len(mv)}: .idx says {n} sequences and {docs} documents "
                             f"({need} bytes), file holds {len(mv)}")
    lengths = np.frombuffer(mv, dtype="<i4", count=n, offset=_HEAD.size)
    pointers = np.frombuffer(mv, dtype="<i8", count=n, offset=_HEAD.size + 4 * n)
    documents = np.frombuffer(mv, dtype="<i8", count=docs, offset=_HEAD.size + 12 * n)
    if (lengths < 0).any():
        raise IntegrityError(f"{where}: sequence {int(np.flatnonzero(lengths < 0)[0])} has a negative length")
    return MegatronIndex(np.dtype(DTYPE_CODES[code]).newbyteorder("<"), lengths, pointers, documents)


def storage_dtype(token_dtype: str) -> np.dtype:
    """What Megatron stores a vocabulary's ids as: uint16, or int32 for anything wider."""
    return np.dtype("<u2") if np.dtype(token_dtype).itemsize <= 2 else np.dtype("<i4")


def scan(backend, rel: str, facts: dict, modality: str | None) -> tuple[int, tuple | None, str, str]:
    """``iobench index``: the ``.idx`` only: sequence pointers become per-sample offsets, or with
    ``facts["megatron_window"]`` (``--seq-len``) GPTDataset's windows are the samples."""
    from iobench.errors import ConfigError

    if modality not in (None, "tokens"):
        raise ConfigError("--modality", f"Megatron datasets hold token sequences, not {modality}",
                          "drop --modality (or give tokens)")
    seq_len = int(facts.get("megatron_window") or 0)
    idx_rel = rel[:-4] + ".idx"
    idx = decode_index(backend.cat(idx_rel), idx_rel)
    if idx.dtype.kind not in "ui" or idx.dtype.name not in ("uint16", "int32", "int64", "uint8", "int16"):
        raise ConfigError("dataset", f"{idx_rel} stores {idx.dtype.name} values, not token ids",
                          "index a token dataset (preprocess_data.py output)")
    agree(facts, "megatron_dtype", idx.dtype.str, idx_rel)
    agree(facts, "token_dtype", idx.dtype.name if idx.dtype.name in ("uint16", "int32", "int64") else "int64",
           idx_rel)
    offsets = idx.offsets(backend.size(rel), rel)
    facts["documents"] = facts.get("documents", 0) + max(0, len(idx.documents) - 1)
    if seq_len:
        tokens = offsets[-1] // idx.dtype.itemsize
        return max(0, (tokens - 1) // seq_len), None, idx_rel, "tokens"
    return len(offsets) - 1, offsets, idx_rel, "tokens"


class MegatronWriter(Writer):
    """The ``.bin`` goes to ``f`` as samples arrive; the ``.idx`` is the shard's side index."""

    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        self._dtype = storage_dtype(self.token_dtype)
        self._lengths: list[np.ndarray] = []
        if self.modality != "tokens":
            from iobench.errors import ConfigError

            raise ConfigError("gen.modality", "the megatron format holds token sequences",
                              "use --modality tokens (or another --format)")

    def write(self, sample: Sample) -> None:
        self.write_batch(sample.index, np.asarray(sample.data).reshape(1, -1))

    def write_batch(self, first_index: int, tokens) -> None:
        arr = np.ascontiguousarray(tokens, dtype=self._dtype)
        self.f.write(memoryview(arr).cast("B"))
        self._lengths.append(np.full(arr.shape[0], arr.shape[1], dtype="<i4"))

    def finish(self) -> ShardLayout:
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype="<i4")
        idx = encode_index(lengths, self._dtype)
        ends = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * self._dtype.itemsize)])
        return ShardLayout(samples=len(lengths), offsets=tuple(ends.tolist()), index_bytes=idx)


class MegatronReader(Reader):
    def __init__(self, manifest) -> None:
        super().__init__(manifest)
        spec = manifest.spec or {}
        # gen records the vocabulary's dtype; the stored one follows Megatron's rule
        self.dtype = np.dtype(spec["megatron_dtype"]) if "megatron_dtype" in spec else \
            storage_dtype(spec.get("token_dtype", "uint16"))
        self.window = int(spec.get("megatron_window") or 0)   # GPTDataset seq_len (0: one sample per sequence)
        self._fixed: dict[str, tuple[int, int, np.dtype] | None] = {}

    def _offsets(self, shard) -> tuple[int, ...]:
        if shard.offsets is None:
            raise IntegrityError(f"{shard.path}: the manifest has no sequence pointers (index it again)")
        return shard.offsets

    def iter_samples(self, data, shard) -> Iterator[Sample]:
        mv = memoryview(data)
        if self.window:
            for i in range(shard.samples):
                a, n = self._window(i)
                yield Sample(index=shard.first_sample + i, data=self._tokens(mv[a:a + n], shard, i))
            return
        offs = self._offsets(shard)
        if offs[-1] != len(mv):
            raise IntegrityError(f"{shard.path}: offset {min(len(mv), offs[-1])}: sequences end at byte "
                                 f"{offs[-1]}, the .bin file holds {len(mv)}")
        for i in range(len(offs) - 1):
            yield Sample(index=shard.first_sample + i, data=self._tokens(mv[offs[i]:offs[i + 1]], shard, i))

    def _tokens(self, rec, shard, i: int) -> np.ndarray:
        if len(rec) % self.dtype.itemsize:
            raise IntegrityError(f"{shard.path}: sample {i}: {len(rec)} bytes is not whole {self.dtype.name} tokens")
        return np.frombuffer(rec, dtype=self.dtype)

    def count_samples(self, data, shard) -> int:
        if self.window:
            return sum(1 for _ in self.iter_samples(data, shard))
        offs = self._offsets(shard)
        if offs[-1] != len(data):
            raise IntegrityError(f"{shard.path}: offset {min(len(data), offs[-1])}: sequences end at byte "
                                 f"{offs[-1]}, the .bin file holds {len(data)}")
        return len(offs) - 1

    def _window(self, i: int) -> tuple[int, int]:
        item = self.dtype.itemsize
        return i * self.window * item, (self.window + 1) * item

    def sample_range(self, shard, i):
        if self.window:
            return self._window(i) if 0 <= i < shard.samples else None
        return super().sample_range(shard, i)

    def fixed_records(self, shard) -> tuple[int, int, np.dtype] | None:
        """(0, sequence bytes, dtype) when every sequence of the shard has one length (rows cut
        arithmetically, as for raw shards); None for documents of varying length or windows."""
        if self.window or shard.offsets is None or len(shard.offsets) < 2:
            return None
        if shard.path not in self._fixed:
            d = np.diff(np.asarray(shard.offsets, dtype=np.int64))
            ok = shard.offsets[0] == 0 and bool((d == d[0]).all()) and d[0] > 0
            self._fixed[shard.path] = (0, int(d[0]), self.dtype) if ok else None
        return self._fixed[shard.path]

    def check_records(self, head, shard, records: int) -> None:
        if self.fixed_records(shard) is None or records != shard.samples:
            raise IntegrityError(f"{shard.path}: {records} sequences read, the manifest's index says {shard.samples}")

    def tokens(self, data, shard) -> np.ndarray | None:
        if self.window:
            return self._windows(data, shard, 0, shard.samples)
        fixed = self.fixed_records(shard)
        if fixed is None or len(data) != shard.samples * fixed[1]:
            return None
        return np.frombuffer(data, dtype=self.dtype).reshape(shard.samples, -1)

    def _windows(self, data, shard, first: int, count: int) -> np.ndarray:
        """Windows ``first .. first+count`` as one (count, seq_len + 1) read-only view of ``data``, which
        starts at window ``first``'s first token (neighbouring windows share one token: no copy)."""
        arr = np.frombuffer(data, dtype=self.dtype)
        need = count * self.window + 1 if count else 0
        if arr.size < need:
            raise IntegrityError(f"{shard.path}: windows {first}..{first + count}: {arr.size} tokens read, "
                                 f"{need} needed")
        item = self.dtype.itemsize
        return np.lib.stride_tricks.as_strided(arr, shape=(count, self.window + 1),
                                               strides=(self.window * item, item), writeable=False)

    def stream_arrays(self) -> bool:
        return bool(self.window)

    def pieces(self, shard, read, size, arrays=False, read_into=None):
        """GPTDataset windows: runs of neighbouring windows per piece (one contiguous range each), as
        (windows, seq_len + 1) arrays with ``arrays``; sequences: the default (fixed rows or ranges)."""
        if not self.window:
            yield from super().pieces(shard, read, size, arrays, read_into)
            return
        from iobench.metrics import now_ns

        item = self.dtype.itemsize
        per = max(1, size // (self.window * item))
        first = True
        for i in range(0, shard.samples, per):
            k = min(per, shard.samples - i)
            data, t, n = read(i * self.window * item, (k * self.window + 1) * item, first)
            first = False
            t1 = now_ns()
            rows = self._windows(data, shard, i, k)
            out = rows if arrays else [Sample(index=shard.first_sample + i + j, data=rows[j]) for j in range(k)]
            yield out, t, n, (now_ns() - t1) / 1e9

    def sample_from_range(self, shard, i, record) -> Sample:
        return Sample(index=shard.first_sample + i, data=self._tokens(record, shard, i))


FORMAT = FormatSpec(name="megatron", extension=".bin", writer=MegatronWriter, reader=MegatronReader,
                    indexable=True, compressions=("none",), index_suffix=".idx", index_replaces_extension=True, scan=scan)
