"""The commit point: a checkpoint exists when, and only when, its manifest does.

Layout on every tier::

    <root>/step-000000000120/rank-00003.bin     one file per rank: its shards, back to back
    <root>/step-000000000120/manifest.json      written last; names files, sizes, checksums, layout

Publishing the manifest is the commit.  On a local or parallel file system: temp file,
fsync, rename, fsync of the step directory and of the root.  On S3: a single PUT after
every shard object has been uploaded, with a conditional create (``If-None-Match: *``
through s3fs mode ``"xb"``) where the server supports it, so a step is never committed twice.
Retention removes the manifest first, so a half-deleted checkpoint is never mistaken for a
committed one.
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass, field

from iobench.io.atomic import fsync_dir, publish_new
from iobench.io.inputs import loads_json
from iobench.errors import IntegrityError, StorageError
from iobench.results import now_iso
from iobench.storage import Backend

from .hooks import crashpoint
from .state import Shard, StateSpec

MANIFEST = "manifest.json"
FORMAT = "iobench-checkpoint"
VERSION = 1
_STEP_RE = re.compile(r"^step-(\d{12,})$")   # 12 digits, more past step 999999999999


def step_dir(step: int) -> str:
    return f"step-{int(step):012d}"


def rank_file(rank: int) -> str:
    return f"rank-{int(rank):05d}.bin"


@dataclass(frozen=True)
class RankFile:
    rank: int
    path: str                 # relative to the step directory
    bytes: int
    checksum: str             # "xxh3_64:<hex>"
    shards: tuple[tuple[Shard, int], ...]   # (shard, byte offset in the file)

    def to_dict(self) -> dict:
        return {"rank": self.rank, "path": self.path, "bytes": self.bytes, "checksum": self.checksum,
                "shards": [s.to_list() + [off] for s, off in self.shards]}

    @classmethod
    def from_dict(cls, d: dict) -> "RankFile":
        from iobench.paths import contained_rel

        # A manifest is data: its file path must stay inside the step directory.
        return cls(rank=int(d["rank"]), path=contained_rel(d["path"], "checkpoint manifest files[].path"),
                   bytes=int(d["bytes"]), checksum=d["checksum"],
                   shards=tuple((Shard.from_list(v[:6]), int(v[6])) for v in d["shards"]))


@dataclass(frozen=True)
class CheckpointManifest:
    step: int
    spec: StateSpec
    files: tuple[RankFile, ...]
    created_at: str = field(default_factory=now_iso)
    extra: dict = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_json(self) -> bytes:
        d = {"format": FORMAT, "version": VERSION, "step": self.step, "created_at": self.created_at,
             "total_bytes": self.total_bytes, "ranks": self.spec.ranks, "spec": self.spec.to_dict(),
             "extra": self.extra, "files": [f.to_dict() for f in self.files]}
        return json.dumps(d, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> "CheckpointManifest":
        d = loads_json(raw)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not an iobench checkpoint manifest")
        if int(d.get("version", 0)) > VERSION:
            raise ValueError(f"manifest version {d['version']} is newer than this iobench reads")
        return cls(step=int(d["step"]), spec=StateSpec.from_dict(d["spec"]),
                   files=tuple(RankFile.from_dict(f) for f in d["files"]), created_at=d.get("created_at", ""),
                   extra=d.get("extra", {}))


def list_steps(backend: Backend) -> list[int]:
    """Step directories present on the tier, committed or not, oldest first."""
    out = []
    for p in backend.ls("", detail=False):
        m = _STEP_RE.match(os.path.basename(str(p).rstrip("/")))
        if m:
            out.append(int(m.group(1)))
    return sorted(set(out))


def is_committed(backend: Backend, step: int) -> bool:
    return backend.exists(f"{step_dir(step)}/{MANIFEST}")


def committed_steps(backend: Backend) -> list[int]:
    return [s for s in list_steps(backend) if holds_own_manifest(backend, s)]


def load_manifest(backend: Backend, step: int) -> CheckpointManifest:
    """The step's manifest; IntegrityError (with the reason) when it is missing or unreadable."""
    rel = f"{step_dir(step)}/{MANIFEST}"
    try:
        raw = backend.cat(rel)
    except FileNotFoundError:
        raise IntegrityError(f"{backend.url}/{rel}: no manifest (not committed)") from None
    try:
        m = CheckpointManifest.from_json(raw)
    except (ValueError, KeyError, TypeError) as e:
        raise IntegrityError(f"{backend.url}/{rel}: manifest unreadable ({e})") from e
    if m.step != step:
        raise IntegrityError(f"{backend.url}/{rel}: manifest names step {m.step}")
    return m


