"""GPU-direct read paths (cuFile via KvikIO, compat, bounce, CPU) with honest path detection.

``open_reader(name, path)`` returns ``(reader, effective_path, reason)``: the reader of
the requested path when this node has it, else (unless ``strict``) of the best path it
falls back to, with the reason recorded and a warning issued.  Importing this package
needs no optional package; KvikIO, torch and cupy are imported only by the readers that
use them, and only after ``detect`` (a subprocess with a timeout) said they work.
"""

from __future__ import annotations

import warnings
from typing import Any

from iobench.config import nearest
from iobench.errors import ConfigError

from .base import DEVICE_PATHS, PATH_NAMES, GdsReader

__all__ = ["DEVICE_PATHS", "PATH_NAMES", "GdsReader", "GdsFallbackWarning", "check_path_name", "load_file",
           "make_reader", "open_reader"]


class GdsFallbackWarning(RuntimeWarning):
    """A requested GPU read path is unavailable; another one ran instead."""


def check_path_name(name: str, field: str = "path") -> str:
    if name not in PATH_NAMES:
        raise ConfigError(field, f"unknown GPU read path {name!r}", nearest(name, PATH_NAMES))
    return name


def make_reader(name: str, path: str, **opts: Any) -> GdsReader:
    """Construct the reader of ``name`` without any availability check (callers: open_reader)."""
    check_path_name(name)
    if name == "cpu":
        from .cpu import CpuReader

        return CpuReader(path, **{k: v for k, v in opts.items() if k in ("threads", "task_size", "odirect",
                                                                          "alignment")})
    if name == "bounce":
        from .bounce import BounceReader

        return BounceReader(path, **{k: v for k, v in opts.items() if k in ("threads", "task_size", "buffers",
                                                                             "device", "lib")})
    from .kvikio_paths import KvikioReader

    return KvikioReader(path, compat=(name == "kvikio-compat"),
                        **{k: v for k, v in opts.items() if k in ("threads", "task_size")})


def open_reader(name: str, path: str, *, strict: bool = False, probe: Any = None, field: str = "path",
                **opts: Any) -> tuple[GdsReader, str, str | None]:
    """(reader, effective path, fallback reason or None) for GPU path ``name`` on file ``path``.

    ``strict`` turns an unavailable path into ``ConfigError`` (exit 2) instead of a fallback.
    ``probe`` is a ``detect.Probe`` to reuse; by default one is run (cached per process).
    Options: threads, task_size, odirect, alignment (cpu), buffers, device, lib (bounce).
    """
    check_path_name(name, field)
    if name == "cpu":
        return make_reader("cpu", path, **opts), "cpu", None
    from . import detect

    pr = probe if probe is not None else detect.probe(path)
    cap = pr.capabilities[name]
    reasons: list[str] = []
    candidates = list(PATH_NAMES[PATH_NAMES.index(name):])
    if not cap.available:
        if strict:
            raise ConfigError(field, f"GPU read path {name!r} is unavailable here: {cap.reason}",
                              "run `iobench gds probe` to see what this node has, or drop --strict to fall back")
        reasons.append(f"{name}: {cap.reason}")
        candidates = [c for c in candidates[1:] if pr.capabilities[c].available]
    for cand in candidates:
        try:
            reader = make_reader(cand, path, **opts)
        except Exception as e:  # noqa: BLE001 - a path that fails to open falls back, with its error recorded
            if strict and cand == name:
                raise ConfigError(field, f"GPU read path {name!r} failed to open {path}: {type(e).__name__}: {e}",
                                  "run `iobench gds probe`, or drop --strict to fall back") from e
            reasons.append(f"{cand}: failed to open ({type(e).__name__}: {e})")
            continue
        reason = "; ".join(reasons) or None
        if reason:
            warnings.warn(f"GPU read path {name!r} fell back to {cand!r}: {reason}", GdsFallbackWarning, stacklevel=2)
        return reader, cand, reason
    raise ConfigError(field, f"no GPU read path works for {path}: {'; '.join(reasons)}", "run `iobench gds probe`")


def load_file(name: str, path: str, *, strict: bool = False, probe: Any = None, field: str = "path",
              **opts: Any) -> tuple[Any, int, str, str | None]:
    """A whole file (e.g. a checkpoint shard) in memory by GPU path ``name``, with fallback.

    Returns ``(buffer, nbytes, effective_path, reason)``: a device uint8 array (torch, else
    cupy) for the GPU paths, a page-aligned host numpy array for ``cpu``.
    """
    import os

    from .base import aligned_host

    size = os.path.getsize(path)
    reader, eff, reason = open_reader(name, path, strict=strict, probe=probe, field=field, **opts)
    try:
        if reader.device_memory:
            from .bounce import device_lib

            buf = device_lib(opts.get("lib")).alloc(max(size, 1))
        else:
            buf = aligned_host(size)
        got = reader.read_into(buf, 0, size)
        if got != size:
            raise OSError(f"{path}: read {got} of {size} bytes (the file changed while reading?)")
        return buf, got, eff, reason
    finally:
        reader.close()
