"""The contract every format implements.

A format module defines ``FORMAT = FormatSpec(...)`` with a ``Writer`` class (writes the
samples of one shard to a binary file object) and a ``Reader`` class (parses samples
out of a shard's bytes).  Shard rotation, temp names, atomic publish and the manifest
belong to the generator (``iobench.generate``); formats only encode and decode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator

from iobench.metrics import now_ns

if TYPE_CHECKING:
    import numpy as np

    from iobench.manifest import Manifest, ShardEntry

# The stream pattern's pieces (``Reader.pieces``): one piece is (the samples it holds -- a list of
# ``Sample``, or a (rows, cols) array where ``arrays`` -- storage seconds, requests, parse seconds).
Piece = tuple[Any, float, int, float]
# ``read(offset, length, first)`` -> (bytes, storage seconds, requests): the next piece of one
# streamed request over the shard (``first``: the request's first piece, which pays its latency).
PieceRead = Callable[[int, int, bool], "tuple[bytes | memoryview, float, int]"]
# ``read_into(offset, out, first)`` -> (storage seconds, requests): ``read`` into a byte buffer.
PieceReadInto = Callable[[int, Any, bool], "tuple[float, int]"]

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
    """Decodes samples from one shard's bytes.

    Two methods are the contract (as mosaicml/streaming's ``get_sample_data`` / ``decode_sample``):
    ``iter_samples`` (a whole shard) and, for indexable formats, ``sample_range`` +
    ``sample_from_range`` (one sample by byte range).  Everything else the loader asks has a
    default built on those, which a format overrides only to be faster: ``tokens`` (a block's
    shards as one array), ``fixed_records``/``check_records`` (rows cut arithmetically) and
    ``pieces`` (a shard streamed in pieces).  The loader's workers call only these methods, so
    they know no format.
    """

    def __init__(self, manifest: "Manifest") -> None:
        self.manifest = manifest
        self._layout_memo: "tuple[int, int, np.dtype] | None | bool" = False   # fixed_layout(), once known

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

    def count_samples(self, data: "bytes | memoryview", shard: "ShardEntry") -> int:
        """How many samples the shard's contents hold (formats with a count in a header say so faster)."""
        return sum(1 for _ in self.iter_samples(data, shard))

    def tokens(self, data: "bytes | memoryview", shard: "ShardEntry") -> "np.ndarray | None":
        """The shard's token samples as one (samples, seq_len) array (the block pattern's fast path),
        or None: the loader then takes ``iter_samples``' samples one by one."""
        return None

    def fixed_records(self, shard: "ShardEntry") -> "tuple[int, int, np.dtype] | None":
        """(offset of record 0, record bytes, dtype) when every record of the shard is one fixed-size
        token row, so a loader may cut rows arithmetically (same bytes, same values); else None."""
        return None

    def fixed_layout(self) -> "tuple[int, int, np.dtype] | None":
        """``fixed_records`` where every shard of the manifest has the same one, else None (once per reader)."""
        if self._layout_memo is False:
            shards = self.manifest.shards
            f = self.fixed_records(shards[0]) if shards else None
            self._layout_memo = f if f is not None and all(self.fixed_records(sh) == f for sh in shards[1:]) else None
        return self._layout_memo  # type: ignore[return-value]

    def check_records(self, head: "bytes | memoryview", shard: "ShardEntry", records: int) -> None:  # noqa: B027
        """Vet a shard whose ``records`` fixed-size rows were read apart from its header ``head``
        (straight into a loader block): the checks ``tokens`` would make.  Nothing to check by default."""

    def stream_arrays(self) -> bool:
        """Whether ``pieces(..., arrays=True)`` gives (rows, cols) arrays for this dataset's shards
        (besides fixed-size records, which always do): the stream worker then keeps rows, not Samples."""
        return False

    def pieces(self, shard: "ShardEntry", read: PieceRead, size: int, arrays: bool = False,
               read_into: PieceReadInto | None = None) -> Iterator[Piece]:
        """The shard as one streamed request, in pieces of whole samples of about ``size`` bytes, in
        stored order (``Piece``).  Fixed-size records: (rows, cols) arrays cut arithmetically; samples
        with byte ranges: runs of neighbouring samples per piece; otherwise (no record index, e.g. a
        zstd shard) the whole shard as one piece.  Formats with their own framing override this."""
        fixed = self.fixed_layout()
        first = True
        if fixed is not None:
            off0, rec, dtype = fixed
            import numpy as np

            per = max(1, size // rec)
            for i in range(0, shard.samples, per):
                k = min(per, shard.samples - i)
                data, t, n = read(off0 + i * rec, k * rec, first)
                first = False
                t1 = now_ns()
                rows = np.frombuffer(data, dtype=dtype).reshape(k, -1)
                yield rows, t, n, (now_ns() - t1) / 1e9
            return
        # (a reader without byte ranges says so for sample 0: no list of a shard's Nones)
        ranges = [self.sample_range(shard, i) for i in range(shard.samples)] \
            if shard.samples and self.sample_range(shard, 0) is not None else []
        if ranges and all(r is not None for r in ranges):
            i = 0
            while i < shard.samples:
                j = i
                a = ranges[i][0]
                end = ranges[i][0] + ranges[i][1]
                while j + 1 < shard.samples and ranges[j + 1][0] + ranges[j + 1][1] - a <= size \
                        and ranges[j + 1][0] >= end:
                    j += 1
                    end = ranges[j][0] + ranges[j][1]
                data, t, n = read(a, end - a, first)
                first = False
                t1 = now_ns()
                mv = memoryview(data)
                samples = [self.sample_from_range(shard, x, mv[ranges[x][0] - a:ranges[x][0] - a + ranges[x][1]])
                           for x in range(i, j + 1)]
                yield samples, t, n, (now_ns() - t1) / 1e9
                i = j + 1
            return
        data, t, n = read(0, shard.bytes, True)
        t1 = now_ns()
        samples = list(self.iter_samples(data, shard))
        yield samples, t, n, (now_ns() - t1) / 1e9

    def generated_token_rows(self) -> bool:
        """Token shards that ``iobench gen`` wrote with one ``seq_len`` (its manifest says so; not
        ``iobench index`` data): every sample is a row of that many tokens.  Formats whose stream
        path cuts pieces into (rows, seq_len) arrays offer ``stream_arrays`` on this."""
        spec = self.manifest.spec or {}
        seq_len = spec.get("seq_len")
        return (self.manifest.modality == "tokens" and "indexed_from" not in spec
                and isinstance(seq_len, int) and seq_len > 0)


def agree(facts: dict, key: str, value, where: str) -> None:
    """For ``FormatSpec.scan``: record a dataset-wide fact (a dtype, a dataset name) that every file
    must share, since the loader reads them all one way; a file that differs is a ConfigError."""
    if facts.setdefault(key, value) != value:
        from iobench.errors import ConfigError

        raise ConfigError("dataset", f"{where} has {key} {value}, earlier files have {facts[key]}",
                          "index files of one layout together (one dataset per directory)")


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
    # ``iobench index``'s scan of one file, for formats whose module owns it:
    # scan(backend, rel, facts, modality) -> (samples, offsets, index path, modality), recording
    # dataset-wide facts (dtype, dataset name) in ``facts`` (they become the manifest's spec).
    scan: "Callable | None" = None
    # Files a whole dataset carries beside its shards (HF save_to_disk's state.json), made from
    # the finished manifest: dataset_files(manifest) -> {relative name: bytes}.
    dataset_files: "Callable | None" = None

    def index_path(self, shard_path: str) -> str:
        if self.index_replaces_extension and shard_path.endswith(self.extension):
            return shard_path[: -len(self.extension)] + self.index_suffix
        return shard_path + self.index_suffix

    def scope(self, modality: str) -> str:
        return dict(self.compression_scope).get(modality, "shard")
