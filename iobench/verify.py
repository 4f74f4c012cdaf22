"""Integrity check of a dataset against its manifest: size, checksum and sample count per shard.

Shards are streamed in chunks (bounded memory).  When a checksum does not match, the
first bad byte is located by regenerating the shard from the manifest's spec (samples
are a pure function of the seed) and comparing; for datasets not made by iobench the
report names the shard only.

Files in the dataset directory that look like shards (a listed shard's extension) but that the
manifest does not list are reported as warnings, not failures: typically left over from an
older dataset, or a foreign file; readers never see them.
"""

from __future__ import annotations

import logging
import posixpath
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from .errors import ConfigError
from .io.checksum import new_tally
from .manifest import MANIFEST_NAME, Manifest, ShardEntry, check_dataset_root
from .storage import Backend, open_backend

CHUNK = 8 * 2**20
WHOLE_SHARD_BYTES = 512 * 2**20   # larger shards are hashed in streamed chunks


@dataclass
class ShardProblem:
    shard: str
    problem: str               # missing | size | checksum | samples | unreadable | incomplete
    offset: int | None = None  # first bad byte (or the truncation point), when known
    detail: str = ""

    def __str__(self) -> str:
        at = f" at offset {self.offset}" if self.offset is not None else ""
        return f"{self.shard}{at}: {self.problem}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class VerifyReport:
    url: str
    ok: bool
    shards: int = 0
    shards_checked: int = 0
    bytes_checked: int = 0
    samples_checked: int = 0
    seconds: float = 0.0
    problems: list[ShardProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stray_files: list[str] = field(default_factory=list)   # look like shards, not in the manifest
    temp_files: list[str] = field(default_factory=list)    # atomic_open temp files a killed writer left

    @property
    def first_bad(self) -> ShardProblem | None:
        return self.problems[0] if self.problems else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["first_bad"] = asdict(self.first_bad) if self.first_bad else None
        return d


def verify_dataset(url: str, *, endpoint_url: str | None = None, storage_options: dict | None = None,
                   count_samples: bool = True, stop_at_first: bool = False, checksums: bool = True,
                   on_shard: Callable[[ShardEntry, int], None] | None = None) -> VerifyReport:
    """Check every shard of the dataset at ``url``; ``report.ok`` is False on any mismatch.

    A brace range or one shard (``iobench.index.resolve_dataset_url``) checks just those: as
    the root's manifest lists them, else as indexed now (sizes and sample counts)."""
    from .index import dataset_manifest, resolve_dataset_url

    ref = resolve_dataset_url(url)
    backend = open_backend(ref.root, endpoint_url=endpoint_url, storage_options=storage_options,
                           field_name="dataset", check=True)
    t0 = time.perf_counter_ns()
    check_dataset_root(backend)
    if ref.only is None and not backend.exists(MANIFEST_NAME):
        if not backend.exists(""):
            raise ConfigError("dataset", f"nothing at {url}", "give the root URL of a dataset (one `iobench gen` wrote, or `iobench index` indexed)")
        temps = temp_files(backend)
        left = (f"; {len(temps)} temp file(s) of an interrupted write are left (the next `iobench gen` "
                "removes them)") if temps else ""
        return VerifyReport(url=url, ok=False, temp_files=temps, problems=[ShardProblem(
            MANIFEST_NAME, "incomplete", detail="no manifest: generation did not finish, the dataset is not whole "
                                                "(a dataset iobench did not write: `iobench index URL --format ...`)"
                                                + left)])
    manifest = dataset_manifest(backend, ref.only)
    if checksums and any(s.checksum.split(":", 1)[0] == "none" for s in manifest.shards):
        checksums = False
        report_warning = ("the manifest holds no checksums (indexed without --checksums): sizes and sample "
                          "counts checked, not the bytes")
    else:
        report_warning = None
    report = VerifyReport(url=url, ok=True, shards=len(manifest.shards))
    if report_warning:
        report.warnings.append(report_warning)
    for shard in manifest.shards:
        problem = check_shard(backend, manifest, shard, count_samples=count_samples, checksums=checksums)
        report.shards_checked += 1
        if problem is None:
            report.bytes_checked += shard.bytes
            report.samples_checked += shard.samples
        else:
            report.problems.append(problem)
            report.ok = False
        if on_shard is not None:
            on_shard(shard, shard.bytes)
        if problem is not None and stop_at_first:
            break
    try:
        report.stray_files = stray_files(backend, manifest) if ref.only is None else []
    except Exception as e:  # listing is a courtesy; the shard checks stand on their own
        report.warnings.append(f"could not list {url} to look for stray shards ({type(e).__name__}: {e})")
    if report.stray_files:
        n = len(report.stray_files)
        shown = ", ".join(report.stray_files[:5]) + (f" and {n - 5} more" if n > 5 else "")
        report.warnings.append(f"{n} file(s) look like shards but are not in the manifest (ignored by "
                               f"readers; left from an older dataset?): {shown}")
    try:
        report.temp_files = temp_files(backend, manifest)
    except Exception:  # noqa: BLE001 - a courtesy, like the stray-file listing
        pass
    if report.temp_files:
        n = len(report.temp_files)
        report.warnings.append(f"{n} temp file(s) of an interrupted write (an earlier run was killed): "
                               f"{', '.join(report.temp_files[:5])}{' ...' if n > 5 else ''}; "
                               "the next `iobench gen` into this directory removes them")
    for w in report.warnings:
        _log.warning("warning: %s", w)
    report.seconds = (time.perf_counter_ns() - t0) / 1e9
    return report


_log = logging.getLogger("iobench.verify")


def _shard_suffix(path: str) -> str:
    name = posixpath.basename(path)
    dot = name.find(".", 1)
    return name[dot:] if dot > 0 else ""


def temp_files(backend: Backend, manifest: Manifest | None = None) -> list[str]:
    """Local only: ``atomic_open`` temp files (``.NAME.XXXXXXXX.tmp``) in the dataset's directories
    (the root and those holding listed shards; nested datasets are theirs to report)."""
    import os

    from .io.atomic import final_name_of

    if not backend.is_local:
        return []
    root = backend.root
    dirs = {""} | ({posixpath.dirname(s.path) for s in manifest.shards} if manifest is not None else set())
    out = []
    for d in sorted(dirs):
        try:
            names = os.listdir(os.path.join(root, d))
        except OSError:
            continue
        out.extend(posixpath.join(d, n) if d else n for n in names if final_name_of(n) is not None)
    return sorted(out)


def stray_files(backend: Backend, manifest: Manifest) -> list[str]:
    """Files under the dataset root that end like a listed shard or index file but are not listed.

    Hidden files (temp names of unfinished writes) and anything below a nested dataset (a
    subdirectory with its own manifest) are left out."""
    listed = {s.path for s in manifest.shards} | {s.index_path for s in manifest.shards if s.index_path}
    suffixes = {_shard_suffix(p) for p in listed} - {""}
    if not suffixes:
        return []
    root = backend.path("").rstrip("/")
    rels = []
    for full in backend.fs.find(root):
        rel = backend.relative(full)
        if rel is not None:
            rels.append(rel)
    nested = {posixpath.dirname(r) for r in rels if posixpath.basename(r) == MANIFEST_NAME} - {""}
    out = []
    for rel in rels:
        if rel in listed or posixpath.basename(rel).startswith("."):
            continue
        if any(rel.startswith(d + "/") for d in nested):
            continue
        if any(rel.endswith(sfx) for sfx in suffixes):
            out.append(rel)
    return sorted(out)


def check_shard(backend: Backend, manifest: Manifest, shard: ShardEntry, count_samples: bool = True,
                checksums: bool = True) -> ShardProblem | None:
    try:
        size = backend.size(shard.path)
    except FileNotFoundError:
        return ShardProblem(shard.path, "missing", detail="listed in the manifest but not found")
    if size != shard.bytes:
        return ShardProblem(shard.path, "size", offset=min(size, shard.bytes),
                            detail=f"{size} bytes, manifest says {shard.bytes}")
    if shard.index_path and not backend.exists(shard.index_path):
        return ShardProblem(shard.path, "missing", detail=f"its index {shard.index_path} is missing")
    algo = shard.checksum.split(":", 1)[0]
    if not checksums:
        if count_samples:
            try:
                n = count_shard_samples(backend, manifest, shard)
            except Exception as e:  # a structurally broken shard
                return ShardProblem(shard.path, "unreadable", detail=str(e))
            if n != shard.samples:
                return ShardProblem(shard.path, "samples", detail=f"{n} samples, manifest says {shard.samples}")
        return None
    if algo not in ("xxh64", "crc32c"):
        return ShardProblem(shard.path, "checksum", detail=f"unknown checksum algorithm {algo!r}")
    hasher = new_tally(algo)
    data = None
    if count_samples and shard.bytes <= WHOLE_SHARD_BYTES:
        data = backend.cat(shard.path)   # read once for both the checksum and the sample count
        hasher.write(data)
    else:
        with backend.open(shard.path, "rb") as f:
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                hasher.write(chunk)
    if hasher.digest() != shard.checksum:
        return ShardProblem(shard.path, "checksum", offset=first_bad_offset(backend, manifest, shard),
                            detail=f"{hasher.digest()}, manifest says {shard.checksum}")
    if count_samples:
        try:
            n = count_shard_samples(backend, manifest, shard, data)
        except Exception as e:  # a structurally broken shard whose checksum still matches the manifest
            return ShardProblem(shard.path, "unreadable", detail=str(e))
        if n != shard.samples:
            return ShardProblem(shard.path, "samples", detail=f"{n} samples, manifest says {shard.samples}")
    return None


def count_shard_samples(backend: Backend, manifest: Manifest, shard: ShardEntry, data: bytes | None = None) -> int:
    from .formats import get_format

    reader = get_format(manifest.format).reader(manifest)
    if data is None:
        data = backend.cat(shard.path)
    return reader.count_samples(data, shard)


class _Comparer:
    """A write-only sink that compares what is written with the stored shard and stops at the first difference."""

    class Found(Exception):
        pass

    def __init__(self, f) -> None:
        self.f = f
        self.pos = 0
        self.bad: int | None = None

    def write(self, b) -> int:
        b = bytes(b)
        actual = self.f.read(len(b))
        if actual != b:
            i = next((k for k, (x, y) in enumerate(zip(actual, b)) if x != y), min(len(actual), len(b)))
            self.bad = self.pos + i
            raise self.Found()
        self.pos += len(b)
        return len(b)

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass

    writable = lambda self: True  # noqa: E731
    seekable = lambda self: False  # noqa: E731
    closed = False

    def close(self) -> None:
        pass


def first_bad_offset(backend: Backend, manifest: Manifest, shard: ShardEntry) -> int | None:
    """Regenerate the shard from the manifest's spec and return the first differing byte, if we can."""
    if manifest.extra.get("generator") != "iobench.generate":
        return None
    from .formats import get_format
    from .generate import GenSpec, make_synth

    try:
        spec_map = {k: v for k, v in manifest.spec.items() if k != "synth_version"}
        spec = GenSpec.from_mapping(spec_map)
        from .synth import SYNTH_VERSION

        if manifest.spec.get("synth_version") != SYNTH_VERSION:
            return None
        fmt = get_format(manifest.format)
        synth = make_synth(spec)
        with backend.open(shard.path, "rb") as f:
            sink = _Comparer(f)
            try:
                w = fmt.writer(sink, modality=spec.modality, compression=spec.compression, token_dtype=spec.dtype,
                               vocab_size=spec.vocab_size, seq_len=spec.seq_len, num_samples=shard.samples)
                for i in range(shard.first_sample, shard.first_sample + shard.samples):
                    w.write(synth.sample(i))
                w.finish()
            except _Comparer.Found:
                return sink.bad
            return sink.pos if sink.pos < shard.bytes else None
    except Exception:  # locating is a bonus; the checksum mismatch stands on its own
        return None
