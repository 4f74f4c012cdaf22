"""The KvikIO paths: ``cufile`` (compat mode off, strict cuFile config) and ``kvikio-compat``.

cuFile silently falls back to POSIX in compat mode and KvikIO counts those bytes as
"GDS", so the effective path is judged from KvikIO's own statistics (``SummaryMonitor``
bytes by backend, KvikIO >= 26.10) and cuFile's driver properties — never from the name
that was asked for.  Only construct these readers after ``iobench.gds.detect`` has said
the path is available: cuFile's driver open can hang on machines without a GPU.
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
from typing import Any

from .base import GdsReader

DEFAULT_TASK_SIZE = 4 << 20
# cuFile logs to ./cufile.log unless told otherwise; keep it out of the user's working directory.
_STRICT_CONFIG = {"properties": {"allow_compat_mode": False},
                  "logging": {"level": "ERROR", "dir": tempfile.gettempdir()}}
_strict_config_path: str | None = None


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def strict_cufile_config() -> str:
    """Point cuFile at a config that forbids compat mode (unless the user set their own)."""
    global _strict_config_path
    if os.environ.get("CUFILE_ENV_PATH_JSON"):
        return os.environ["CUFILE_ENV_PATH_JSON"]
    if _strict_config_path is None:
        fd, path = tempfile.mkstemp(prefix="iobench-cufile-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(_STRICT_CONFIG, f)
        _strict_config_path = path
        atexit.register(_remove_quietly, path)
    os.environ["CUFILE_ENV_PATH_JSON"] = _strict_config_path
    return _strict_config_path


def is_direct_backend(name: str) -> bool:
    n = name.lower()
    return ("gds" in n or "cufile" in n) and "compat" not in n and "posix" not in n


def _set_defaults(kvikio, compat: bool, threads: int, task_size: int) -> None:
    mode = kvikio.CompatMode.ON if compat else kvikio.CompatMode.OFF
    defaults = kvikio.defaults
    if hasattr(defaults, "set"):
        defaults.set({"compat_mode": mode, "num_threads": threads, "task_size": task_size})
    else:  # KvikIO < 25.02
        defaults.compat_mode_reset(mode)
        defaults.num_threads_reset(threads)
        defaults.task_size_reset(task_size)


class KvikioReader(GdsReader):
    device_memory = True

    def __init__(self, path: str, *, compat: bool, threads: int = 8, task_size: int = DEFAULT_TASK_SIZE) -> None:
        super().__init__(path)
        self.compat = compat
        self.name = "kvikio-compat" if compat else "cufile"
        self.threads = threads
        self.task_size = task_size
        self.cufile_config = None if compat else strict_cufile_config()
        import kvikio
        import kvikio.defaults

        self._kvikio = kvikio
        _set_defaults(kvikio, compat, threads, task_size)
        monitor_cls = getattr(kvikio, "SummaryMonitor", None)
        self._monitor = monitor_cls() if monitor_cls is not None else None
        # With compat mode OFF, KvikIO raises here when cuFile cannot serve the file.
        self._file = kvikio.CuFile(self.path, "r")
        # KvikIO opens files without touching CUDA; a missing libcuda only shows on the first read.
        # Fail here, where open_reader can still fall back, rather than in the caller's hot loop.
        if os.path.getsize(self.path) > 0:
            import numpy as np

            try:
                self._file.pread(np.empty(1, dtype=np.uint8), 1, 0).get()
            except BaseException:
                self._file.close()
                raise
        self._baseline = self._monitor.get() if self._monitor is not None else None  # after the check read
        from .detect import nvfs_read_mib

        self._nvfs_before = None if compat else nvfs_read_mib()

    def read_into(self, dst: Any, offset: int, nbytes: int) -> int:
        got = int(self._file.pread(dst, nbytes, offset).get())
        self.bytes_read += got
        self.io_bytes += got
        self.calls += 1
        return got

    def evidence(self) -> dict:
        ev: dict = {"kvikio_version": getattr(self._kvikio, "__version__", None)}
        if self._monitor is not None:
            s = self._monitor.since(self._baseline)
            ev["bytes_by_backend"] = {k: int(v.get("bytes_transferred", 0)) for k, v in s.by_backend.items()}
            ev["source"] = "kvikio.SummaryMonitor"
        else:
            ev["source"] = "none (KvikIO without SummaryMonitor): compat_mode_preferred only"
        try:
            ev["compat_mode_preferred"] = bool(self._kvikio.defaults.is_compat_mode_preferred())
        except Exception:  # noqa: BLE001 - evidence is best effort
            pass
        if not self.compat:
            try:
                import kvikio.cufile_driver as cufile_driver

                ev["cufile"] = {"is_gds_available": bool(cufile_driver.get("is_gds_available")),
                                "allow_compat_mode": bool(cufile_driver.get("allow_compat_mode")),
                                "config": self.cufile_config}
            except Exception as e:  # noqa: BLE001
                ev["cufile"] = {"error": f"{type(e).__name__}: {e}"}
            from .detect import nvfs_read_mib

            after = nvfs_read_mib()
            if self._nvfs_before is not None and after is not None:
                # Counts every process on the node: evidence, not an exact attribution.
                ev["nvidia_fs_read_mib"] = after - self._nvfs_before
        return ev

    def effective_path(self) -> str:
        if self.compat:
            return "kvikio-compat"
        ev = self.evidence()
        by = ev.get("bytes_by_backend")
        if by:
            direct = sum(v for k, v in by.items() if is_direct_backend(k))
            other = sum(v for k, v in by.items() if not is_direct_backend(k))
            if other and not direct:
                return "kvikio-compat"
            if other and direct:
                return "cufile+posix"
            return "cufile"
        if ev.get("nvidia_fs_read_mib"):
            return "cufile"
        return "kvikio-compat" if ev.get("compat_mode_preferred") else "cufile"

    def describe(self) -> dict:
        d = super().describe()
        d.update({"threads": self.threads, "task_size": self.task_size, "compat_mode": self.compat,
                  "effective_path": self.effective_path(), "evidence": self.evidence()})
        return d

    def close(self) -> None:
        f = getattr(self, "_file", None)
        if f is not None and not f.closed:
            f.close()
        if self._monitor is not None:
            self._monitor.stop()
