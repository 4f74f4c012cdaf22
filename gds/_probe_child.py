"""Runs in a child process (stdlib only, any interpreter): the checks that can hang or crash.

Prints one JSON line when each stage starts and one with its result, flushing each, so
the parent can tell which stage hung when it has to kill us.  Stages: cuda (libcuda,
cuInit, device count), libs (torch/cupy/kvikio installed?), kvikio (import), cufile
(libcufile version, driver open, properties) — the last only where a GPU answered.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import sys


def emit(stage: str, **kw) -> None:
    sys.stdout.write(json.dumps({"stage": stage, **kw}) + "\n")
    sys.stdout.flush()


def check_cuda() -> dict:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return {"libcuda": False, "device_count": 0, "error": f"libcuda.so.1 not loadable: {e}"}
    out: dict = {"libcuda": True}
    rc = lib.cuInit(0)
    if rc != 0:
        out.update(device_count=0, error=f"cuInit failed with CUresult {rc}")
        return out
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    out["device_count"] = count.value if rc == 0 else 0
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
        out["driver_version"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
    if out["device_count"] == 0:
        out["error"] = "no CUDA device visible" if rc == 0 else f"cuDeviceGetCount failed with CUresult {rc}"
    return out


def check_libs() -> dict:
    found: dict = {}
    for mod in ("torch", "cupy", "kvikio"):
        try:
            found[mod] = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found[mod] = False
    # libcufile shipped as a wheel (nvidia-cufile-cu12) rather than with the CUDA toolkit
    try:
        spec = importlib.util.find_spec("nvidia.cufile")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        import glob
        import os

        found["libcufile_wheel"] = sorted(
            p for loc in spec.submodule_search_locations for p in glob.glob(os.path.join(loc, "lib", "libcufile.so*")))
    return found


def check_kvikio() -> tuple[dict, object]:
    try:
        import kvikio
        import kvikio.defaults
    except Exception as e:  # noqa: BLE001 - any failure means "unavailable", with its text
        return {"importable": False, "error": f"{type(e).__name__}: {e}"}, None
    out = {"importable": True, "version": getattr(kvikio, "__version__", None),
           "summary_monitor": hasattr(kvikio, "SummaryMonitor")}
    try:
        out["compat_mode_preferred"] = bool(kvikio.defaults.is_compat_mode_preferred())
    except Exception as e:  # noqa: BLE001
        out["compat_mode_preferred_error"] = f"{type(e).__name__}: {e}"
    return out, kvikio


def check_cufile() -> dict:
    import kvikio.cufile_driver as cufile_driver

    out: dict = {}
    try:
        major, minor = cufile_driver.libcufile_version()
        out["libcufile_version"] = f"{major}.{minor}" if (major, minor) != (0, 0) else "<1.8 or absent"
    except Exception as e:  # noqa: BLE001
        out["libcufile_version_error"] = f"{type(e).__name__}: {e}"
    emit("cufile", event="driver_open")
    try:
        cufile_driver.driver_open()
    except Exception as e:  # noqa: BLE001
        out.update(driver_open=False, error=f"{type(e).__name__}: {e}")
        return out
    out["driver_open"] = True
    for prop in ("is_gds_available", "allow_compat_mode", "major_version", "minor_version"):
        try:
            out[prop] = cufile_driver.get(prop)
        except Exception as e:  # noqa: BLE001
            out[prop + "_error"] = f"{type(e).__name__}: {e}"
    try:
        cufile_driver.driver_close()
    except Exception:  # noqa: BLE001
        pass
    return out


def main() -> int:
    emit("cuda", event="start")
    cuda = check_cuda()
    emit("cuda", event="result", result=cuda)
    emit("libs", event="start")
    emit("libs", event="result", result=check_libs())
    emit("kvikio", event="start")
    kv, mod = check_kvikio()
    emit("kvikio", event="result", result=kv)
    if mod is not None and cuda.get("device_count", 0) > 0:
        emit("cufile", event="start")
        emit("cufile", event="result", result=check_cufile())
    else:
        emit("cufile", event="result",
             result={"skipped": "no CUDA device" if mod is not None else "kvikio not importable"})
    emit("done", event="result", result={})
    return 0


if __name__ == "__main__":
    sys.exit(main())
