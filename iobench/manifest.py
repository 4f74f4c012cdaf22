"""The dataset manifest: ``manifest.json`` at the dataset root, versioned, written last.

Its presence is what makes a dataset complete: generators publish it only after every
shard is durable, so a reader that finds a manifest may trust the shard list (size,
sample count, checksum, per-sample offsets where the format is indexable) without
listing or stat-ing files on the hot path.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field, replace

from .errors import ConfigError
from .paths import check_inside, contained_rel
from .storage import Backend
from .units import MAX_SIZE

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


# The version of what ``index_dataset`` records, in every manifest it writes (``extra.index_version``)
# and in the driver's cache key for the manifests it indexes itself: bump it whenever a scan's
# output changes, so that a manifest written before is re-indexed (cache) or refused with the fix
# (``check_index_version``) instead of read with the old offsets.
#   2: a tar sample starts at its first member's first pax / GNU long-name header (1: at the
#      member's own ustar header, which cut every pax or long-name sample's range wrong).
INDEX_VERSION = 2
_TAR_OFFSETS_FIXED = 2   # the first version whose tar offsets are right


@dataclass(frozen=True)
class ShardEntry:
    path: str                      # relative to the dataset root
    bytes: int                     # exact size of the shard file
    samples: int                   # number of samples in it
    checksum: str                  # "<algo>:<hex>", e.g. "xxh64:1f2e..." or "crc32c:..."
    offsets: tuple[int, ...] | None = None   # byte offset of each sample's record, where indexable
    index_path: str | None = None  # a side index file (tfrecord / tar), relative to the root
    first_sample: int = 0          # global index of the shard's first sample

    def to_dict(self) -> dict:
        d = {"path": self.path, "bytes": self.bytes, "samples": self.samples, "checksum": self.checksum,
             "first_sample": self.first_sample}
        if self.offsets is not None:
            d["offsets"] = list(self.offsets)
        if self.index_path is not None:
            d["index_path"] = self.index_path
        return d

    @classmethod
    def from_dict(cls, d: dict, field: str = "manifest.shards[?]") -> "ShardEntry":
        """A shard entry checked field by field: ConfigError (exit 2) naming the bad one."""
        if not isinstance(d, dict):
            raise ConfigError(field, f"must be an object, got {_kind(d)}", _REGEN)
        for key in ("path", "bytes", "samples", "checksum"):
            if key not in d:
                raise ConfigError(f"{field}.{key}", "is missing", _REGEN)
        offs = d.get("offsets")
        if offs is not None and (not isinstance(offs, list) or not all(_is_count(o) for o in offs)):
            raise ConfigError(f"{field}.offsets", "must be a list of byte offsets (integers >= 0)", _REGEN)
        index_path = d.get("index_path")
        if not isinstance(d["checksum"], str) or ":" not in d["checksum"]:
            raise ConfigError(f"{field}.checksum", f"{d['checksum']!r} is not '<algo>:<hex>'", _REGEN)
        from .io.checksum import KNOWN_ALGOS, algo_of

        if algo_of(d["checksum"]) not in KNOWN_ALGOS:
            from .config import nearest

            raise ConfigError(f"{field}.checksum", f"unknown checksum algorithm {algo_of(d['checksum'])!r}",
                              nearest(algo_of(d["checksum"]), KNOWN_ALGOS))
        nbytes, samples = _count(d["bytes"], f"{field}.bytes"), _count(d["samples"], f"{field}.samples")
        if nbytes > MAX_SIZE:
            raise ConfigError(f"{field}.bytes", f"{nbytes} is more than 1 EiB", _REGEN)
        if samples > max(nbytes, 1):   # a sample takes at least a byte: a count past the size is corrupt
            raise ConfigError(f"{field}.samples", f"{samples} samples cannot fit in {nbytes} bytes", _REGEN)
        if offs is not None and len(offs) not in (samples, samples + 1):
            raise ConfigError(f"{field}.offsets", f"{len(offs)} offsets for {samples} samples", _REGEN)
        return cls(path=contained_rel(d["path"], f"{field}.path"),
                   bytes=nbytes, samples=samples,
                   checksum=d["checksum"], offsets=tuple(offs) if offs is not None else None,
                   index_path=contained_rel(index_path, f"{field}.index_path") if index_path is not None else None,
                   first_sample=_count(d.get("first_sample", 0), f"{field}.first_sample"))


_REGEN = "index it again with `iobench index URL --force` (or regenerate it with `iobench gen`)"


def _kind(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(v), type(v).__name__)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _count(v, field: str) -> int:
    if not _is_count(v):
        raise ConfigError(field, f"must be an integer >= 0, got {v!r}", _REGEN)
    return int(v)


@dataclass(frozen=True)
class Manifest:
    format: str                    # raw | parquet | tfrecord | tar | files
    modality: str                  # tokens | images
    compression: str               # none | zstd:LEVEL
    seed: int
    spec: dict                     # the resolved generator spec (no secrets)
    shards: tuple[ShardEntry, ...]
    version: int = MANIFEST_VERSION
    created_at: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def total_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    def to_dict(self) -> dict:
        return {"version": self.version, "format": self.format, "modality": self.modality,
                "compression": self.compression, "seed": self.seed, "spec": self.spec,
                "created_at": self.created_at, "total_bytes": self.total_bytes,
                "total_samples": self.total_samples, "extra": self.extra,
                "shards": [s.to_dict() for s in self.shards]}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1).encode() + b"\n"

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        """A manifest checked field by field: ConfigError (exit 2) naming the first bad field."""
        if not isinstance(d, dict):
            raise ConfigError("manifest", f"must be a JSON object, got {_kind(d)}", _REGEN)
        version = d.get("version", 0)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ConfigError("manifest.version", f"must be an integer >= 1, got {version!r}", _REGEN)
        if version > MANIFEST_VERSION:
            raise ConfigError("manifest.version", f"{version} is newer than this iobench reads ({MANIFEST_VERSION})",
                              "upgrade iobench")
        for key in ("format", "modality"):
            if not isinstance(d.get(key), str) or not d.get(key):
                raise ConfigError(f"manifest.{key}", f"must be a non-empty string, got {d.get(key)!r}", _REGEN)
        if not isinstance(d.get("compression", "none"), str):
            raise ConfigError("manifest.compression", f"must be a string, got {d['compression']!r}", _REGEN)
        seed = d.get("seed")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError("manifest.seed", f"must be an integer, got {seed!r}", _REGEN)
        for key in ("spec", "extra"):
            if not isinstance(d.get(key, {}), dict):
                raise ConfigError(f"manifest.{key}", f"must be an object, got {_kind(d[key])}", _REGEN)
        _check_kinds(d)
        raw = d.get("shards")
        if not isinstance(raw, list):
            raise ConfigError("manifest.shards", f"must be a list of shard entries, got {_kind(raw)}", _REGEN)
        shards = tuple(ShardEntry.from_dict(s, f"manifest.shards[{i}]") for i, s in enumerate(raw))
        if not shards:   # (verify said OK about a directory of shards the manifest did not list)
            raise ConfigError("manifest.shards", "lists no shard", _REGEN)
        seen: set[str] = set()
        first = 0
        placed = []
        for i, s in enumerate(shards):
            if s.path in seen:
                raise ConfigError(f"manifest.shards[{i}].path", f"{s.path!r} is listed twice", _REGEN)
            if s.path == MANIFEST_NAME or s.index_path == MANIFEST_NAME:   # load read the manifest as a shard
                raise ConfigError(f"manifest.shards[{i}].path", f"names the manifest itself ({MANIFEST_NAME})", _REGEN)
            if "first_sample" not in raw[i]:   # it starts where the shards before it end (not at 0 for every one)
                s = replace(s, first_sample=first)
            elif s.first_sample != first:      # global sample ids follow the shards
                raise ConfigError(f"manifest.shards[{i}].first_sample", f"is {s.first_sample}, but the shards "
                                  f"before it hold {first} samples", _REGEN)
            seen.add(s.path)
            placed.append(s)
            first += s.samples
        shards = tuple(placed)
        _check_totals(d, shards)
        return cls(format=d["format"], modality=d["modality"], compression=d.get("compression", "none"),
                   seed=seed, spec=d.get("spec", {}), shards=shards, version=version,
                   created_at=str(d.get("created_at", "")), extra=d.get("extra", {}))


# spec keys that are counts of at least one, where a manifest carries them (tokens' seq_len, ...)
_SPEC_COUNTS = ("seq_len", "vocab_size", "record_bytes", "image_width", "image_height", "num_classes")


def _check_kinds(d: dict) -> None:
    """format, modality, compression, checksum algorithm and spec sizes: known values, in range."""
    from .format_registry import format_names
    from .config import nearest

    if d["format"] not in format_names():
        raise ConfigError("manifest.format", f"unknown format {d['format']!r}", nearest(d["format"], format_names()))
    modalities = ("tokens", "images", "records")
    if d["modality"] not in modalities:
        raise ConfigError("manifest.modality", f"unknown modality {d['modality']!r}", nearest(d["modality"], modalities))
    comp = d.get("compression", "none")
    level = comp.partition(":")[2]
    if comp != "none" and not (comp.startswith("zstd:") and level.lstrip("-").isdigit()
                               and -(1 << 17) <= int(level) <= 22):   # zstd's own range of levels
        raise ConfigError("manifest.compression", f"unknown compression {comp!r}", "none or zstd:LEVEL (LEVEL <= 22)")
    spec = d.get("spec") or {}
    from .bounds import memory_cap

    for key in _SPEC_COUNTS:
        v = spec.get(key)
        if v is not None and (not _is_count(v) or v < 1):
            raise ConfigError(f"manifest.spec.{key}", f"must be an integer >= 1, got {v!r}", _REGEN)
    # one sample's size as the spec implies it: the loader sizes its slots from it (seq_len 10^15 died
    # with ENOMEM allocating them, after the workers had started)
    sample = {"seq_len": 8 * (spec.get("seq_len") or 0), "record_bytes": spec.get("record_bytes") or 0,
              "image_width": 3 * (spec.get("image_width") or 0) * (spec.get("image_height") or 1)}
    for key, nbytes in sample.items():
        if nbytes > memory_cap():
            raise ConfigError(f"manifest.spec.{key}", f"{spec[key]}: one sample would not fit in this host's "
                              "memory", _REGEN)
    td = spec.get("token_dtype")
    if td is not None and td != "auto":
        import numpy as np

        try:
            ok = np.dtype(td).kind in "ui"
        except TypeError:
            ok = False
        if not ok:
            raise ConfigError("manifest.spec.token_dtype", f"{td!r} is not an integer dtype", "uint16, uint32, "
                              "int32 or int64")
    algo = (d.get("extra") or {}).get("checksum")
    from .io.checksum import KNOWN_ALGOS

    if algo is not None and algo not in KNOWN_ALGOS:
        raise ConfigError("manifest.extra.checksum", f"unknown checksum algorithm {algo!r}", nearest(str(algo), KNOWN_ALGOS))


def _check_totals(d: dict, shards: tuple[ShardEntry, ...]) -> None:
    """total_samples / total_bytes, where written: counts (>= 0; derived from the shards, whose own
    counts ``verify`` checks against the data); and no more samples than the host could index (8 bytes
    each in memory)."""
    for key in ("total_samples", "total_bytes"):
        if key in d:
            _count(d[key], f"manifest.{key}")
    from .bounds import memory_cap

    total = sum(s.samples for s in shards)
    if total * 8 > memory_cap():
        raise ConfigError("manifest.total_samples", f"{total} samples: their index alone would not fit in this "
                          "host's memory", "split the dataset, or read it from a host with more memory")


def write_manifest(backend: Backend, manifest: Manifest) -> None:
    """Publish the manifest atomically; call only after every shard is durable."""
    backend.write_bytes(MANIFEST_NAME, manifest.to_json(), fsync=True)


MAX_MANIFEST_BYTES = 1 << 30   # 1 GiB: millions of shards; anything bigger is not a manifest


def _read_local_regular(path: str, url: str) -> bytes:
    """Bytes of a local manifest through the one input reader (``iobench.io.inputs``): opened
    without blocking, only if it is a regular file, at most ``MAX_MANIFEST_BYTES``.  A FIFO at
    ``manifest.json`` would otherwise block ``open`` forever.  FileNotFoundError passes through."""
    from .io.inputs import read_regular

    return read_regular(path, "dataset", MAX_MANIFEST_BYTES, _REGEN, "manifest")


def check_index_version(manifest: Manifest, url: str) -> None:
    """Refuse a tar manifest ``iobench index`` wrote before index version 2: its sample offsets
    cut pax and long-name members wrong, so range reads of them fail or return other bytes."""
    version = manifest.extra.get("index_version", 1)
    version = version if isinstance(version, int) else 1
    if manifest.format == "tar" and manifest.extra.get("indexed") and version < _TAR_OFFSETS_FIXED:
        raise ConfigError("dataset", f"the manifest at {url} was indexed by an older iobench (index version "
                          f"{version}, now {INDEX_VERSION}) whose tar sample offsets "
                          "miss pax and long-name headers", f"re-index it: iobench index {url} --force")


def check_dataset_root(backend: Backend, field: str = "dataset") -> None:
    """A local dataset root must be a directory (not a file, not missing): exit 2 otherwise."""
    base = backend.base
    if base.is_local and not os.path.isdir(base.root):
        what = "is a file, not a dataset directory" if os.path.exists(base.root) else "does not exist"
        raise ConfigError(field, f"{backend.url} {what}", "give the root directory of your dataset")
    man = os.path.join(base.root, MANIFEST_NAME) if base.is_local else ""
    if man and os.path.islink(man) and not os.path.exists(man):
        # a symlink that loops or leads nowhere: a broken manifest, not "generation did not finish"
        raise ConfigError(field, f"{MANIFEST_NAME} at {backend.url} is a symlink that leads nowhere or loops",
                          "replace it with the manifest itself")


def read_manifest(backend: Backend) -> Manifest:
    """The dataset's manifest, validated: every shard path stays inside the dataset root."""
    base = backend.base   # wrappers (instrumented, emulated) keep the real one here
    try:
        if base.is_local:
            check_dataset_root(backend)
            raw = _read_local_regular(base.path(MANIFEST_NAME), backend.url)
        else:
            raw = backend.cat(MANIFEST_NAME)
    except FileNotFoundError:
        raise ConfigError("dataset", f"no {MANIFEST_NAME} at {backend.url}",
                          "index it: `iobench index URL --format tar|parquet|tfrecord|files|npz` "
                          "(`iobench check --dataset URL` indexes it itself)") from None
    except PermissionError:
        raise ConfigError("dataset", f"{MANIFEST_NAME} at {backend.url} is not readable (permission denied)",
                          "fix its permissions or the credentials") from None
    except IsADirectoryError:
        raise ConfigError("dataset", f"{MANIFEST_NAME} at {backend.url} is a directory", _REGEN) from None
    from .io.inputs import loads_json

    try:
        data = loads_json(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError("dataset", f"{MANIFEST_NAME} at {backend.url} is not JSON ({e})", _REGEN) from None
    manifest = Manifest.from_dict(data)
    check_index_version(manifest, backend.url)
    if base.is_local:
        check_manifest_inside(base.root, manifest)
    return manifest


def check_manifest_inside(root: str, manifest: Manifest) -> None:
    """Refuse a local dataset whose shard or index files are symlinks leading out of ``root``, or
    are not regular files: a FIFO in place of a shard would block every reader's ``open`` (the
    loader's workers, the page-cache probe, a stage copy) forever.  A missing file passes here:
    ``verify`` reports it as missing."""
    for i, s in enumerate(manifest.shards):
        _check_data_file(check_inside(root, s.path, f"manifest.shards[{i}].path"), f"manifest.shards[{i}].path")
        if s.index_path:
            _check_data_file(check_inside(root, s.index_path, f"manifest.shards[{i}].index_path"),
                             f"manifest.shards[{i}].index_path")


def _check_data_file(full: str, field: str) -> None:
    try:
        st = os.stat(full)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        from .io.inputs import kind_of

        raise ConfigError(field, f"{full} is {kind_of(st.st_mode)}, not a data file",
                          "replace it with the file the manifest names, or regenerate the dataset")
