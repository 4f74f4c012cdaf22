"""Which GPU read paths this node really has, and why not where it hasn't.

Three steps, each testable alone:

- ``host_facts(root)`` reads ``/proc``, ``/sys``, ``/dev``, ``/run/udev`` and ``/boot``
  under ``root`` (a fake tree in tests): NVIDIA driver, nvidia-fs, PCI P2PDMA, udev,
  library files;
- ``file_facts(path, root)``: the file's file system (mountinfo) and the driver of the
  block device under it (nvme, virtio_blk, ...);
- ``runtime_facts(timeout_s)`` runs ``_probe_child.py`` in a subprocess with a timeout —
  libcuda, device count, kvikio import, cuFile driver open — because cuFile's driver
  open can spin forever on machines without a GPU.  A hung child is killed and the stage
  it hung in becomes the reason;

then ``decide(facts)`` — a pure function — turns the facts into a capability per path.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .base import PATH_NAMES

CHILD = Path(__file__).with_name("_probe_child.py")
DEFAULT_TIMEOUT_S = 20.0
# File systems cuFile can DMA from (local, NVMe-oF, or GDS-enabled distributed ones).
GDS_FILESYSTEMS = ("ext4", "xfs", "lustre", "wekafs", "gpfs", "beegfs", "nfs", "nfs4")
GDS_BLOCK_DRIVERS = ("nvme",)
_LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib", "usr/local/cuda/lib64",
             "usr/local/cuda/targets/x86_64-linux/lib", "usr/lib/aarch64-linux-gnu")


def _read(p: Path) -> str | None:
    try:
        return p.read_text(errors="replace")
    except OSError:
        return None


def host_facts(root: str | os.PathLike = "/") -> dict:
    r = Path(root)
    nv = _read(r / "proc/driver/nvidia/version")
    nvfs_dir = r / "proc/driver/nvidia-fs"
    nvfs_version = _read(nvfs_dir / "version")
    kernel = _read(r / "proc/sys/kernel/osrelease")
    kernel = kernel.strip() if kernel else os.uname().release
    config = _read(r / f"boot/config-{kernel}")
    p2p_config = None
    if config is not None:
        p2p_config = "CONFIG_PCI_P2PDMA=y" in config
    p2pmem = len(glob.glob(str(r / "sys/bus/pci/devices/*/p2pmem")))
    libs: dict[str, list[str]] = {"libcuda": [], "libcufile": []}
    for d in _LIB_DIRS:
        for name in libs:
            libs[name] += sorted(str(Path("/") / Path(p).relative_to(r))
                                 for p in glob.glob(str(r / d / f"{name}.so*")))
    return {
        "nvidia_driver": nv.splitlines()[0].strip() if nv else None,
        "dev_nodes": sorted(os.path.basename(p) for p in glob.glob(str(r / "dev/nvidia[0-9]*"))),
        "nvidia_fs": {"loaded": nvfs_dir.is_dir(),
                      "version": nvfs_version.strip().splitlines()[0] if nvfs_version else None},
        "p2pdma": {"kernel_config": p2p_config, "p2pmem_devices": p2pmem},
        "run_udev": (r / "run/udev").is_dir(),
        "kernel": kernel,
        "libraries": libs,
    }


def nvfs_read_mib(root: str | os.PathLike = "/") -> int | None:
    """MiB nvidia-fs has DMA-read so far (``readMiB`` in its stats; counted only with rw_stats_enabled=1)."""
    text = _read(Path(root) / "proc/driver/nvidia-fs/stats")
    if not text:
        return None
    for line in text.splitlines():
        if line.strip().lower().startswith("reads") and "readMiB=" in line:
            try:
                return int(line.split("readMiB=")[1].split()[0])
            except (ValueError, IndexError):
                return None
    return None


def _mount_for(path: str, mountinfo: str) -> dict | None:
    best = None
    for line in mountinfo.splitlines():
        parts = line.split()
        if " - " not in line or len(parts) < 10:
            continue
        pre, post = line.split(" - ", 1)
        pre_f, post_f = pre.split(), post.split()
        mnt = pre_f[4].replace("\\040", " ")
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/") or mnt == "/") and \
                (best is None or len(mnt) >= len(best["mount_point"])):
                best = {"mount_point": mnt, "fs_type": post_f[0], "source": post_f[1], "dev": pre_f[2]}
    return best


def _block_driver(r: Path, dev: str) -> dict:
    """Driver and name of the disk behind major:minor ``dev`` (partitions resolve to their disk)."""
    node = r / "sys/dev/block" / dev
    if not node.exists():
        return {"block_device": None, "driver": None}
    real = Path(os.path.realpath(node))
    if (real / "partition").exists():
        real = real.parent
    out: dict = {"block_device": real.name, "driver": None}
    p = Path(os.path.realpath(real / "device")) if (real / "device").exists() else None
    for _ in range(5):
        if p is None:
            break
        drv = p / "driver"
        if drv.exists() or drv.is_symlink():
            out["driver"] = os.path.basename(os.path.realpath(drv))
            break
        p = p.parent
    if out["driver"] is None and real.name.startswith("nvme"):
        out["driver"] = "nvme"
    return out


def file_facts(path: str | None, root: str | os.PathLike = "/", dev: tuple[int, int] | None = None) -> dict:
    """File system and block device of ``path``; ``dev`` (major, minor) overrides stat() for fake trees."""
    if not path:
        return {}
    r = Path(root)
    apath = os.path.abspath(path)
    out: dict = {"path": apath}
    mountinfo = _read(r / "proc/self/mountinfo") or ""
    m = _mount_for(apath, mountinfo)
    if m:
        out.update(m)
    if dev is None:
        try:
            st = os.stat(apath)
            dev = (os.major(st.st_dev), os.minor(st.st_dev))
        except OSError as e:
            out["error"] = f"cannot stat: {e.strerror}"
            return out
    out["dev"] = f"{dev[0]}:{dev[1]}"
    out.update(_block_driver(r, out["dev"]))
    return out


def runtime_facts(timeout_s: float = DEFAULT_TIMEOUT_S, python: str | None = None,
                  child_cmd: list[str] | None = None) -> dict:
    """Run the probe child; on timeout kill its whole process group and say which stage hung."""
    cmd = child_cmd or [python or sys.executable, str(CHILD)]
    t0 = time.perf_counter_ns()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONNOUSERSITE": "1"})
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
    facts: dict = {"timed_out": timed_out, "timeout_s": timeout_s, "returncode": proc.returncode,
                   "pid": proc.pid, "elapsed_s": (time.perf_counter_ns() - t0) / 1e9}
    last_stage = None
    for line in (out or "").splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        last_stage = msg.get("stage")
        if msg.get("event") == "result":
            facts[msg["stage"]] = msg.get("result", {})
        elif msg.get("event") == "driver_open":
            last_stage = "cufile driver open"
    facts["last_stage"] = last_stage
    facts["complete"] = "done" in facts
    if not facts["complete"] and not timed_out:
        tail = (err or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        facts["error"] = f"probe child died in stage {last_stage!r}: {tail[0]}"
    return facts


@dataclass(frozen=True)
class Capability:
    path: str
    available: bool
    reasons: tuple[str, ...] = ()
    detail: dict = field(default_factory=dict)

    @property
    def reason(self) -> str | None:
        return "; ".join(self.reasons) if self.reasons else None

    def to_dict(self) -> dict:
        return {"available": self.available, "reason": self.reason, **({"detail": self.detail} if self.detail else {})}


def _gpu_reasons(host: dict, rt: dict) -> list[str]:
    if rt.get("timed_out") and "cuda" not in rt:
        return [f"the CUDA probe did not answer within {rt.get('timeout_s')} s"]
    cuda = rt.get("cuda")
    if cuda is None:
        return [rt.get("error") or "the CUDA probe gave no answer"]
    if not cuda.get("libcuda"):
        why = "no NVIDIA driver (libcuda.so.1 not found)"
        if not host.get("nvidia_driver") and not host.get("dev_nodes"):
            why += " and no /dev/nvidia* device"
        return [why]
    if cuda.get("device_count", 0) < 1:
        return [f"no usable CUDA device ({cuda.get('error', 'device count 0')})"]
    return []


def _kvikio_reasons(rt: dict) -> list[str]:
    libs = rt.get("libs", {})
    kv = rt.get("kvikio") or {}
    if kv.get("importable"):
        return []
    if not libs.get("kvikio"):
        return ["KvikIO is not installed (pip install kvikio-cu12 or kvikio-cu13: the 'gds' extra)"]
    return [f"KvikIO is installed but does not import ({kv.get('error', 'unknown error')})"]


def _cufile_reasons(host: dict, f: dict, rt: dict) -> list[str]:
    reasons = []
    if rt.get("timed_out") and rt.get("last_stage") in ("cufile", "cufile driver open"):
        reasons.append(f"cuFile's driver open did not return within {rt.get('timeout_s')} s and was killed "
                       "(libcufile can spin forever where GDS is not set up)")
    cf = rt.get("cufile") or {}
    if cf.get("driver_open") is False:
        reasons.append(f"cuFile's driver open failed ({cf.get('error')})")
    elif cf.get("driver_open") and cf.get("is_gds_available") is False:
        reasons.append("cuFile reports GDS unavailable (is_gds_available = false)")
    nvfs = host.get("nvidia_fs", {}).get("loaded")
    p2p = host.get("p2pdma", {})
    if not nvfs and not (p2p.get("kernel_config") and p2p.get("p2pmem_devices")):
        reasons.append("neither the nvidia-fs kernel module (/proc/driver/nvidia-fs) nor PCI P2PDMA is present, "
                       "so cuFile could only run in compat mode (POSIX)")
    if not host.get("run_udev"):
        reasons.append("/run/udev is missing (in a container, mount it read-only): cuFile cannot map files "
                       "to NVMe devices without it")
    if f:
        fs = f.get("fs_type")
        if fs and fs not in GDS_FILESYSTEMS:
            reasons.append(f"{f.get('path')} is on {fs}, which cuFile cannot DMA from "
                           f"(supported: {', '.join(GDS_FILESYSTEMS)})")
        elif fs in ("ext4", "xfs") and f.get("driver") not in GDS_BLOCK_DRIVERS:
            reasons.append(f"{f.get('path')} is on {fs} over {f.get('driver') or 'an unknown driver'} "
                           f"({f.get('block_device') or f.get('dev')}), not NVMe: cuFile would fall back to POSIX")
    return reasons


def decide(facts: dict) -> dict[str, Capability]:
    """Facts (``host``, ``file``, ``runtime``) -> a Capability for each path. Pure."""
    host, f, rt = facts.get("host", {}), facts.get("file", {}), facts.get("runtime", {})
    gpu = _gpu_reasons(host, rt)
    libs = rt.get("libs", {})
    caps: dict[str, Capability] = {}
    cpu_detail = {}
    if f.get("fs_type") == "tmpfs":
        cpu_detail["odirect"] = "tmpfs: O_DIRECT may be refused or is a no-op (pages live in memory)"
    caps["cpu"] = Capability("cpu", True, (), cpu_detail)
    array_lib = "torch" if libs.get("torch") else ("cupy" if libs.get("cupy") else None)
    bounce = list(gpu)
    if array_lib is None:
        bounce.append("neither torch nor cupy is installed (pip install torch, or cupy-cuda12x)")
    caps["bounce"] = Capability("bounce", not bounce, tuple(bounce), {"array_library": array_lib} if array_lib else {})
    kv = gpu + _kvikio_reasons(rt)
    kv_detail = {"kvikio_version": (rt.get("kvikio") or {}).get("version")} if not kv else {}
    caps["kvikio-compat"] = Capability("kvikio-compat", not kv, tuple(kv), kv_detail)
    cf = kv if kv else kv + _cufile_reasons(host, f, rt)
    cf_detail = {k: v for k, v in (rt.get("cufile") or {}).items() if k != "skipped"} if not cf else {}
    caps["cufile"] = Capability("cufile", not cf, tuple(cf), cf_detail)
    return {name: caps[name] for name in PATH_NAMES}


@dataclass
class Probe:
    facts: dict
    capabilities: dict[str, Capability]

    def best(self) -> str:
        return next(n for n in PATH_NAMES if self.capabilities[n].available)

    def to_dict(self) -> dict:
        return {"facts": self.facts, "paths": {n: c.to_dict() for n, c in self.capabilities.items()},
                "best_path": self.best()}


_RUNTIME_CACHE: dict[tuple, dict] = {}


def probe(path: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S, root: str | os.PathLike = "/",
          python: str | None = None, runtime: dict | None = None, cache: bool = True) -> Probe:
    """Gather facts (the runtime part once per process and interpreter) and decide."""
    if runtime is None:
        key = (python or sys.executable, str(root))
        if cache and key in _RUNTIME_CACHE:
            runtime = _RUNTIME_CACHE[key]
        else:
            runtime = runtime_facts(timeout_s, python=python)
            # A timeout is not cached: the next caller may grant more time.
            if cache and not runtime.get("timed_out"):
                _RUNTIME_CACHE[key] = runtime
    facts = {"host": host_facts(root), "file": file_facts(path, root), "runtime": runtime}
    return Probe(facts, decide(facts))