def publish(backend: Backend, manifest: CheckpointManifest, fsync: bool = True) -> dict:
    """Commit ``manifest``; call only after every file it names is durable on this tier."""
    rel = f"{step_dir(manifest.step)}/{MANIFEST}"
    data = manifest.to_json()
    crashpoint("before_manifest")
    if backend.is_local:
        return _publish_local(backend, rel, data, fsync)
    if backend.speaks_s3:
        return _publish_s3(backend, rel, data)
    backend.write_bytes(rel, data, fsync=fsync)
    crashpoint("mid_manifest_publish")
    return {"conditional": False}


def _publish_local(backend: Backend, rel: str, data: bytes, fsync: bool) -> dict:
    final = backend.local_path(rel)
    d = os.path.dirname(final)
    try:
        publish_new(final, data, fsync=fsync, before_publish=lambda: crashpoint("mid_manifest_publish"))
    except FileExistsError as e:
        raise StorageError(f"{final}: step already committed") from e
    if fsync:
        fsync_dir(os.path.dirname(d))
    return {"conditional": True, "fsync": fsync}


def _publish_s3(backend: Backend, rel: str, data: bytes) -> dict:
    path = backend.path(rel)
    try:
        with backend.fs.open(path, "xb") as f:
            f.write(data)
            crashpoint("mid_manifest_publish")
        return {"conditional": True}
    except FileExistsError:
        raise StorageError(f"s3://{path}: step already committed") from None
    except OSError as e:
        # s3fs maps 412 PreconditionFailed (If-None-Match: * on an existing key) to EINVAL.
        if e.errno == errno.EINVAL and "condition" in str(e).lower():
            raise StorageError(f"s3://{path}: step already committed") from None
        raise
    except (NotImplementedError, ValueError, TypeError):
        # Older s3fs without exclusive create: check, then a plain PUT (still written last).
        if backend.fs.exists(path):
            raise StorageError(f"s3://{path}: step already committed") from None
        with backend.fs.open(path, "wb") as f:
            f.write(data)
        return {"conditional": False}


def uncommit(backend: Backend, step: int) -> None:
    """Remove the manifest (first step of deleting a checkpoint) -- only an iobench checkpoint
    manifest: a ``manifest.json`` someone else put in a ``step-NNNNNNNNNNNN`` directory is theirs."""
    rel = f"{step_dir(step)}/{MANIFEST}"
    if not holds_own_manifest(backend, step):
        return
    if backend.is_local:
        try:
            os.unlink(backend.local_path(rel))
        except FileNotFoundError:
            return
        fsync_dir(backend.local_path(step_dir(step)))
    else:
        try:
            backend.rm(rel)
        except FileNotFoundError:
            pass


_RANK_RE = re.compile(r"rank-\d{5}\.bin")


def written_here(name: str) -> bool:
    """Whether a file named ``name`` in a step directory is one iobench writes there: the manifest,
    a rank file, or a temp file standing for one.  Ownership by name *inside a step directory iobench
    made*: a step directory name alone (``step-000000000001``, which anyone may have) owns nothing."""
    from iobench.io.atomic import final_name_of

    final = final_name_of(name) or name
    return final == MANIFEST or bool(_RANK_RE.fullmatch(final))


def holds_own_manifest(backend: Backend, step: int) -> bool:
    """The step directory holds an iobench checkpoint manifest (not just any ``manifest.json``)."""
    try:
        CheckpointManifest.from_json(backend.cat(f"{step_dir(step)}/{MANIFEST}"))
    except (FileNotFoundError, ValueError, KeyError, TypeError, OSError):
        return False
    return True


def delete_step(backend: Backend, step: int) -> None:
    """Uncommit, then remove iobench's files; a crash in between leaves only an uncommitted directory."""
    uncommit(backend, step)
    crashpoint("mid_retention")
    remove_own_files(backend, step)


def remove_own_files(backend: Backend, step: int) -> None:
    """Remove what iobench writes into the step directory (``written_here``), and the directory once
    nothing else is left in it: a user's file in a ``step-NNNNNNNNNNNN`` directory, a foreign
    ``manifest.json``, or a directory of that name iobench never wrote, stays exactly as it was."""
    d = step_dir(step)
    left = False
    for p in backend.ls(d, detail=False):
        name = os.path.basename(str(p).rstrip("/"))
        if not written_here(name) or name == MANIFEST:   # a manifest still here after uncommit is not ours
            left = True
            continue
        try:
            backend.rm(f"{d}/{name}")
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            left = True
    if backend.is_local:
        if not left:
            try:
                os.rmdir(backend.local_path(d))
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        fsync_dir(backend.local_path(""))
