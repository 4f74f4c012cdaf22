"""Synthetic dataset generation: ``generate(spec, url)`` writes shards, then ``manifest.json``.

Every sample is a pure function of (seed, global index) (``iobench.synth``), and the
shard plan (which samples go in which shard) is fixed before anything is written, so the
work splits into contiguous shard ranges, one per writer process, and ``--workers 1``
and ``--workers 4`` give byte-identical datasets.  Size-based rotation is planned from the
nominal sample size (exact for tokens, the mean of a few probe images for images).

Each shard goes through ``Backend.open_output`` (temp name, fsync, rename; S3 objects
appear when their upload completes) with its bytes counted and checksummed on the way
out.  The manifest is published only after every shard is durable; on any failure the
shards of this run are removed and no manifest is written.

Regenerating into a directory that holds a dataset replaces it: its manifest is withdrawn
(deleted, the directory fsynced) before the first shard is written, with the files it listed
recorded in ``SUPERSEDED_NAME``; once the new manifest is published, the files that only the
old manifest listed are deleted.  Nothing that no iobench manifest listed is ever deleted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import queue as queue_mod
import re
import time
from dataclasses import dataclass
from typing import Callable

from .config import build, check_choice, to_dict
from .errors import ConfigError, IobenchError, StorageError
from .io.checksum import DATASET_ALGOS, ChecksumWriter
from .io.inputs import loads_json
from .manifest import MANIFEST_NAME, Manifest, ShardEntry, read_manifest, write_manifest
from .results import now_iso
from .storage import Backend, open_backend
from .units import format_bytes, parse_size

CHECKSUMS = DATASET_ALGOS
DISTRIBUTIONS = ("uniform", "zipf")
TOKEN_DTYPES = ("auto", "uint16", "uint32")
MODALITIES = ("tokens", "images", "records")
# Per-sample framing beyond the payload, to plan size-based shards (close enough for rotation).
_OVERHEAD = {("raw", "tokens"): 0, ("raw", "images"): 12, ("tar", "tokens"): 900, ("tar", "images"): 1800,
             ("parquet", "tokens"): 8, ("parquet", "images"): 16, ("tfrecord", "tokens"): 48,
             ("tfrecord", "images"): 80, ("raw", "records"): 12, ("tfrecord", "records"): 80,
             ("tar", "records"): 1800, ("npz", "tokens"): 400, ("npz", "records"): 600,
             ("npy", "records"): 128, ("npy", "images"): 128, ("hdf5", "images"): 16, ("hdf5", "records"): 16,
             ("arrow", "tokens"): 4, ("arrow", "images"): 24, ("arrow", "records"): 16}


MAX_SHARDS = 10_000_000
# Upper bounds: beyond them a run cannot finish (or a header field overflows) -- refuse up front.
_BOUNDS = (
    ("num_samples", 10**12, "generate at most 10^12 samples"),
    ("vocab_size", 2**32, "token ids are stored as uint32 at most: use a vocabulary <= 4294967296"),
    ("seq_len", 2**31 - 1, "use a sequence length below 2^31"),
    ("workers", 1024, "use at most 1024 writers"),
    ("image_width", 65500, "JPEG dimensions stop at 65500"),
    ("image_height", 65500, "JPEG dimensions stop at 65500"),
    ("record_bytes", 2**31 - 1, "use records below 2 GiB"),
    ("num_classes", 2**31 - 1, "use fewer classes"),
    ("seed", 2**63 - 1, "use a seed below 2^63"),
)


@dataclass(frozen=True)
class GenSpec:
    """What to generate.  Built from a workload's ``gen`` section and flags via ``GenSpec.from_mapping``."""

    format: str = "raw"
    modality: str = "tokens"
    num_samples: int = 1024
    shard_size: str = "64MiB"          # bytes ("64MiB") or a sample count ("1000 samples")
    compression: str = "none"          # none | zstd:LEVEL
    checksum: str = "xxh64"            # xxh64 | crc32c
    seed: int = 0
    workers: int = 0                   # 0: the machine's cores, at most one per shard (iobench.dist.world)
    # tokens
    seq_len: int = 2048
    vocab_size: int = 50257
    token_dtype: str = "auto"          # auto (uint16 if vocab <= 65536, else uint32) | uint16 | uint32
    distribution: str = "uniform"      # uniform | zipf
    zipf_a: float = 1.1
    # images
    image_width: int = 500
    image_height: int = 375
    image_size_jitter: float = 0.2
    image_grain: int = 48
    jpeg_quality: int = 90
    num_classes: int = 1000
    # records (opaque byte samples, MLPerf Storage / DLIO style): size ~ normal(mean, stdev) * scale
    record_bytes: int = 4096
    record_bytes_stdev: int = 0
    scale: float = 1.0                 # shrinks record sizes (scaled-down MLPerf workloads for tests)
    # durability
    fsync: bool = True

    def __post_init__(self) -> None:
        from .formats import format_names, get_format

        check_choice("gen.format", self.format, format_names())
        check_choice("gen.modality", self.modality, MODALITIES)
        if self.modality == "images":
            from .extras import require

            require("PIL", "gen.modality images")
        check_choice("gen.checksum", self.checksum, CHECKSUMS)
        check_choice("gen.distribution", self.distribution, DISTRIBUTIONS)
        check_choice("gen.token_dtype", self.token_dtype, TOKEN_DTYPES)
        for name in ("num_samples", "seq_len", "vocab_size", "image_width", "image_height",
                     "num_classes", "record_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"gen.{name}", f"must be positive, got {getattr(self, name)}", "give a number above zero")
        if self.workers < 0:
            raise ConfigError("gen.workers", f"must be zero (one per core) or more, got {self.workers}",
                              "give a number of writers, or 0 for one per core")
        for name, top, fix in _BOUNDS:
            if getattr(self, name) > top:
                raise ConfigError(f"gen.{name}", f"{getattr(self, name)} is above the limit {top}", fix)
        if self.image_size_jitter >= 1:
            raise ConfigError("gen.image_size_jitter", f"{self.image_size_jitter} would make sizes <= 0",
                              "use a fraction in [0, 1), e.g. 0.2")
        if self.record_bytes_stdev < 0 or not 0 < self.scale <= 1:
            raise ConfigError("gen.record_bytes_stdev/scale", "stdev must be >= 0 and scale within (0, 1]",
                              "e.g. --scale 0.001 for a scaled-down MLPerf workload")
        if self.seed < 0:
            raise ConfigError("gen.seed", f"must be zero or more, got {self.seed}", "give a non-negative seed")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError("gen.jpeg_quality", f"{self.jpeg_quality} is out of range", "use 1..100")
        if self.image_size_jitter < 0 or self.image_grain < 0 or self.zipf_a <= 0:
            raise ConfigError("gen.image_size_jitter/image_grain/zipf_a", "must not be negative",
                              "use jitter >= 0, grain >= 0, zipf_a > 0")
        if self.token_dtype == "uint16" and self.vocab_size > 2**16:
            raise ConfigError("gen.token_dtype", f"uint16 cannot hold a vocabulary of {self.vocab_size}",
                              "use uint32 or auto")
        self.shard_limit()
        from .formats.compression import parse_compression

        comp = parse_compression(self.compression, "gen.compression")
        try:
            fmt = get_format(self.format)
        except ImportError:
            return  # reported with an install hint when generation starts
        if comp.kind not in fmt.compressions:
            raise ConfigError("gen.compression", f"format {self.format!r} does not support {comp.kind}",
                              "use one of: " + ", ".join(fmt.compressions))

    @classmethod
    def from_mapping(cls, mapping: dict | None, section: str = "gen") -> "GenSpec":
        return build(cls, mapping, section)

    def shard_limit(self) -> tuple[str, int]:
        """("samples", N) or ("bytes", N) from ``shard_size``."""
        text = str(self.shard_size).strip()
        m = re.fullmatch(r"(\d+)\s*samples?", text, flags=re.I)
        if m:
            n = int(m.group(1))
            if n <= 0:
                raise ConfigError("gen.shard_size", f"must be positive, got {text!r}", "give e.g. 1000 samples")
            return "samples", n
        return "bytes", parse_size(text, "gen.shard_size")

    @property
    def dtype(self) -> str:
        from .synth import token_dtype_for

        return token_dtype_for(self.vocab_size, self.token_dtype).name

    def resolved(self) -> dict:
        """The spec as recorded in the manifest (token dtype resolved)."""
        d = to_dict(self)
        d["token_dtype"] = self.dtype
        from .synth import SYNTH_VERSION

        d["synth_version"] = SYNTH_VERSION
        return d


@dataclass(frozen=True)
class ShardPlan:
    index: int
    first: int
    count: int
    path: str


def make_synth(spec: GenSpec):
    from .synth import ImageParams, ImageSynth, RecordParams, RecordSynth, TokenParams, TokenSynth

    if spec.modality == "records":
        return RecordSynth(spec.seed, RecordParams(max(1, round(spec.record_bytes * spec.scale)),
                                                   round(spec.record_bytes_stdev * spec.scale), spec.num_classes))
    if spec.modality == "tokens":
        return TokenSynth(spec.seed, TokenParams(spec.seq_len, spec.vocab_size, spec.dtype, spec.distribution,
                                                 spec.zipf_a))
    return ImageSynth(spec.seed, ImageParams(spec.image_width, spec.image_height, spec.image_size_jitter,
                                             spec.image_grain, spec.jpeg_quality, spec.num_classes))


def samples_per_shard(spec: GenSpec, nominal_sample_bytes: int | None = None) -> int:
    kind, n = spec.shard_limit()
    if kind == "samples":
        return n
    if nominal_sample_bytes is None:
        nominal_sample_bytes = make_synth(spec).nominal_bytes()
    per = nominal_sample_bytes + _OVERHEAD.get((spec.format, spec.modality), 0)
    return max(1, n // max(1, per))


def plan_shards(spec: GenSpec, nominal_sample_bytes: int | None = None) -> list[ShardPlan]:
    from .formats import get_format

    ext = get_format(spec.format).extension
    per = samples_per_shard(spec, nominal_sample_bytes)
    if -(-spec.num_samples // per) > MAX_SHARDS:
        raise ConfigError("gen.shard_size", f"{spec.num_samples} samples at {per} per shard make "
                          f"{-(-spec.num_samples // per)} shards, more than {MAX_SHARDS}",
                          "use bigger shards or fewer samples")
    plans = []
    for k, first in enumerate(range(0, spec.num_samples, per)):
        plans.append(ShardPlan(k, first, min(per, spec.num_samples - first), f"shard-{k:06d}{ext}"))
    return plans


class _Stopped(Exception):
    pass


def write_shards(spec: GenSpec, backend: Backend, plans: list[ShardPlan], *,
                 report: Callable[[int, int], None] = lambda s, b: None,
                 should_stop: Callable[[], bool] = lambda: False) -> list[ShardEntry]:
    """Write the planned shards in order; ``report(samples, bytes)`` receives increments."""
    from .formats import get_format

    fmt = get_format(spec.format)
    synth = make_synth(spec)
    entries = []
    # Local shards are made durable together at the end, like fio's --end_fsync: a worker never
    # idles on one shard's fsync, and no manifest can name a shard before its fsync returned.
    defer_fsync = spec.fsync and backend.is_local
    for plan in plans:
        try:
            entries.append(_write_one(spec, backend, fmt, synth, plan, defer_fsync, report, should_stop))
        except OSError as e:
            if e.filename is None:
                e.filename = backend.path(plan.path)   # name the shard in the one-line error
            raise
    if defer_fsync and entries:
        make_durable(backend, [e.path for e in entries] + [e.index_path for e in entries if e.index_path])
    return entries


def _write_one(spec, backend, fmt, synth, plan, defer_fsync, report, should_stop) -> ShardEntry:
    with backend.open_output(plan.path, fsync=spec.fsync and not defer_fsync) as f:
        tally = ChecksumWriter(f, spec.checksum)
        writer = fmt.writer(tally, modality=spec.modality, compression=spec.compression,
                            token_dtype=spec.dtype, vocab_size=spec.vocab_size, seq_len=spec.seq_len,
                            num_samples=plan.count)
        last_bytes, pending = 0, 0
        if spec.modality == "tokens":
            from .synth import TOKEN_BLOCK

            i, end = plan.first, plan.first + plan.count
            while i < end:
                stop = min(end, (i // TOKEN_BLOCK + 1) * TOKEN_BLOCK)
                writer.write_batch(i, synth.rows(i, stop))
                pending += stop - i
                i = stop
                if should_stop():
                    raise _Stopped()
                report(pending, tally.count - last_bytes)
                last_bytes, pending = tally.count, 0
        else:
            for i in range(plan.first, plan.first + plan.count):
                writer.write(synth.sample(i))
                if should_stop():
                    raise _Stopped()
                report(1, tally.count - last_bytes)
                last_bytes = tally.count
        layout = writer.finish()
        report(pending, tally.count - last_bytes)
    if layout.samples != plan.count:
        raise IobenchError(f"{plan.path}: writer reported {layout.samples} samples, planned {plan.count}")
    index_path = None
    if layout.index_bytes is not None:
        index_path = fmt.index_path(plan.path)
        backend.write_bytes(index_path, layout.index_bytes, fsync=spec.fsync and not defer_fsync)
    return ShardEntry(path=plan.path, bytes=tally.count, samples=plan.count, checksum=tally.digest(),
                      offsets=layout.offsets, index_path=index_path, first_sample=plan.first)


def make_durable(backend: Backend, paths: list[str]) -> None:
    """fsync each file, then the directories that hold them."""
    import os

    from .io.atomic import fsync_dir

    dirs = set()
    for rel in paths:
        full = backend.local_path(rel)
        fd = os.open(full, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dirs.add(os.path.dirname(full))
    for d in sorted(dirs):
        fsync_dir(d)


def _describe_error(e: BaseException, backend_url: str) -> tuple[str, str]:
    import errno

    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return "storage", f"no space left on the device while writing {backend_url}: {e.filename or ''}".rstrip(": ")
    if isinstance(e, ConfigError):
        return "config", str(e)
    return "storage" if isinstance(e, OSError) else "error", f"{type(e).__name__}: {e}"


def _worker(spec_dict: dict, url: str, endpoint_url, storage_options, plans, q, stop) -> None:
    from .lifeline import die_with_parent

    die_with_parent()   # a killed `gen` takes its writers with it, at once
    try:
        spec = GenSpec.from_mapping(spec_dict)
        backend = open_backend(url, endpoint_url=endpoint_url, storage_options=storage_options)
        entries = write_shards(spec, backend, plans, report=lambda s, b: q.put(("p", s, b)),
                               should_stop=stop.is_set)
        q.put(("done", [e.to_dict() for e in entries]))
    except _Stopped:
        q.put(("stopped",))
    except BaseException as e:  # sent to the parent, which re-raises it with the shard named
        kind, msg = _describe_error(e, url)
        q.put(("error", kind, msg))


def _split(plans: list[ShardPlan], workers: int) -> list[list[ShardPlan]]:
    """Contiguous shard ranges with about equal sample counts."""
    workers = max(1, min(workers, len(plans)))
    total = sum(p.count for p in plans)
    out: list[list[ShardPlan]] = [[] for _ in range(workers)]
    done = 0
    for p in plans:
        w = min(workers - 1, done * workers // max(1, total))
        out[w].append(p)
        done += p.count
    return [r for r in out if r]


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[bytes]}"), TimeRemainingColumn(), disable=not enabled,
                    console=Console(stderr=True))


def _remove_quietly(backend: Backend, paths) -> None:
    for p in paths:
        try:
            if backend.exists(p):
                backend.rm(p)
        except Exception:  # best effort: the missing manifest already marks the dataset incomplete
            pass


# Written beside the manifest while a dataset is being replaced: the files the withdrawn manifest
# listed, so that a regeneration that dies midway still lets the next one clean them up.
SUPERSEDED_NAME = ".iobench-superseded.json"


def _safe_rel(p: str) -> bool:
    """A path a manifest may name for deletion: relative, inside the root, not our own metadata."""
    if not isinstance(p, str) or not p or p.startswith("/") or "\\" in p or ":" in p.split("/", 1)[0]:
        return False
    return all(part not in ("", ".", "..") for part in p.split("/")) and p not in (MANIFEST_NAME, SUPERSEDED_NAME)


def manifest_files(manifest: Manifest) -> set[str]:
    """Every file ``manifest`` lists: its shards, their side index files and the dataset's own
    (``extra.dataset_files``, e.g. HF's state.json)."""
    files = {s.path for s in manifest.shards} | {s.index_path for s in manifest.shards if s.index_path}
    extra = manifest.extra.get("dataset_files") if isinstance(manifest.extra, dict) else None
    if isinstance(extra, list):
        files |= {p for p in extra if isinstance(p, str)}
    return {p for p in files if _safe_rel(p)}


GENERATOR = "iobench.generate"


def _is_generated(data) -> bool:
    """Whether a parsed ``manifest.json`` is one ``iobench gen`` wrote (not an ``index`` of the user's files)."""
    if not isinstance(data, dict) or not isinstance(data.get("extra"), dict):
        return False
    extra, spec = data["extra"], data.get("spec") if isinstance(data.get("spec"), dict) else {}
    if extra.get("generator") == GENERATOR:
        return True
    # Written before the generator mark: an iobench manifest (format, modality, shards) that
    # `iobench index` did not make (it marks extra.indexed and spec.indexed_from).
    return (not extra.get("generator") and not extra.get("indexed") and "indexed_from" not in spec
            and isinstance(data.get("shards"), list) and isinstance(data.get("format"), str)
            and isinstance(data.get("modality"), str) and "seed" in data)


def _target_state(backend: Backend) -> tuple[list[str], dict | bool | None]:
    """What is at a ``gen`` target: (its top-level entry names, its ``manifest.json`` parsed; None
    when there is none, False when it is unreadable).  One listing, local or object store."""
    import os
    import posixpath

    from .io.inputs import read_bytes
    from .manifest import MAX_MANIFEST_BYTES

    try:
        if backend.is_local:
            entries = sorted(os.listdir(backend.root))
        else:
            root = backend.path("").rstrip("/")
            backend.fs.invalidate_cache(root)
            # (an object store may list a prefix that is itself a key, or was just "made", as itself)
            entries = sorted(posixpath.basename(str(p).rstrip("/")) for p in backend.ls("")
                             if str(p).rstrip("/") != root)
    except OSError:
        return [], None   # absent, or not a directory: the kind checks say so
    if MANIFEST_NAME not in entries:
        return entries, None
    try:
        raw = read_bytes(backend.path(MANIFEST_NAME), "--out", MAX_MANIFEST_BYTES) if backend.is_local \
            else backend.cat(MANIFEST_NAME)
        data = loads_json(raw)
    except (OSError, ValueError, ConfigError):
        return entries, False
    return entries, data if isinstance(data, dict) else False


def _foreign_reason(entries: list[str], doc: dict | bool | None) -> str | None:
    from .io.atomic import final_name_of

    if doc is not None:
        return None if _is_generated(doc) else f"holds a {MANIFEST_NAME} that `iobench gen` did not write"
    if SUPERSEDED_NAME in entries:
        return None   # a regeneration killed after it withdrew the manifest: the record names gen's files
    others = [e for e in entries if final_name_of(e) is None]
    if not others:
        return None
    return (f"is not empty ({len(others)} entr{'y' if len(others) == 1 else 'ies'}, e.g. {others[0]!r}) and holds "
            "no dataset iobench generated")


def foreign_dataset_dir(path: str) -> str | None:
    """Why ``gen`` may not write into the local directory ``path`` without ``--force``, or None
    when it may: absent, empty, holding a dataset ``iobench gen`` made, or only what an
    interrupted ``gen`` left (its temp files, its superseded record)."""
    return _foreign_reason(*_target_state(open_backend(path, field_name="--out")))


def refuse_overwriting(backend: Backend, plans, force: bool, field: str = "--out") -> None:
    """``gen`` writes only over its own files: without ``force`` into no directory or prefix that
    holds others' (``_foreign_reason``); with it, still never onto a name that no ``iobench gen``
    manifest (or superseded record) lists.  Local directories and object-store prefixes alike
    (one listing of the target)."""
    entries, doc = _target_state(backend)
    if not entries:
        return
    why = _foreign_reason(entries, doc)
    if why and not force:
        raise ConfigError(field, f"{backend.url} {why}", "give an empty or new directory, or add --force to "
                          "write beside those files: none of them is ever overwritten")
    owned = _read_superseded(backend) | {MANIFEST_NAME, SUPERSEDED_NAME}
    if _is_generated(doc):
        try:
            owned |= manifest_files(read_manifest(backend))
        except ConfigError:   # a damaged manifest of ours: the names in it that stay inside are ours
            shards = doc.get("shards") if isinstance(doc, dict) else None
            for sh in shards if isinstance(shards, list) else []:
                if isinstance(sh, dict):
                    owned |= {v for k in ("path", "index_path") if isinstance(v := sh.get(k), str) and _safe_rel(v)}
    elif doc is not None:
        owned.discard(MANIFEST_NAME)
    present = set(entries)
    for rel in [MANIFEST_NAME] + [n for p in plans for n in (p.path, p.path + ".index")]:
        top = rel.split("/", 1)[0]
        if rel not in owned and top in present and (rel == top or backend.exists(rel)):
            raise ConfigError(field, f"{backend.path(rel)} exists and was not written by `iobench gen`: "
                              "generating here would overwrite it", "give an empty or new directory")


def _read_superseded(backend: Backend) -> set[str]:
    try:
        files = loads_json(backend.cat(SUPERSEDED_NAME)).get("files", [])
    except FileNotFoundError:
        return set()
    except (ValueError, AttributeError, TypeError):
        return set()   # unreadable: delete nothing it might name
    return {p for p in files if _safe_rel(p)}


def unpublish(backend: Backend, pending=()) -> set[str]:
    """Withdraw the dataset at ``backend`` before anything in it is overwritten.

    Deletes its manifest and, locally, fsyncs the directory, so that from here on no reader can
    take the directory for a whole dataset.  Before that, when there is a dataset to replace, it
    records (in ``SUPERSEDED_NAME``) the files the manifest lists plus ``pending`` (what this run
    is about to write), so that a run killed midway still lets the next one clean up.  Returns
    that set (empty when nothing is being replaced): only these may be removed later as stale.
    """

    previous = _read_superseded(backend)   # an earlier regeneration that never finished
    if backend.exists(MANIFEST_NAME):
        try:
            m = read_manifest(backend)
            if _is_generated(m.to_dict()):   # an `index` manifest lists the user's own files: never "stale"
                previous |= manifest_files(m)
        except ConfigError:
            pass   # malformed or from a newer iobench: withdraw it, but delete nothing it may name
    if previous:
        previous |= {p for p in pending if _safe_rel(p)}
        backend.write_bytes(SUPERSEDED_NAME, json.dumps({"files": sorted(previous)}).encode(), fsync=True)
    elif pending:
        # A first generation records what it is about to write too: a run killed after its first
        # shard was renamed into place left a shard and no manifest, and the next gen refused the
        # directory as the user's.  (Removed again on success or failure: ``end_first_record``.)  Not
        # fsynced: lost in a power cut, the next gen only refuses the directory, as before; nothing is lost.
        backend.write_bytes(SUPERSEDED_NAME, json.dumps({"files": sorted(p for p in pending if _safe_rel(p))}).encode(),
                            fsync=False)
    if backend.exists(MANIFEST_NAME):
        backend.rm(MANIFEST_NAME)
        if backend.is_local:
            from .io.atomic import fsync_dir

            fsync_dir(backend.root)
    return previous


def end_first_record(backend: Backend, previous: set[str]) -> None:
    """A first generation's record (``unpublish``) goes when the run ends, published or failed (no
    directory fsync: if the removal is lost, the record names only files the manifest lists)."""
    if not previous:
        with contextlib.suppress(FileNotFoundError):
            backend.rm(SUPERSEDED_NAME)


def least_bytes(spec: GenSpec) -> int:
    """A lower bound of the dataset's size: the payload alone (tokens, records), or a JPEG at 1/50 of
    its pixels' bytes (images) -- no format, header or index counted."""
    if spec.modality == "tokens":
        import numpy as np

        return spec.num_samples * spec.seq_len * np.dtype(spec.dtype).itemsize
    if spec.modality == "records":
        return spec.num_samples * max(1, round(spec.record_bytes * spec.scale))
    return spec.num_samples * spec.image_width * spec.image_height * 3 // 50


def check_space(spec: GenSpec, backend: Backend) -> None:
    """Refuse, before writing anything, a local dataset that cannot fit the file system's free space
    (``--num-samples 1e11`` started writing 400 TB)."""
    import os
    import shutil

    if not backend.is_local:
        return
    where = backend.base.root
    while where and not os.path.exists(where):
        where = os.path.dirname(where.rstrip("/")) or "."
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return
    need = least_bytes(spec)
    if need > free:
        raise ConfigError("--num-samples", f"{spec.num_samples} samples need at least {format_bytes(need)}, "
                          f"and {where} has {format_bytes(free)} free",
                          "generate fewer samples, or give --out on a file system with room")


def _remove_temp_files(backend: Backend, rels) -> int:
    """Local only: temp files (``iobench.io.atomic``'s names) that a killed writer left
    beside ``rels``."""
    import os

    if not backend.is_local:
        return 0
    removed = 0
    by_dir: dict[str, set[str]] = {}
    for rel in rels:
        d, name = os.path.split(backend.path(rel))
        by_dir.setdefault(d, set()).add(name)
    from .io.atomic import final_name_of, writer_alive

    for d, names in by_dir.items():
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for e in entries:
            if final_name_of(e) in names and not writer_alive(e):   # a live writer's are its own
                try:
                    os.unlink(os.path.join(d, e))
                    removed += 1
                except OSError:
                    pass
    return removed


_SHARD_NAME = re.compile(r"shard-\d{6}\.[A-Za-z0-9.]+")


def _ours() -> set[int]:
    """This process and its children: the writers whose temp files a failed run removes, live or not."""
    import os

    import psutil

    try:
        return {os.getpid()} | {c.pid for c in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {os.getpid()}


def _remove_shard_temp_files(backend: Backend, ours: set[int] | None = None) -> int:
    """Local only: temp files of shards (``.shard-NNNNNN.EXT.<writer>.tmp``, the names only
    ``iobench gen`` writes) at the dataset root that a dead writer left; returns how many."""
    import os

    from .io.atomic import final_name_of, writer_alive, writer_pid

    if not backend.is_local:
        return 0
    removed = 0
    try:
        entries = os.listdir(backend.root)
    except OSError:
        return 0
    for e in entries:
        final = final_name_of(e)
        if final is not None and _SHARD_NAME.fullmatch(final) and \
                (not writer_alive(e) or (ours is not None and writer_pid(e) in ours)):
            try:
                os.unlink(os.path.join(backend.root, e))
                removed += 1
            except OSError:
                pass
    return removed


def _remove_files(backend: Backend, rels) -> tuple[int, list[str]]:
    """Delete ``rels`` (missing ones are fine); returns (how many were deleted, those that could not be).

    On S3 every key sent in a bulk delete counts as deleted (S3 does not say which existed)."""
    import os

    rels = sorted(set(rels))
    removed, failed = 0, []
    if backend.supports_bulk_transfer:
        for i in range(0, len(rels), 1000):   # one DeleteObjects request per 1000 keys
            chunk = rels[i:i + 1000]
            try:
                backend.fs.rm([backend.path(r) for r in chunk])
                removed += len(chunk)
            except FileNotFoundError:
                pass
            except Exception:
                failed.extend(chunk)
        return removed, failed
    dirs = set()
    for rel in rels:
        try:
            backend.rm(rel)
        except FileNotFoundError:
            continue
        except Exception:
            failed.append(rel)
            continue
        removed += 1
        if backend.is_local:
            dirs.add(os.path.dirname(backend.path(rel)))
    if backend.is_local and dirs:
        from .io.atomic import fsync_dir

        root = os.path.normpath(backend.root)
        synced = set()
        for d in sorted(dirs, key=len, reverse=True):
            d = os.path.normpath(d)
            while d != root and d.startswith(root + os.sep):   # drop directories the removal emptied
                try:
                    os.rmdir(d)
                except OSError:
                    break
                d = os.path.dirname(d)
            synced.add(d)
        for d in sorted(synced):
            try:
                fsync_dir(d)   # the removals are durable before the record of them goes
            except OSError:
                pass
    return removed, failed


def _finish_replacement(backend: Backend, previous: set[str], keep: set[str]) -> int:
    """After the new manifest is published: delete what only the withdrawn manifest listed."""
    import logging

    stale = previous - keep
    _remove_temp_files(backend, previous | keep)
    removed, failed = _remove_files(backend, stale)
    if failed:
        logging.getLogger("iobench.generate").warning(
            "could not remove %d stale file(s) of the previous dataset at %s (e.g. %s); "
            "`iobench verify` will point them out", len(failed), backend.url, failed[0])
    else:
        _remove_files(backend, [SUPERSEDED_NAME])
    return removed


def prepare_target(backend: Backend, field: str = "--out", pending=()) -> set[str]:
    """Check that the target is writable and withdraw any old manifest before new shards land.

    Returns the files of the dataset being replaced, with ``pending`` (see ``unpublish``)."""
    import errno

    try:
        backend.makedirs()
        if backend.is_local:
            import os

            if not os.access(backend.root, os.W_OK):
                raise PermissionError(errno.EACCES, "not writable", backend.root)
        return unpublish(backend, pending)
    except PermissionError as e:
        raise ConfigError(field, f"cannot write to {backend.url} ({e.strerror or e})",
                          "pick a directory you can write to") from None
    except FileExistsError:
        raise ConfigError(field, f"{backend.url} exists and is not a directory", "give a directory path") from None
    except NotADirectoryError:
        raise ConfigError(field, f"a parent of {backend.url} is not a directory", "give a directory path") from None
    except OSError as e:
        raise ConfigError(field, f"cannot create {backend.url} ({e.strerror or type(e).__name__})",
                          "pick a directory you can write to") from None


def generate(spec: GenSpec, out_url: str, *, endpoint_url: str | None = None, storage_options: dict | None = None,
             progress: bool = True, stats: dict | None = None, world=None, force: bool = False) -> Manifest | None:
    """Write the dataset ``spec`` describes to ``out_url``; returns its manifest (already published).

    ``stats``, when given, receives wall time, bytes, samples and the writer processes' pids.
    With an MPI ``world`` (iobench.dist) of several ranks, each rank writes a disjoint,
    contiguous range of shards, and rank 0 publishes the manifest only after every rank has
    reported its shards durable; the manifest is returned on rank 0 only.  The dataset is
    byte-identical to a single-process run of the same spec.  Only files ``iobench gen`` wrote
    are ever overwritten or deleted (``refuse_overwriting``; ``force`` allows writing beside
    others' files, never over them).
    """
    from .formats import get_format

    fmt = get_format(spec.format)   # missing optional package -> exit 2 with an install hint
    backend = open_backend(out_url, endpoint_url=endpoint_url, storage_options=storage_options,
                           field_name="--out", check=True)
    check_space(spec, backend)
    t0 = time.perf_counter_ns()
    plans = plan_shards(spec)
    if world is not None and world.size > 1:
        return _generate_ranks(spec, fmt, backend, plans, out_url, endpoint_url, storage_options, stats, world, t0,
                               force)
    refuse_overwriting(backend, plans, force)
    created_root = backend.is_local and not os.path.exists(backend.base.root)
    previous = prepare_target(backend, pending=[p.path for p in plans] + [fmt.index_path(p.path) for p in plans])
    # Temp files a killed earlier run left beside the names this run writes (a first generation
    # killed midway has no superseded record): found, removed and reported.
    leftovers = _remove_shard_temp_files(backend)
    if leftovers:
        import logging

        logging.getLogger("iobench.generate").warning(
            "removed %d temp file(s) left at %s by an interrupted earlier run", leftovers, backend.url)
    from .dist.world import default_parallelism

    workers = min(spec.workers, len(plans)) if spec.workers else default_parallelism(len(plans))
    if not backend.shared_between_processes:
        workers = 1   # a memory:// filesystem lives in this process only
    total_bytes = [0]
    with _progress(progress) as prog:
        task = prog.add_task(f"gen {spec.format}/{spec.modality}", total=spec.num_samples, bytes="0 B")

        def report(s: int, b: int) -> None:
            from .units import format_bytes

            total_bytes[0] += b
            prog.update(task, advance=s, bytes=format_bytes(total_bytes[0]))

        try:
            if workers <= 1:
                entries = write_shards(spec, backend, plans, report=report)
                pids = []
            elif backend.is_object_store:   # I/O-bound uploads: threads, one client
                entries, pids = _run_threads(spec, backend, plans, workers, report), []
            else:
                entries, pids = _run_workers(spec, backend, plans, workers, endpoint_url, storage_options, report)
        except BaseException as e:
            # This run's shards, and what is left of the dataset it was replacing (already withdrawn).
            _remove_quietly(backend, [p.path for p in plans] + [fmt.index_path(p.path) for p in plans])
            _remove_shard_temp_files(backend, _ours())   # a writer killed mid-shard leaves its temp file behind
            end_first_record(backend, previous)
            if created_root:   # the directory this run made, when nothing else is in it (rmdir: only if empty)
                with contextlib.suppress(OSError):
                    os.rmdir(backend.base.root)
            if previous:
                _remove_temp_files(backend, previous)
                if not _remove_files(backend, previous)[1]:
                    _remove_files(backend, [SUPERSEDED_NAME])
            if isinstance(e, IobenchError):
                raise
            if isinstance(e, (OSError, _WorkerError)):
                kind, msg = _describe_error(e, out_url) if isinstance(e, OSError) else (e.kind, e.message)
                if kind == "config":
                    raise ConfigError("--out", msg) from e
                raise StorageError(f"generation failed, no manifest written: {msg}") from e
            raise
    manifest = _publish(spec, fmt, backend, entries)
    removed = _finish_replacement(backend, previous, manifest_files(manifest)) if previous else 0
    end_first_record(backend, previous)
    if stats is not None:
        stats.update(stale_removed=removed, leftover_temp_files_removed=leftovers,
                     seconds=(time.perf_counter_ns() - t0) / 1e9, bytes=manifest.total_bytes,
                     samples=manifest.total_samples, shards=len(entries), workers=max(1, workers), pids=pids)
    return manifest


def _publish(spec: GenSpec, fmt, backend: Backend, entries: list[ShardEntry]) -> Manifest:
    entries = sorted(entries, key=lambda e: e.first_sample)
    manifest = Manifest(format=spec.format, modality=spec.modality, compression=str(_comp(spec)),
                        seed=spec.seed, spec=spec.resolved(), shards=tuple(entries), created_at=now_iso(),
                        extra={"compression_scope": fmt.scope(spec.modality) if spec.compression != "none" else None,
                               "checksum": spec.checksum, "generator": GENERATOR,
                               "offsets": "samples+1 record boundaries" if fmt.indexable else None})
    if fmt.dataset_files is not None:
        # the format's dataset-level files (HF save_to_disk's state.json), durable before the manifest
        files = fmt.dataset_files(manifest)
        for name, data in files.items():
            backend.write_bytes(name, data, fsync=spec.fsync)
        manifest = dataclasses.replace(manifest, extra={**manifest.extra, "dataset_files": sorted(files)})
    write_manifest(backend, manifest)
    return manifest


def gen_metrics(manifest: Manifest, stats: dict, hosts: list[str] | None = None) -> dict:
    """The `gen` results' metrics, the same wherever a dataset is generated (`iobench gen`, the suite).

    Bytes and samples are the manifest's (what was published); seconds from the generator's
    own clock; with ``hosts`` (several ranks), the world view of ``merge_gen_ranks``."""
    secs = max(stats["seconds"], 1e-9)
    m = {"seconds": stats["seconds"], "bytes": manifest.total_bytes, "samples": manifest.total_samples,
         "shards": len(manifest.shards),
         "throughput": {"bytes_per_s": manifest.total_bytes / secs, "samples_per_s": manifest.total_samples / secs},
         "workers": stats.get("workers"),
         "leftover_temp_files_removed": stats.get("leftover_temp_files_removed", 0)}
    if hosts is not None and stats.get("per_rank"):
        m["world"] = merge_gen_ranks(stats["per_rank"], hosts)["world"]
        if "setup_s" in stats:
            m["setup_s"] = stats["setup_s"]
    return m


def merge_gen_ranks(per_rank: list[dict], hosts: list[str]) -> dict:
    """World view of a multi-rank generate: shards written per rank, slowest rank's time to durable."""
    from .dist.aggregate import MergeSpec, merge

    return merge(per_rank, MergeSpec(duration="write_s", sums=("bytes", "samples", "shards", "workers"),
                                     spreads=("bytes",), rates={"write_bytes_per_s": "bytes"}), hosts)


def _generate_ranks(spec, fmt, backend, plans, out_url, endpoint_url, storage_options, stats, world, t0,
                    force=False):
    """One rank's part of a multi-rank ``generate`` (see its docstring)."""
    pending = [p.path for p in plans] + [fmt.index_path(p.path) for p in plans]

    def prepare() -> set[str]:
        # Rank 0 alone decides (one view of the target): refuse others' files, then withdraw the
        # old manifest before any rank writes a shard over a listed file.
        refuse_overwriting(backend, plans, force)
        return prepare_target(backend, pending=pending)

    previous = world.all_ok(lambda: prepare() if world.rank == 0 else set(), what="gen output")
    world.barrier("gen start")
    t_start = time.perf_counter_ns()
    ranges = _split(plans, world.size)
    mine = ranges[world.rank] if world.rank < len(ranges) else []
    workers = min(spec.workers, len(mine))
    entries: list[ShardEntry] = []
    pids: list[int] = []
    problem = None
    try:
        if mine and workers <= 1:
            entries = write_shards(spec, backend, mine)
        elif mine and backend.is_object_store:
            entries = _run_threads(spec, backend, mine, workers, lambda s, b: None)
        elif mine:
            entries, pids = _run_workers(spec, backend, mine, workers, endpoint_url, storage_options,
                                         lambda s, b: None)
    except (OSError, _WorkerError, IobenchError) as e:
        if isinstance(e, OSError):
            problem = _describe_error(e, out_url)[1]
        else:
            problem = getattr(e, "message", None) or str(e)
    t_durable = time.perf_counter_ns()
    # Every rank learns whether every rank's shards are durable: the commit is all or nothing.
    problems = world.allgather(problem, what="gen shards durable")
    bad = [(r, p) for r, p in enumerate(problems) if p]
    if bad:
        _remove_quietly(backend, [p for pl in mine for p in (pl.path, fmt.index_path(pl.path))])
        if world.rank == 0 and previous:
            _remove_temp_files(backend, previous)
            if not _remove_files(backend, previous)[1]:
                _remove_files(backend, [SUPERSEDED_NAME])
        elif world.rank == 0:
            end_first_record(backend, previous)
        err = StorageError(f"generation failed on rank {bad[0][0]}, no manifest written: {bad[0][1]}")
        err.collective = True
        raise err
    mine_stats = {"write_s": (t_durable - t_start) / 1e9, "bytes": sum(e.bytes for e in entries),
                  "samples": sum(e.samples for e in entries), "shards": len(entries), "workers": max(1, workers),
                  "first_sample": entries[0].first_sample if entries else None}
    gathered = world.gather((entries, mine_stats), what="gen manifest")
    manifest = None
    if world.rank == 0:
        manifest = _publish(spec, fmt, backend, [e for es, _ in gathered for e in es])
        removed = _finish_replacement(backend, previous, manifest_files(manifest)) if previous else 0
        end_first_record(backend, previous)
        if stats is not None:
            per_rank = [st for _, st in gathered]
            stats.update(stale_removed=removed, seconds=(time.perf_counter_ns() - t_start) / 1e9,
                         setup_s=(t_start - t0) / 1e9, bytes=manifest.total_bytes, samples=manifest.total_samples,
                         shards=len(manifest.shards), workers=sum(st["workers"] for st in per_rank), pids=pids,
                         per_rank=per_rank)
    world.barrier("gen manifest published")   # no rank reports success before the dataset exists
    return manifest


def _comp(spec: GenSpec):
    from .formats.compression import parse_compression

    return parse_compression(spec.compression)


class _WorkerError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _run_threads(spec, backend, plans, workers, report) -> list[ShardEntry]:
    """Object stores: writer threads sharing one client and connection pool.  Uploads wait on the
    network with the GIL released, as do numpy's bulk ops and Pillow's encoder; a process per writer
    would add a client start-up each and could not share the connection pool."""
    import threading
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    stop = threading.Event()
    lock = threading.Lock()

    def locked_report(s: int, b: int) -> None:
        with lock:
            report(s, b)

    ranges = _split(plans, workers)
    with ThreadPoolExecutor(max_workers=len(ranges), thread_name_prefix="iobench-gen") as pool:
        futures = [pool.submit(write_shards, spec, backend, r, report=locked_report, should_stop=stop.is_set)
                   for r in ranges]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in done if f.exception() is not None and not isinstance(f.exception(), _Stopped)),
                      None)
        if failed is not None:
            stop.set()
            wait(futures)
            raise failed.exception()
    return [e for f in futures for e in f.result()]


def _run_workers(spec, backend, plans, workers, endpoint_url, storage_options, report):
    # fork starts in milliseconds where spawn re-imports numpy/pyarrow; local files only, so no
    # async client state is inherited (object stores use _run_threads).
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()
    stop = ctx.Event()
    ranges = _split(plans, workers)
    procs = [ctx.Process(target=_worker, args=(dataclasses.asdict(spec), backend.url, endpoint_url,
                                               storage_options, r, q, stop), daemon=True)
             for r in ranges]
    for p in procs:
        p.start()
    entries: list[ShardEntry] = []
    finished = 0
    failure: _WorkerError | None = None
    try:
        while finished < len(procs):
            try:
                msg = q.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and failure is None:
                    failure = _WorkerError("error", f"a writer process died (exit code {dead[0].exitcode})")
                    stop.set()
                    break
                continue
            if msg[0] == "p":
                report(msg[1], msg[2])
            elif msg[0] == "done":
                entries.extend(ShardEntry.from_dict(d) for d in msg[1])
                finished += 1
            elif msg[0] == "stopped":
                finished += 1
            elif msg[0] == "error":
                finished += 1
                if failure is None:
                    failure = _WorkerError(msg[1], msg[2])
                    stop.set()
    except BaseException:
        stop.set()
        raise
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(5)
    if failure is not None:
        raise failure
    return entries, [p.pid for p in procs]
