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
    full = os.path.realpath(os.path.join(real_root, rel))
    if full != real_root and not full.startswith(real_root.rstrip(os.sep) + os.sep):
        raise ConfigError(field, f"{rel!r} resolves through a symlink to {full}, outside {root}",
                          "replace the symlink with the file itself, or remove the entry")
    return full
