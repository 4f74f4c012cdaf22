"""Optional packages behind pip extras, imported on first use with the install hint.

The core install stays small (no pyarrow, matplotlib, Pillow or SeaweedFS); a feature
that needs one of them calls ``require`` and a missing package becomes one line, exit 2:
``format 'parquet': needs the optional package 'pyarrow' (install it: pip install 'iobench[parquet]')``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

# import name -> (distribution on PyPI, iobench extra that provides it)
EXTRAS: dict[str, tuple[str, str]] = {
    "pyarrow": ("pyarrow", "parquet"),
    "matplotlib": ("matplotlib", "report"),
    "PIL": ("Pillow", "images"),
    "s3fs": ("s3fs", "s3"),
    "h5py": ("h5py", "hdf5"),
}


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` (a dotted name under one of EXTRAS) or raise the install hint."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if top not in EXTRAS or (getattr(e, "name", None) or top).split(".")[0] != top:
            raise
        package, extra = EXTRAS[top]
        raise MissingDependencyError(feature, package, extra) from e


def extra_of(module: str) -> str | None:
    """The pip extra that provides ``module``, if it is one of ours."""
    got = EXTRAS.get(module.split(".")[0])
    return got[1] if got else None
