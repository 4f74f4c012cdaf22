"""Containment: every path read from a manifest, catalog, trace or config stays inside its root.

A dataset's manifest, a tier catalog or a checkpoint manifest is data someone else may
have written.  A path in it is *relative to a root* (the dataset, the tier, the checkpoint
directory); ``contained_rel`` refuses anything that could name a file outside that root —
``..`` components, absolute paths, drive letters, URLs, NUL bytes, and the same tricks
percent-encoded (``%2e%2e/``), since some stores decode them.  ``check_inside`` adds the
check that only the file system can answer: a symlink inside the root that points out of it.

Both raise ``ConfigError`` (exit 2) naming the field the path came from, so the user learns
which manifest entry is hostile or broken rather than getting a read of someone else's file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable
from urllib.parse import unquote

from .errors import ConfigError

_DRIVE = re.compile(r"^[A-Za-z]:")


def _escapes(text: str) -> str | None:
    """Why ``text`` (one decoding of a relative path) could leave its root, or None."""
    if "\x00" in text:
        return "contains a NUL byte"
    if text.startswith(("/", "\\")) or _DRIVE.match(text):
        return "is absolute"
    if "://" in text:
        return "is a URL"
    if any(part == ".." for part in re.split(r"[/\\]", text)):
        return "has a '..' component"
    return None


def contained_rel(rel, field: str, *, allow_empty: bool = False) -> str:
    """``rel`` normalised (no '.' or empty components), or ConfigError if it could leave its root."""
    if not isinstance(rel, str):
        raise ConfigError(field, f"must be a relative path string, got {type(rel).__name__}",
                          "regenerate the file that holds it")
    if not rel:
        if allow_empty:
            return ""
        raise ConfigError(field, "is an empty path", "regenerate the file that holds it")
    seen = rel
    for _ in range(3):  # %252e%252e decodes twice; three rounds cover what any store does
        why = _escapes(seen)
        if why is not None:
            raise ConfigError(field, f"{rel!r} {why}: it would leave its root",
                              "paths must be relative and stay inside the dataset/tier/checkpoint directory")
        decoded = unquote(seen)
        if decoded == seen:
            break
        seen = decoded
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts and not allow_empty:
        raise ConfigError(field, f"{rel!r} names the root itself", "name a file below the root")
    return "/".join(parts)


def check_inside(root: str, rel: str, field: str) -> str:
    """The real path of local ``root/rel``; ConfigError when a symlink takes it outside ``root``."""
    real_root = os.path.realpath(root)
    long = next((c for c in rel.split("/") if len(c.encode(errors="surrogateescape")) > 255), None)
    if long is not None:   # no local file system holds such a name: "File name too long" named no field
        raise ConfigError(field, f"a name in {rel[:40]!r}... is {len(long.encode(errors='surrogateescape'))} bytes, "
                          "more than a file system allows (255)", "regenerate the file that holds it")
    full = os.path.realpath(os.path.join(real_root, rel))
    if full != real_root and not full.startswith(real_root.rstrip(os.sep) + os.sep):
        raise ConfigError(field, f"{rel!r} resolves through a symlink to {full}, outside {root}",
                          "replace the symlink with the file itself, or remove the entry")
    return full


# ---- roots that must not overlap -----------------------------------------------------------
# One rule for every set of roots a command holds (tiers, checkpoint local/durable, dataset and
# output directories): neither the same place nor nested.  iobench.guard applies it to a
# command's flags, TiersConfig to its tiers, the checkpointer to its two tiers.

def is_local(path: str) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def real(path: str) -> str:
    p = str(path)
    p = p[len("file://"):] if p.startswith("file://") else p
    return os.path.realpath(os.path.abspath(p))


def root_key(url: str) -> str:
    """A place as compared for overlap: a local path's real path; a URL as its file system addresses it,
    under the protocol's canonical name (``s3a://b/x`` is ``s3://b/x``, ``memory:///m`` is ``memory://m``,
    ``S3://`` is ``s3://``), without a trailing '/'.  What fsspec keeps apart stays apart (``s3://b//x``
    is another key than ``s3://b/x``)."""
    if is_local(url):
        return real(url)
    scheme, _, rest = str(url).partition("://")
    proto = scheme.lower()
    try:
        import fsspec

        cls = fsspec.get_filesystem_class(proto)
        names = cls.protocol if isinstance(cls.protocol, (tuple, list)) else (cls.protocol,)
        return f"{names[0]}://{str(cls._strip_protocol(f'{proto}://{rest}')).strip('/')}"
    except Exception:  # noqa: BLE001 - an unknown or uninstalled protocol: compared as written
        return f"{proto}://{rest}".rstrip("/")


def within(inner: str, outer: str) -> bool:
    """``inner`` is ``outer`` or below it (both real paths)."""
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def overlap(a: str, b: str) -> bool:
    return within(a, b) or within(b, a)


@dataclass(frozen=True)
class Held:
    """One path a command holds: where it came from (for the message) and its real path."""

    label: str
    dest: str
    path: str
    given: str
    tree: bool = True    # outputs may not lie below it either (a root); False: only the path itself


def check_disjoint(roots: Iterable[Held], fix: str = "give each its own directory, neither inside the other") -> None:
    """Every pair of ``roots`` is neither the same place nor nested: else ConfigError naming both."""
    seen: list[Held] = []
    for r in roots:
        for s in seen:
            if overlap(r.path, s.path):
                how = "is the same directory as" if r.path == s.path else (
                    "lies inside" if within(r.path, s.path) else "contains")
                raise ConfigError(r.label, f"{r.given} {how} {s.label} ({s.given})", fix)
        seen.append(r)
