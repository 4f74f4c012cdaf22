"""The dataset manifest: ``manifest.json`` at the dataset root, versioned, written last.

Its presence is what makes a dataset complete: generators publish it only after every
shard is durable, so a reader that finds a manifest may trust the shard list (size,
sample count, checksum, per-sample offsets where the format is indexable) without
listing or stat-ing files on the hot path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .errors import ConfigError
from .storage import Backend

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


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
    def from_dict(cls, d: dict) -> "ShardEntry":
        offs = d.get("offsets")
        return cls(path=d["path"], bytes=int(d["bytes"]), samples=int(d["samples"]), checksum=d["checksum"],
                   offsets=tuple(offs) if offs is not None else None, index_path=d.get("index_path"),
                   first_sample=int(d.get("first_sample", 0)))


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
        version = int(d.get("version", 0))
        if version > MANIFEST_VERSION:
            raise ConfigError("manifest.version", f"{version} is newer than this iobench reads ({MANIFEST_VERSION})",
                              "upgrade iobench")
        return cls(format=d["format"], modality=d["modality"], compression=d.get("compression", "none"),
                   seed=int(d["seed"]), spec=d.get("spec", {}),
                   shards=tuple(ShardEntry.from_dict(s) for s in d["shards"]), version=version,
                   created_at=d.get("created_at", ""), extra=d.get("extra", {}))


def write_manifest(backend: Backend, manifest: Manifest) -> None:
    """Publish the manifest atomically; call only after every shard is durable."""
    backend.write_bytes(MANIFEST_NAME, manifest.to_json(), fsync=True)


def read_manifest(backend: Backend) -> Manifest:
    try:
        raw = backend.cat(MANIFEST_NAME)
    except FileNotFoundError:
        raise ConfigError("dataset", f"no {MANIFEST_NAME} at {backend.url}",
                          "generate a dataset there with `iobench gen`, or give the dataset's root URL") from None
    try:
        return Manifest.from_dict(json.loads(raw))
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError("dataset", f"{MANIFEST_NAME} at {backend.url} is malformed ({e})",
                          "regenerate the dataset") from e
