"""Lifecycle rules over tiers, e.g. for checkpoints: keep the last K on a hot tier (``pfs``),
copy every N-th to an archive tier (``object``), expire the rest.

``plan_lifecycle`` is pure (names in, plan out) so retention can be reasoned about and
tested without storage; ``apply_lifecycle`` carries a plan out over a TierManager's
backends.  Ownership is by record, not by place: an item is a checkpoint step whose own
manifest says iobench committed it (``is_iobench_checkpoint``); the user's files on the hot
tier, whatever ``--prefix``, are never items and are never deleted.  An item (a file or a directory of files, e.g. one checkpoint) leaves the hot
tier only after its archive copy is complete and verified, and a directory's manifest is
copied last, so the archive never shows a checkpoint as committed before all its files are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..errors import ConfigError

_MANIFEST_NAMES = ("manifest.json", "MANIFEST", "index.json", "COMMITTED")


@dataclass(frozen=True)
class LifecyclePlan:
    keep: tuple[str, ...]        # stay on the hot tier (the newest K)
    archive: tuple[str, ...]     # copied to the archive tier (every N-th)
    drop: tuple[str, ...]        # removed from the hot tier (everything not kept)
    expire: tuple[str, ...]      # dropped and not archived: gone from every tier

    def to_dict(self) -> dict:
        return {"keep": list(self.keep), "archive": list(self.archive), "drop": list(self.drop),
                "expire": list(self.expire)}


def plan_lifecycle(items: Sequence[str] | Sequence[tuple[str, int]], keep_last: int, every_nth: int = 0,
                   already_archived: Sequence[str] = ()) -> LifecyclePlan:
    """Items oldest first, as names (numbered 1, 2, ...) or (name, number) pairs.

    Keeps the newest ``keep_last`` on the hot tier, archives those whose number is a multiple
    of ``every_nth`` (0: archive none), expires the rest.
    """
    if keep_last < 1:
        raise ConfigError("lifecycle.keep_last", f"must be at least 1, got {keep_last}",
                          "keep at least the newest item")
    if every_nth < 0:
        raise ConfigError("lifecycle.every_nth", f"must be 0 (off) or positive, got {every_nth}", "use e.g. 100")
    numbered = [(it, i) if isinstance(it, str) else (str(it[0]), int(it[1])) for i, it in enumerate(items, 1)]
    names = [n for n, _ in numbered]
    if len(set(names)) != len(names):
        raise ConfigError("lifecycle.items", "an item is listed twice", "give each item once")
    keep = tuple(names[-keep_last:])
    done = set(already_archived)
    archive = tuple(n for n, k in numbered if every_nth and k % every_nth == 0 and n not in done)
    archived = set(archive) | done
    drop = tuple(n for n in names if n not in keep)
    expire = tuple(n for n in drop if n not in archived)
    return LifecyclePlan(keep=keep, archive=archive, drop=drop, expire=expire)


@dataclass
class LifecycleReport:
    archived: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    bytes_archived: int = 0
    errors: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"archived": self.archived, "dropped": self.dropped, "expired": self.expired,
                "bytes_archived": self.bytes_archived, "errors": self.errors}


def _files_under(backend, rel: str) -> list[tuple[str, int]]:
    """(relative path, size) of a file, or of every file below a directory/prefix; manifests last."""
    fs, full = backend.fs, backend.path(rel)
    if fs.isfile(full):
        return [(rel, int(fs.size(full)))]
    out = []
    root = backend.path("").rstrip("/")
    for path, info in fs.find(full, detail=True).items():
        sub = path[len(root):].lstrip("/") if root else path
        out.append((sub, int(info.get("size") or 0)))
    out.sort(key=lambda x: (x[0].rsplit("/", 1)[-1] in _MANIFEST_NAMES, x[0]))
    return out


def _copy_item(src, dst, rel: str) -> int:
    """Copy a file or a directory's files (manifests last), each read back from the archive."""
    from ..io.copy import copy_verified

    total = 0
    for path, size in _files_under(src, rel):
        copy_verified(src, path, dst, path, size, None, retries=1, read_back=True)
        total += size
    return total


