"""Bring your own dataset: scan an existing dataset and write an iobench manifest for it.

``index_dataset(url, fmt)`` lists the dataset's files (webdataset tars, Parquet files,
TFRecords with or without a ``tfrecord``-package ``.index``, ``.npz`` archives, or one file
per sample), counts each file's samples and, where the format allows, records each
sample's byte offsets, so that ``load`` (including per-sample range reads), ``verify`` and
``stage`` work on it.  No data file is written, renamed or removed: the only output is the
manifest.  Reading is as light as each format allows: Parquet reads only the footer,
TFRecords with an index read only the index, ``files`` stats only.  Checksums need every
byte, so they are computed only with ``checksums=True``; otherwise shards carry
``none:`` and ``verify --no-checksums`` checks sizes and sample counts.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .errors import ConfigError, IntegrityError
from .manifest import MANIFEST_NAME, Manifest, ShardEntry
from .storage import Backend

INDEX_FORMATS = ("tar", "parquet", "tfrecord", "files", "npz")
# file suffixes each format's scan picks up (everything else under the root is left alone)
_SUFFIXES = {"tar": (".tar",), "parquet": (".parquet", ".pq"), "tfrecord": (".tfrecord", ".tfrecords", ".tfr"),
             "npz": (".npz",)}
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".ppm")


@dataclass(frozen=True)
class IndexOptions:
    format: str
    modality: str | None = None        # tokens | images | records; None: detect from the first shard
    token_dtype: str = "uint16"        # tokens stored as raw arrays (tar .tokens, files, tfrecord bytes)
    checksums: bool = False            # read every byte to record xxh64 checksums

    def __post_init__(self) -> None:
        if self.format not in INDEX_FORMATS:
            from .config import nearest

            raise ConfigError("--format", f"cannot index {self.format!r}", nearest(self.format, INDEX_FORMATS))
        if self.modality not in (None, "tokens", "images", "records"):
            raise ConfigError("--modality", f"unknown modality {self.modality!r}", "use tokens, images or records")
        if self.token_dtype not in ("uint16", "uint32", "int32", "int64"):
            raise ConfigError("--token-dtype", f"unknown dtype {self.token_dtype!r}", "use uint16, uint32, int32 or int64")


def _rel(backend: Backend, full: str) -> str:
    rel = backend.relative(full)
    if rel is None:
        raise ConfigError("dataset", f"listing returned {full!r}, outside {backend.url}", "report this as a bug")
    # Nothing outside its own data: a path that climbs out of the root is refused, not recorded.
    if rel.startswith("/") or ".." in rel.split("/"):
        raise ConfigError("dataset", f"{rel!r} is not inside {backend.url}", "index a dataset whose files are below its root")
    return rel


def _check_local_file(backend: Backend, rel: str) -> None:
    """A listed local file is read only if it is a regular file inside the root: a symlink out
    of the root (to /etc) is never followed, and a FIFO or device would block the read."""
    from .io.inputs import require_regular
    from .paths import check_inside

    full = check_inside(backend.root, rel, f"dataset file {rel}")
    require_regular(full, f"dataset file {rel}", "index a dataset of regular files: remove or replace this one")


def list_files(backend: Backend, fmt: str) -> list[str]:
    """Data files of ``fmt`` under the root, sorted (the order samples are numbered in)."""
    try:
        found = backend.fs.find(backend.root, detail=False)
    except FileNotFoundError:
        found = []
    rels = []
    for full in found:
        rel = _rel(backend, full)
        name = posixpath.basename(rel)
        if name.startswith(".") or rel == MANIFEST_NAME or name.endswith(".index"):
            continue
        if fmt == "files" or name.lower().endswith(_SUFFIXES[fmt]):
            if backend.is_local:
                _check_local_file(backend, rel)
            rels.append(rel)
    if not rels:
        want = "any file" if fmt == "files" else " or ".join(_SUFFIXES[fmt])
        raise ConfigError("dataset", f"no {want} under {backend.url}",
                          "give the dataset's root URL and the --format its files are in")
    return sorted(rels)


# -- per-format scans: (samples, offsets or None, index_path or None, modality seen) ---------------

def _scan_tar(backend: Backend, rel: str, data: bytes) -> tuple[int, tuple | None, None, str | None]:
    from .formats.tar import IMAGE_EXTS, TOKEN_EXTS, iter_members, split_key

    offsets: list[int] = []
    key, end, exts = None, 0, set()
    first_exts: set | None = None
    for name, header_at, payload in iter_members(data, rel):
        k, ext = split_key(name)
        if k != key:
            if key is not None and first_exts is None:
                first_exts = set(exts)
            offsets.append(header_at)
            key, exts = k, set()
        exts.add(ext)
        size = len(payload)
        end = header_at + 512 + size + (-size % 512)
    if key is not None and first_exts is None:
        first_exts = exts
    modality = None
    if first_exts:
        if any(e in first_exts for e in IMAGE_EXTS):
            modality = "images"
        elif any(e in first_exts for e in TOKEN_EXTS):
            modality = "tokens"
    return len(offsets), (tuple(offsets) + (end,) if offsets else None), None, modality


def _scan_tfrecord(backend: Backend, rel: str, data: bytes | None) -> tuple[int, tuple | None, str | None, str | None]:
    from .formats.tfrecord import IMAGE_KEYS, TOKEN_KEYS, decode_example, iter_records

    index_rel = next((c for c in (rel + ".index", posixpath.splitext(rel)[0] + ".index") if backend.exists(c)), None)
    first_payload = None
    if index_rel is not None and data is None:
        # the tfrecord package's index: "offset length" per record; only the index is read
        offsets = []
        end = 0
        for ln, line in enumerate(backend.cat(index_rel).decode().split("\n")):
            if not line.strip():
                continue
            try:
                off, length = (int(x) for x in line.split()[:2])
            except ValueError:
                raise ConfigError("dataset", f"{index_rel} line {ln + 1} is not 'offset length'",
                                  "regenerate it with tfrecord.tools.tfrecord2idx, or delete it and index again") from None
            if off != end:
                raise IntegrityError(f"{index_rel}: line {ln + 1}: record at {off}, previous ended at {end}")
            offsets.append(off)
            end = off + length
        if end != backend.size(rel):
            raise IntegrityError(f"{index_rel}: records end at {end}, {rel} holds {backend.size(rel)} bytes")
        if offsets:
            hdr_len = backend.cat(rel, offsets[0], offsets[0] + 8)
            n = int.from_bytes(hdr_len, "little")
            first_payload = backend.cat(rel, offsets[0] + 12, offsets[0] + 12 + n)
    else:
        data = backend.cat(rel) if data is None else data
        offsets = []
        end = 0
        for off, payload in iter_records(data, rel):
            if first_payload is None:
                first_payload = bytes(payload)
            offsets.append(off)
            end = off + 16 + len(payload)
    modality = None
    if first_payload is not None:
        keys = set(decode_example(first_payload))
        modality = "images" if keys & set(IMAGE_KEYS) else "tokens" if keys & set(TOKEN_KEYS) else None
    return len(offsets), (tuple(offsets) + (end,) if offsets else None), index_rel, modality


def _scan_parquet(backend: Backend, rel: str) -> tuple[int, None, None, str | None]:
    from .extras import require

    pq = require("pyarrow.parquet", "index --format parquet")
    with backend.open(rel, "rb") as f:   # pyarrow reads the footer with ranged reads
        pf = pq.ParquetFile(f)
        names = set(pf.schema_arrow.names)
        rows = pf.metadata.num_rows
    modality = ("images" if names & {"image", "jpg", "image/encoded"} else
                "tokens" if names & {"tokens", "input_ids", "ids"} else None)
    return rows, None, None, modality


def _scan_npz(backend: Backend, rel: str, data: bytes) -> tuple[int, None, None, str | None]:
    import io

    import numpy as np

    try:
        z = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any unreadable archive is the same answer
        raise IntegrityError(f"{rel}: not a readable .npz archive ({type(e).__name__}: {e})") from None
    if "x" not in z.files:
        raise IntegrityError(f"{rel}: .npz archive has no 'x' member (has {z.files})")
    if "offsets" in z.files:
        return len(z["offsets"]) - 1, None, None, "records"
    x = z["x"]
    if x.dtype.kind in "ui" and x.ndim == 2:
        return x.shape[0], None, None, "tokens"
    return 1, None, None, "records"


def index_dataset(backend: Backend, opts: IndexOptions, on_file=None) -> Manifest:
    """Scan the dataset at ``backend`` and return its manifest (written by the caller)."""
    from .io.checksum import new_tally
    from .results import now_iso

    files = list_files(backend, opts.format)
    shards: list[ShardEntry] = []
    modality = opts.modality
    first = 0
    for rel in files:
        size = backend.size(rel)
        needs_bytes = opts.checksums or opts.format in ("tar", "npz") or (
            opts.format == "tfrecord" and not any(backend.exists(c) for c in
                                                  (rel + ".index", posixpath.splitext(rel)[0] + ".index")))
        data = backend.cat(rel) if needs_bytes else None
        if opts.format == "tar":
            n, offsets, index_rel, seen = _scan_tar(backend, rel, data)
        elif opts.format == "tfrecord":
            n, offsets, index_rel, seen = _scan_tfrecord(backend, rel, data if not opts.checksums else None)
        elif opts.format == "parquet":
            n, offsets, index_rel, seen = _scan_parquet(backend, rel)
        elif opts.format == "npz":
            n, offsets, index_rel, seen = _scan_npz(backend, rel, data)
        else:
            n, offsets, index_rel = 1, None, None
            seen = "images" if rel.lower().endswith(_IMAGE_SUFFIXES) else None
        if modality is None:
            modality = seen
        checksum = "none:"
        if opts.checksums:
            h = new_tally("xxh64")
            h.write(data)
            checksum = h.digest()
        shards.append(ShardEntry(path=rel, bytes=size, samples=n, checksum=checksum, offsets=offsets,
                                 index_path=index_rel, first_sample=first))
        first += n
        if on_file is not None:
            on_file(rel, size)
    if modality is None:
        raise ConfigError("--modality", f"cannot tell what the {opts.format} samples under {backend.url} hold",
                          "give --modality tokens, images or records")
    spec = {"indexed_from": backend.describe()["url"], "format": opts.format, "modality": modality,
            "token_dtype": opts.token_dtype, "generator": "iobench index",
            "checksum": "xxh64" if opts.checksums else "none"}
    return Manifest(format=opts.format, modality=modality, compression="none", seed=0, spec=spec,
                    shards=tuple(shards), created_at=now_iso(),
                    extra={"indexed": True, "checksums": opts.checksums})
