"""Bring your own dataset: scan an existing dataset and write an iobench manifest for it.

``index_dataset(url, fmt)`` lists the dataset's files (webdataset tars, Parquet files,
TFRecords with or without a ``tfrecord``-package ``.index``, ``.npz`` archives, ``np.save``
``.npy`` files, Megatron ``.bin``/``.idx`` pairs, HDF5 files, HF ``save_to_disk`` Arrow files,
or one file per sample, an ImageFolder's class folders giving labels), counts each file's samples and, where the format allows, records each
sample's byte offsets, so that ``load`` (including per-sample range reads), ``verify`` and
``stage`` work on it.  No data file is written, renamed or removed: the only output is the
manifest.  Reading is as light as each format allows: Parquet reads only the footer,
TFRecords with an index read only the index, ``.npy`` only headers, Megatron only ``.idx``
files, HDF5 only its metadata, ``files`` stats only.  With no ``format`` it is detected from
the files' suffixes (``detect_format``); a tar whose members are neither images nor tokens
indexes as opaque records.  Checksums need every
byte, so they are computed only with ``checksums=True``; otherwise shards carry
``none:`` and ``verify --no-checksums`` checks sizes and sample counts.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .errors import ConfigError, IntegrityError, IobenchError
from .manifest import INDEX_VERSION, MANIFEST_NAME, Manifest, ShardEntry
from .storage import Backend

INDEX_FORMATS = ("tar", "parquet", "tfrecord", "files", "npz", "npy", "megatron", "hdf5", "arrow")
# file suffixes each format's scan picks up (everything else under the root is left alone)
_SUFFIXES = {"tar": (".tar",), "parquet": (".parquet", ".pq"), "tfrecord": (".tfrecord", ".tfrecords", ".tfr"),
             "npz": (".npz",), "npy": (".npy",), "megatron": (".bin",), "hdf5": (".h5", ".hdf5", ".hdf"),
             "arrow": (".arrow",)}
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".ppm")


@dataclass(frozen=True)
class IndexOptions:
    format: str | None = None          # None: detected from the files' suffixes (``detect_format``)
    modality: str | None = None        # tokens | images | records; None: detect from the first shard
    token_dtype: str = "uint16"        # tokens stored as raw arrays (tar .tokens, files, tfrecord bytes)
    checksums: bool = False            # read every byte to record xxh64 checksums
    seq_len: int = 0                   # megatron: GPTDataset's seq_len+1-token windows as samples (0: sequences)

    def __post_init__(self) -> None:
        if self.format is not None and self.format not in INDEX_FORMATS:
            from .config import nearest

            raise ConfigError("--format", f"cannot index {self.format!r}", nearest(self.format, INDEX_FORMATS))
        if self.modality not in (None, "tokens", "images", "records"):
            raise ConfigError("--modality", f"unknown modality {self.modality!r}", "use tokens, images or records")
        if self.token_dtype not in ("uint16", "uint32", "int32", "int64"):
            raise ConfigError("--token-dtype", f"unknown dtype {self.token_dtype!r}", "use uint16, uint32, int32 or int64")
        if self.seq_len < 0 or (self.seq_len and self.format not in (None, "megatron")):
            raise ConfigError("--seq-len", f"{self.seq_len} applies to Megatron datasets only (windows of "
                              "seq_len+1 tokens)", "drop --seq-len, or index a megatron .bin/.idx dataset")


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


def _all_files(backend: Backend) -> list[str]:
    """Every data candidate under the root, relative and sorted (hidden files and our manifest left out)."""
    try:
        found = backend.fs.find(backend.root, detail=False)
    except FileNotFoundError:
        found = []
    rels = []
    for full in found:
        rel = _rel(backend, full)
        name = posixpath.basename(rel)
        if name.startswith(".") or rel == MANIFEST_NAME:
            continue
        rels.append(rel)
    return sorted(rels)


def _is_data(rel: str, fmt: str, names: set[str]) -> bool:
    low = posixpath.basename(rel).lower()
    if low.endswith(".index"):
        return False
    if fmt == "files":
        return True
    if fmt == "megatron":    # a .bin is Megatron data only beside its .idx
        return low.endswith(".bin") and rel[:-4] + ".idx" in names
    return low.endswith(_SUFFIXES[fmt])


def list_files(backend: Backend, fmt: str, only: tuple[str, ...] | None = None) -> list[str]:
    """Data files of ``fmt`` under the root, sorted (the order samples are numbered in); with
    ``only`` (a brace-expanded URL, a single shard), just those, in that order."""
    all_rels = _all_files(backend) if only is None else list(only)
    names = set(all_rels) if only is None else set(_all_files(backend))
    if only is not None:
        missing = [r for r in only if r not in names]
        if missing:
            raise ConfigError("dataset", f"{backend.path(missing[0])} does not exist"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                              "check the shard names or the brace range")
    rels = [r for r in all_rels if _is_data(r, fmt, names)]
    if backend.is_local:
        for r in rels:
            _check_local_file(backend, r)
    if fmt == "arrow" and only is None:
        rels = _arrow_order(backend, rels)
    if not rels:
        want = "any file" if fmt == "files" else "a .bin with its .idx" if fmt == "megatron" else \
            " or ".join(_SUFFIXES[fmt])
        raise ConfigError("dataset", f"no {want} under {backend.url}",
                          "give the dataset's root URL and the --format its files are in")
    return rels   # sorted (all_rels is), in state.json's order (arrow), or in the order ``only`` gives


def _arrow_order(backend: Backend, rels: list[str]) -> list[str]:
    """HF ``save_to_disk`` lists its files in ``state.json`` (``_data_files``): that order, where present."""
    from .io.inputs import loads_json

    if backend.exists("dataset_dict.json"):    # a DatasetDict: one save_to_disk directory per split
        try:
            splits = loads_json(backend.cat("dataset_dict.json"))["splits"]
        except (ValueError, KeyError, TypeError):
            splits = []
        raise ConfigError("dataset", f"{backend.url} is a DatasetDict (splits {', '.join(map(str, splits)) or '?'})",
                          f"index one split: iobench index {backend.url.rstrip('/')}/{splits[0] if splits else 'train'}")
    if not backend.exists("state.json"):
        return rels
    try:
        listed = [d["filename"] for d in loads_json(backend.cat("state.json"))["_data_files"]]
    except (ValueError, KeyError, TypeError):
        raise ConfigError("dataset", f"state.json at {backend.url} has no _data_files list",
                          "give the directory `datasets.save_to_disk` wrote, or --format arrow on the .arrow files") \
            from None
    have = set(rels)
    return [r for r in listed if r in have] + sorted(have - set(listed))


def detect_format(backend: Backend, only: tuple[str, ...] | None = None) -> str:
    """The format a dataset's files are in, from their suffixes (no file is opened).

    Megatron's ``.bin`` + ``.idx`` pairs and HF ``save_to_disk``'s ``state.json`` decide first;
    otherwise the one data suffix present (image files alone: ``files``).  Mixed suffixes are
    refused with the list, so the user picks."""
    names = set(_all_files(backend))
    rels = list(only) if only is not None else sorted(names)
    if any(_is_data(r, "megatron", names) for r in rels):
        return "megatron"
    found = {fmt for fmt in _SUFFIXES if fmt != "megatron" and any(_is_data(r, fmt, names) for r in rels)}
    if len(found) == 1:
        return found.pop()
    if not found and rels and all(r.lower().endswith(_IMAGE_SUFFIXES) for r in rels):
        return "files"
    if not found:
        known = f"({', '.join(sorted(s for v in _SUFFIXES.values() for s in v))}, or images)"
        if only is not None and len(rels) == 1:
            # a single file given as the dataset: name the argument the user typed, not --format
            raise ConfigError("dataset", f"{backend.url.rstrip('/')}/{rels[0]} is a file whose suffix no format "
                              f"iobench knows {known}", "give the dataset's directory, a shard with a known suffix, "
                              "or --format")
        raise ConfigError("--format", f"no file under {backend.url} has a suffix iobench knows {known}",
                          "give --format (e.g. --format files for one sample per file)")
    raise ConfigError("--format", f"{backend.url} holds files of several formats ({', '.join(sorted(found))})",
                      "give --format to pick one")


# -- per-format scans: (samples, offsets or None, index_path or None, modality seen) ---------------

def _scan_tar(backend: Backend, rel: str, data: bytes) -> tuple[int, tuple | None, None, str | None]:
    from .formats.tar import IMAGE_EXTS, TOKEN_EXTS, iter_entries, split_key

    offsets: list[int] = []
    key, end, exts = None, 0, set()
    first_exts: set | None = None
    for entry in iter_entries(data, rel):
        k, ext = split_key(entry.name)
        if k != key:
            if key is not None and first_exts is None:
                first_exts = set(exts)
            offsets.append(entry.start)       # the sample's first extended header, not its own header
            key, exts = k, set()
        exts.add(ext)
        end = entry.end
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


def index_dataset(backend: Backend, opts: IndexOptions, on_file=None, only: tuple[str, ...] | None = None) -> Manifest:
    """Scan the dataset at ``backend`` and return its manifest (written by the caller).

    ``only`` restricts the scan to those files (relative to the root), in that order."""
    from .io.checksum import new_tally
    from .results import now_iso

    from .formats import get_format

    fmt = opts.format or detect_format(backend, only)
    files = list_files(backend, fmt, only)
    scan = get_format(fmt).scan      # missing optional package (h5py) -> exit 2 with the install hint
    shards: list[ShardEntry] = []
    modality = opts.modality
    # dataset-wide facts the scans record (dtypes, dataset names) and read (megatron's window)
    facts: dict = {"megatron_window": opts.seq_len} if opts.seq_len else {}
    first = 0
    for rel in files:
        size = backend.size(rel)
        needs_bytes = opts.checksums or fmt in ("tar", "npz") or (
            fmt == "tfrecord" and not any(backend.exists(c) for c in
                                          (rel + ".index", posixpath.splitext(rel)[0] + ".index")))
        data = backend.cat(rel) if needs_bytes else None
        try:
            if fmt == "tar":
                n, offsets, index_rel, seen = _scan_tar(backend, rel, data)
            elif fmt == "tfrecord":
                n, offsets, index_rel, seen = _scan_tfrecord(backend, rel, data if not opts.checksums else None)
            elif fmt == "parquet":
                n, offsets, index_rel, seen = _scan_parquet(backend, rel)
            elif fmt == "npz":
                n, offsets, index_rel, seen = _scan_npz(backend, rel, data)
            elif scan is not None:     # the format module's own scan (FormatSpec.scan)
                n, offsets, index_rel, seen = scan(backend, rel, facts, modality)
            else:
                n, offsets, index_rel = 1, None, None
                seen = "images" if rel.lower().endswith(_IMAGE_SUFFIXES) else None
        except (IobenchError, OSError):
            raise
        except Exception as e:  # noqa: BLE001 - a library's own error on a file it cannot parse (pyarrow's
            # ArrowInvalid): the file is not what its suffix says; an OSError stays one line in iobench.cli
            raise IntegrityError(f"{rel}: not a readable {fmt} file ({type(e).__name__}: {e})") from None
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
    if shards and first == 0:
        # (a 15-byte file named .tar, an empty archive): a manifest of no samples loads nothing, and said
        # nothing about why
        raise ConfigError("dataset", f"no samples in the {len(shards)} {fmt} file(s) under {backend.url}",
                          "check that the files hold data, or give --format")
    if modality is None and fmt == "tar":
        modality = "records"     # members of any other kind: each key's members are one opaque record
    if modality is None:
        raise ConfigError("--modality", f"cannot tell what the {fmt} samples under {backend.url} hold",
                          "give --modality tokens, images or records")
    if fmt == "files":
        facts.update(folder_labels(files, modality))
    spec = {"indexed_from": backend.describe()["url"], "format": fmt, "modality": modality,
            "token_dtype": facts.pop("token_dtype", opts.token_dtype), "generator": "iobench index",
            "checksum": "xxh64" if opts.checksums else "none", **facts}
    return Manifest(format=fmt, modality=modality, compression="none", seed=0, spec=spec,
                    shards=tuple(shards), created_at=now_iso(),
                    extra={"indexed": True, "index_version": INDEX_VERSION, "checksums": opts.checksums})


def folder_labels(files: list[str], modality: str) -> dict:
    """ImageFolder's rule (torchvision): a sample's label is its folder's index among the sorted
    class folder names -- when every file sits one folder below the root and there are two or more."""
    if modality != "images":
        return {}
    dirs = [posixpath.dirname(f) for f in files]
    if any(not d or "/" in d for d in dirs):
        return {}
    classes = sorted(set(dirs))
    return {"classes": classes} if len(classes) > 1 else {}


# -- dataset URLs that name shards: a brace range (webdataset style) or one file ----------------

MAX_EXPANDED = 1_000_000


@dataclass(frozen=True)
class DatasetRef:
    """A dataset URL resolved: the root the manifest lives in, and the files it names (None: all)."""

    root: str
    only: tuple[str, ...] | None = None


def expand_braces(pattern: str) -> list[str]:
    """webdataset's (``braceexpand``) shard patterns: ``{000000..000003}`` numeric ranges (zero-padded
    to the endpoints' width, an optional ``..STEP``), ``{a,b,c}`` alternatives, several groups and
    nesting, left to right."""
    import re

    start = pattern.find("{")
    if start < 0:
        if "}" in pattern:
            raise ConfigError("dataset", f"{pattern!r} has a '}}' with no '{{'", "balance the braces")
        return [pattern]
    depth, end = 0, -1
    for i in range(start, len(pattern)):
        depth += {"{": 1, "}": -1}.get(pattern[i], 0)
        if depth == 0:
            end = i
            break
    if end < 0:
        raise ConfigError("dataset", f"{pattern!r} has a '{{' with no '}}'", "balance the braces")
    body, head, tail = pattern[start + 1:end], pattern[:start], pattern[end + 1:]
    m = re.fullmatch(r"(-?\d+)\.\.(-?\d+)(?:\.\.(\d+))?", body)
    if m:
        a, b, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
        if step <= 0:
            raise ConfigError("dataset", f"{{{body}}}: the step must be positive", "e.g. {000000..000010..2}")
        width = max(len(m.group(1)), len(m.group(2))) if m.group(1).startswith("0") or m.group(2).startswith("0") \
            else 0
        count = abs(b - a) // step + 1
        if count > MAX_EXPANDED:
            raise ConfigError("dataset", f"{{{body}}} names {count} shards", f"name at most {MAX_EXPANDED}")
        nums = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        alts = [str(n).zfill(width) for n in nums]
    else:
        alts, depth, cur = [], 0, ""
        for ch in body:             # split on top-level commas only (nested groups stay whole)
            if ch == "," and depth == 0:
                alts.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        alts.append(cur)
        if len(alts) == 1:          # "{x}" is no pattern: keep it literally, as braceexpand does
            return [head + "{" + a + "}" + t for a in expand_braces(body) for t in expand_braces(tail)]
    out: list[str] = []
    for alt in alts:
        for rest in expand_braces(alt + tail):
            out.append(head + rest)
            if len(out) > MAX_EXPANDED:
                raise ConfigError("dataset", f"{pattern!r} names more than {MAX_EXPANDED} shards",
                                  "use a narrower range")
    return out


def resolve_dataset_url(url: str) -> DatasetRef:
    """The one home for what a dataset URL names: a root directory (all its files), a brace range
    of shards (``.../train-{000000..000003}.tar``), or one shard file (a local file, or a remote
    name ending in a data suffix).  The root of a range or a file is its directory."""
    import os

    known = tuple(s for v in _SUFFIXES.values() for s in v) + _IMAGE_SUFFIXES
    if "{" in url or "}" in url:
        cut = url.find("{") if "{" in url else url.find("}")
        slash = url.rfind("/", 0, cut)
        root = url[:slash] if slash >= 0 else "."
        rest = url[slash + 1:] if slash >= 0 else url
        names = expand_braces(rest)
        if len(set(names)) != len(names):
            raise ConfigError("dataset", f"{url!r} names some shards twice", "give each shard once")
        return DatasetRef(root or "/", tuple(contained_rel_path(n) for n in names))
    local = "://" not in url or url.startswith("file://")
    path = url[len("file://"):] if url.startswith("file://") else url
    is_file = os.path.isfile(path) if local else url.rstrip("/").lower().endswith(known) and not url.endswith("/")
    if not is_file or url.endswith("/"):
        return DatasetRef(url)
    if local and os.path.basename(path) == MANIFEST_NAME:
        return DatasetRef(os.path.dirname(path) or ".")
    slash = url.rstrip("/").rfind("/")
    if slash < 0:
        return DatasetRef(".", (url,))
    return DatasetRef(url[:slash] or "/", (url[slash + 1:],))


def contained_rel_path(rel: str) -> str:
    from .paths import contained_rel

    return contained_rel(rel, "dataset")


def dataset_manifest(backend: Backend, only: tuple[str, ...] | None = None) -> Manifest:
    """The manifest a dataset URL stands for (``resolve_dataset_url``): the root's own, or for a
    brace range / one shard, those shards -- taken from the root's manifest where it lists them
    all, else indexed now in memory (no checksums; nothing is written)."""
    import dataclasses

    from .manifest import read_manifest

    if only is None:
        return read_manifest(backend)
    if backend.exists(MANIFEST_NAME):
        full = read_manifest(backend)
        by_path = {s.path: s for s in full.shards}
        if all(p in by_path for p in only):
            shards, first = [], 0
            for p in only:
                shards.append(dataclasses.replace(by_path[p], first_sample=first))
                first += by_path[p].samples
            return dataclasses.replace(full, shards=tuple(shards),
                                       extra={**full.extra, "selected_from": backend.describe()["url"]})
    return index_dataset(backend, IndexOptions(), only=only)


def open_dataset(url: str, *, endpoint_url: str | None = None, storage_options: dict | None = None,
                 field_name: str = "dataset") -> tuple[Backend, Manifest]:
    """(the backend at the dataset's root, its manifest) for any dataset URL: a root, a brace
    range of shards or one shard (``resolve_dataset_url``, ``dataset_manifest``)."""
    from .storage import open_backend

    ref = resolve_dataset_url(url)
    backend = open_backend(ref.root, endpoint_url=endpoint_url, storage_options=storage_options,
                           field_name=field_name, check=True)
    return backend, dataset_manifest(backend, ref.only)