def check_lifecycle_tiers(config, hot: str, archive: str) -> None:
    """Refuse a lifecycle whose archive is the hot tier itself (or overlaps it): the "archive copy"
    would be the item, and expiring would delete the only copy."""
    if hot == archive:
        raise ConfigError("--archive", f"is the hot tier {hot!r}: archiving onto itself then expiring deletes "
                          "the only copy", "give a different tier as --archive")
    from .manager import _norm_url

    h, a = _norm_url(config.tier(hot, "--hot").url), _norm_url(config.tier(archive, "--archive").url)
    if h == a or h.startswith(a + "/") or a.startswith(h + "/"):
        raise ConfigError("--archive", f"tier {archive!r} ({a}) overlaps hot tier {hot!r} ({h})",
                          "give an archive tier stored somewhere else")


CHECKPOINT_FORMAT = "iobench-checkpoint"   # checkpointing.commit_point.FORMAT, the record an item carries


def is_iobench_checkpoint(backend, rel: str) -> bool:
    """Whether ``rel`` on ``backend`` is a checkpoint step iobench committed: a directory whose
    ``manifest.json`` says ``format: iobench-checkpoint``.  That manifest is the record that
    makes an item lifecycle's to move or expire; anything else on a tier is the user's."""
    from ..io.inputs import loads_json

    man = f"{rel.strip('/')}/manifest.json"
    try:
        if backend.is_local:
            from ..io.inputs import read_bytes

            raw = read_bytes(backend.path(man), "lifecycle item", 64 << 20, "checkpoint manifest")
        else:
            raw = backend.cat(man)
        data = loads_json(raw)
    except (OSError, ValueError, ConfigError):
        return False
    return isinstance(data, dict) and data.get("format") == CHECKPOINT_FORMAT


def lifecycle_items(manager, hot: str, prefix: str, names: Sequence[str]) -> list[str]:
    """``names`` (listed under ``prefix`` on ``hot``) that are lifecycle's to manage: checkpoint
    steps iobench committed (``is_iobench_checkpoint``), never the catalog's copy directories,
    an item holding or inside a registered dataset's origin, or any file of the user's."""
    from .manager import _norm_url

    ids, origins = manager.owned_paths(hot)
    base = _norm_url(manager.spec(hot).url)
    src = manager.backend(hot)
    out = []
    for n in names:
        if n in ids and not prefix:
            continue
        full = _norm_url(f"{base}/{prefix.strip('/')}/{n}" if prefix.strip("/") else f"{base}/{n}")
        if any(o == full or o.startswith(full + "/") or full.startswith(o + "/") for o in origins):
            continue
        if not is_iobench_checkpoint(src, f"{prefix.strip('/')}/{n}" if prefix.strip("/") else n):
            continue
        out.append(n)
    return out


def apply_lifecycle(manager, plan: LifecyclePlan, hot: str = "pfs", archive: str = "object",
                    prefix: str = "") -> LifecycleReport:
    """Carry out ``plan`` on ``manager``'s tiers; item names are paths under ``prefix`` on each tier.

    Every archive copy is made and verified first; if any fails, nothing is dropped or expired."""
    check_lifecycle_tiers(manager.config, hot, archive)
    src, dst = manager.backend(hot), manager.backend(archive)
    rep = LifecycleReport()

    def rel(name: str) -> str:
        return f"{prefix.strip('/')}/{name}" if prefix else name

    for name in plan.archive:
        if dst.exists(rel(name)) and not is_iobench_checkpoint(dst, rel(name)):
            # the archive holds something else under that name: never written over
            rep.errors[name] = f"{dst.url}/{rel(name)} exists on the archive tier and is not a checkpoint iobench " \
                               "committed: not archived"
            continue
        try:
            rep.bytes_archived += _copy_item(src, dst, rel(name))
            rep.archived.append(name)
        except Exception as e:  # keep the hot copy; report and go on
            rep.errors[name] = f"{type(e).__name__}: {e}"
    if rep.errors:
        return rep   # an archive copy is not verified: expire nothing, drop nothing
    for name in plan.drop:
        if not is_iobench_checkpoint(src, rel(name)):
            rep.errors[name] = "not a checkpoint iobench committed: left in place"
            continue
        try:
            src.rm(rel(name), recursive=True)
        except FileNotFoundError:
            pass
        (rep.expired if name in plan.expire else rep.dropped).append(name)
    return rep
