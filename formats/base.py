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

MODALITIES = ("tokens", "images")


@dataclass(frozen=True, slots=True)
class Sample:
    """One training sample: a token array (tokens) or encoded image bytes plus a label (images)."""

    index: int                         # global sample index within the dataset
    data: "np.ndarray | bytes"         # tokens: 1-D integer array; images: JPEG bytes
    label: int | None = None           # images only


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """What a Writer reports when its shard is finished."""

    samples: int
    offsets: tuple[int, ...] | None = None   # per-sample record offsets, where indexable
    index_bytes: bytes | None = None          # content of a side index file, if the format has one


class Writer(ABC):
    """Encodes the samples of one shard into ``f`` (a binary, write-only file object)."""

    def __init__(self, f: IO[bytes], *, modality: str, compression: str = "none",
                 token_dtype: str = "uint16", vocab_size: int = 0) -> None:
        self.f = f
        self.modality = modality
        self.compression = compression
        self.token_dtype = token_dtype
        self.vocab_size = vocab_size

    @abstractmethod
    def write(self, sample: Sample) -> None: ...

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
        return None


@dataclass(frozen=True)
class FormatSpec:
    name: str
    extension: str                 # shard file suffix, e.g. ".bin", ".parquet", ".tfrecord", ".tar"
    writer: type[Writer]
    reader: type[Reader]
    compressions: tuple[str, ...] = ("none", "zstd")   # which compression kinds the format supports
    indexable: bool = False        # supports per-sample byte ranges
