"""Tiered storage: tier config, SQLite catalog, staging modes, eviction policies, lifecycle.

``import iobench.tiers`` stays light; the pieces load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .source import TierSource

_LAZY = {
    "TierManager": ("manager", "TierManager"),
    "DatasetRef": ("manager", "DatasetRef"),
    "TiersConfig": ("config", "TiersConfig"),
    "TierSpec": ("config", "TierSpec"),
    "load_tiers": ("config", "load_tiers"),
    "default_tiers": ("config", "default_tiers"),
    "TierSource": ("source", "TierSource"),
    "summarize_trace": ("source", "summarize_trace"),
    "plan_lifecycle": ("lifecycle", "plan_lifecycle"),
    "apply_lifecycle": ("lifecycle", "apply_lifecycle"),
}


def loader_source(tiers_file: str, staging: str, manifest, dataset_backend, **kw) -> "TierSource":
    """The loader's ShardSource over tiers (see iobench.tiers.source.loader_source)."""
    from .source import loader_source as _ls

    return _ls(tiers_file, staging, manifest, dataset_backend, **kw)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
    raise AttributeError(name)


__all__ = ["loader_source", *_LAZY]  # noqa: PLE0604  (the lazy names are strings: _LAZY's keys)
