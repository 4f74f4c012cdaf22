"""The names of iobench's dataset formats and where each is implemented — data only.

It lives in the core so that the manifest can refuse an unknown ``format`` as a field error
without importing the formats themselves (they import the manifest); ``iobench.formats``
turns each entry into its lazily imported module, with the install hint for its package.
"""

from __future__ import annotations

# name -> (module, optional third-party package it imports, pip extra that provides it)
FORMATS: dict[str, tuple[str, str | None, str | None]] = {
    "raw": ("iobench.formats.raw", None, None),
    "parquet": ("iobench.formats.parquet", "pyarrow", "parquet"),
    "tfrecord": ("iobench.formats.tfrecord", "crc32c", None),
    "tar": ("iobench.formats.tar", None, None),
    "files": ("iobench.formats.files", None, None),
    "npz": ("iobench.formats.npz", None, None),
    "npy": ("iobench.formats.npy", None, None),
    "megatron": ("iobench.formats.megatron", None, None),
    "hdf5": ("iobench.formats.hdf5", "h5py", "hdf5"),
    "arrow": ("iobench.formats.arrow", "pyarrow", "parquet"),
}


def format_names() -> list[str]:
    return list(FORMATS)
