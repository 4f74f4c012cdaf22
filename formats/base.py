"""The contract every format implements.

A format module defines ``FORMAT = FormatSpec(...)`` with a ``Writer`` class (writes the
samples of one shard to a binary file object) and a ``Reader`` class (parses samples
out of a shard's bytes).  Shard rotation, temp names, atomic publish and the manifest
belong to the generator (``iobench.generate``); formats only encode and decode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import numpy as np

    from iobench.manifest import Manifest, ShardEntry

MODALITIES = ("tokens", "images", "records")


@dataclass(frozen=True, slots=True)
class Sample:
    """One training sample: a token array (tokens) or encoded image bytes plus a label (images)."""

    index: int                         # global sample index within the dataset
    data: "np.ndarray | bytes"         # tokens: 1-D integer array; images: JPEG bytes; records: opaque bytes
    label: int | None = None           # images and records only


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """What a Writer reports when its shard is finished."""

    samples: int
    # Record boundaries where indexable: samples + 1 entries, sample i spans
    # [offsets[i], offsets[i + 1]) (the last entry is the end of the last record).
    offsets: tuple[int, ...] | None = None
    index_bytes: bytes | None = None          # content of a side index file, if the format has one


class Writer(ABC):
    """Encodes the samples of one shard into ``f`` (a binary, write-only file object)."""

    def __init__(self, f: IO[bytes], *, modality: str, compression: str = "none",
                 token_dtype: str = "uint16", vocab_size: int = 0, seq_len: int = 0,
                 num_samples: int | None = None) -> None:
        self.f = f
        self.modality = modality
        self.compression = compression
        self.token_dtype = token_dtype
        self.vocab_size = vocab_size
        self.seq_len = seq_len            # tokens per sample, where fixed (0: variable)
        self.num_samples = num_samples    # samples this shard will hold, when known in advance

    @abstractmethod
    def write(self, sample: Sample) -> None: ...

    def write_batch(self, first_index: int, tokens: "np.ndarray") -> None:
        """Write consecutive token samples (rows of a 2-D array); formats override this for speed."""
        for j in range(tokens.shape[0]):
            self.write(Sample(index=first_index + j, data=tokens[j]))

    @abstractmethod
    def finish(self) -> ShardLayout:
        """Flush trailers/footers; do not close ``f`` (the caller publishes it)."""


class Reader(ABC):
    """Decodes samples from one shard's bytes."""

    def __init__(self, manifest: "Manifest") -> None:
        self.manifest = manifest

    @abstractmethod
    def iter_samples(self, data: "bytes | memoryview", shard: "ShardEntry") -> Iterator[Sample]:
        """Every sample of the shard, in stored order, from its full contents."""

    def sample_range(self, shard: "ShardEntry", i: int) -> tuple[int, int] | None:
        """(offset, length) of sample ``i``'s record for byte-range reads, or None if not indexable."""
        if shard.offsets is None or not 0 <= i < len(shard.offsets) - 1:
            return None
        return shard.offsets[i], shard.offsets[i + 1] - shard.offsets[i]

    def sample_from_range(self, shard: "ShardEntry", i: int, record: "bytes | memoryview") -> Sample:
        """Decode sample ``i`` from the bytes that ``sample_range(shard, i)`` names."""
        raise NotImplementedError(f"{type(self).__name__} has no per-sample byte ranges")

    def generated_token_rows(self) -> bool:
        """Token shards that ``iobench gen`` wrote with one ``seq_len`` (its manifest says so; not
        ``iobench index`` data): every sample is a row of that many tokens.  Formats whose stream
        path cuts pieces into (rows, seq_len) arrays offer ``stream_arrays`` on this."""
        spec = self.manifest.spec or {}
        seq_len = spec.get("seq_len")
        return (self.manifest.modality == "tokens" and "indexed_from" not in spec
                and isinstance(seq_len, int) and seq_len > 0)


@dataclass(frozen=True)
class FormatSpec:
    name: str
    extension: str                 # shard file suffix, e.g. ".bin", ".parquet", ".tfrecord", ".tar"
    writer: type[Writer]
    reader: type[Reader]
    compressions: tuple[str, ...] = ("none", "zstd")   # which compression kinds the format supports
    indexable: bool = False        # supports per-sample byte ranges
    # Where compression applies, per modality: "sample" (records compressed one by one; the
    # byte index stays valid), "shard" (one zstd stream per shard), "page" (Parquet's own pages).
    compression_scope: tuple[tuple[str, str], ...] = (("tokens", "shard"), ("images", "shard"))
    # A shard's side index file (ShardLayout.index_bytes): its name is the shard's plus this suffix,
    # or with the extension replaced (Megatron's PREFIX.bin + PREFIX.idx).
    index_suffix: str = ".index"
    index_replaces_extension: bool = False

    def index_path(self, shard_path: str) -> str:
        if self.index_replaces_extension and shard_path.endswith(self.extension):
            return shard_path[: -len(self.extension)] + self.index_suffix
        return shard_path + self.index_suffix

    def scope(self, modality: str) -> str:
        return dict(self.compression_scope).get(modality, "shard")
