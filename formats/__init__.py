"""Dataset formats: one module per format, each with a Writer and a Reader.

The registry maps a format name to the module that implements it and to the optional
package it needs, imported on first use with an install hint when missing.
"""

from __future__ import annotations

import importlib

from iobench.config import nearest
from iobench.errors import ConfigError, MissingDependencyError
from iobench.format_registry import FORMATS

from .base import FormatSpec, Reader, Sample, Writer

_REGISTRY = FORMATS   # the table is core data (iobench.format_registry): the manifest checks names with it


def format_names() -> list[str]:
    return list(_REGISTRY)


def get_format(name: str) -> FormatSpec:
    """The FormatSpec of ``name`` (module attribute ``FORMAT``), imported lazily."""
    if name not in _REGISTRY:
        raise ConfigError("format", f"unknown format {name!r}", nearest(name, _REGISTRY))
    module, package, extra = _REGISTRY[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        if package and getattr(e, "name", None) and e.name.split(".")[0] == package.split(".")[0]:
            raise MissingDependencyError(f"format {name!r}", package, extra) from e
        raise
    return mod.FORMAT


__all__ = ["FormatSpec", "Reader", "Sample", "Writer", "format_names", "get_format"]
