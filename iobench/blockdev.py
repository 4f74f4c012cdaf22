"""The block device under a path, and the bytes it actually read (``/proc/diskstats``, cgroup blkio).

A loader that asks for 4 KB may cost the device 8 MB: the kernel's read-ahead (the
device's ``read_ahead_kb``) turns a random ranged read on a cold file into a large
sequential one.  The bytes a benchmark counts at its backend are what it *requested*;
what the device *read* is counted here, so results can report the amplification.

Two counters, both read before and after a run:

- ``/proc/diskstats`` sectors read on the device (whole-system scope: other processes'
  reads count too);
- the reading process's cgroup: v1 ``blkio.throttle.io_service_bytes`` (Read line of the
  device), v2 ``io.stat`` (``rbytes``).  In a cgroup of its own (``iobench.throttle``) this
  is the run's own I/O; in the root cgroup it is the system's again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_SECTOR = 512
_V1_BLKIO = "/sys/fs/cgroup/blkio"
_V2_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class BlockDevice:
    major: int
    minor: int
    name: str              # as in /proc/diskstats (a partition: its own name)
    disk: str              # the whole disk (where read_ahead_kb and throttles apply)
    disk_major: int
    disk_minor: int

    @property
    def devno(self) -> str:
        """'major:minor' of the whole disk, as cgroup throttle files want it."""
        return f"{self.disk_major}:{self.disk_minor}"

    def read_ahead_kb(self) -> int | None:
        return _read_int(f"/sys/block/{self.disk}/queue/read_ahead_kb")

    def describe(self) -> dict:
        return {"name": self.name, "disk": self.disk, "devno": f"{self.major}:{self.minor}",
                "read_ahead_kb": self.read_ahead_kb()}


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def device_of(path: str) -> BlockDevice | None:
    """The block device holding ``path``; None for tmpfs, overlay and other devices without one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    sysdir = f"/sys/dev/block/{major}:{minor}"
    if major == 0 or not os.path.exists(sysdir):
        return None
    real = os.path.realpath(sysdir)
    name = os.path.basename(real)
    if os.path.exists(os.path.join(real, "partition")):
        parent = os.path.dirname(real)
        disk = os.path.basename(parent)
        dmaj, dmin = _devno(os.path.join(parent, "dev")) or (major, minor)
    else:
        disk, dmaj, dmin = name, major, minor
    return BlockDevice(major, minor, name, disk, dmaj, dmin)


def _devno(path: str) -> tuple[int, int] | None:
    try:
        with open(path) as f:
            a, b = f.read().strip().split(":")
        return int(a), int(b)
    except (OSError, ValueError):
        return None


def diskstats_read_bytes(dev: BlockDevice) -> int | None:
    """Bytes read by the device since boot (sectors read × 512)."""
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                if len(p) > 5 and int(p[0]) == dev.major and int(p[1]) == dev.minor:
                    return int(p[5]) * _SECTOR
    except OSError:
        return None
    return None


def own_cgroup(pid: int | str = "self") -> tuple[str, str] | None:
    """('v1', dir) of the process's blkio cgroup, ('v2', dir) of its unified cgroup, or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "blkio" in controllers.split(",") and os.path.isdir(_V1_BLKIO):
            return "v1", os.path.join(_V1_BLKIO, path.lstrip("/"))
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and os.path.exists(os.path.join(_V2_ROOT, "cgroup.controllers")):
            return "v2", os.path.join(_V2_ROOT, path.lstrip("/"))
    return None


def cgroup_read_bytes(dev: BlockDevice, cgroup: tuple[str, str] | None = None) -> int | None:
    """Bytes the cgroup read from the device (v1 blkio.throttle.io_service_bytes, v2 io.stat rbytes)."""
    cg = cgroup or own_cgroup()
    if cg is None:
        return None
    kind, path = cg
    want = {f"{dev.major}:{dev.minor}", dev.devno}
    try:
        if kind == "v1":
            total = None
            with open(os.path.join(path, "blkio.throttle.io_service_bytes")) as f:
                for line in f:
                    p = line.split()
                    if len(p) == 3 and p[0] in want and p[1] == "Read":
                        total = (total or 0) + int(p[2])
            return total if total is not None else 0
        with open(os.path.join(path, "io.stat")) as f:
            for line in f:
                p = line.split()
                if p and p[0] in want:
                    for kv in p[1:]:
                        k, _, v = kv.partition("=")
                        if k == "rbytes":
                            return int(v)
        return 0
    except (OSError, ValueError):
        return None


class DeviceCounter:
    """Device bytes read during a run, by both counters; ``stop()`` returns the results block."""

    def __init__(self, path: str) -> None:
        self.dev = device_of(path)
        self.cgroup = own_cgroup()
        self._before = self._read()

    def _read(self) -> tuple[int | None, int | None]:
        if self.dev is None:
            return None, None
        return diskstats_read_bytes(self.dev), cgroup_read_bytes(self.dev, self.cgroup)

    def _since(self) -> tuple[int | None, int | None]:
        after = self._read()
        return (after[0] - self._before[0] if None not in (after[0], self._before[0]) else None,
                after[1] - self._before[1] if None not in (after[1], self._before[1]) else None)

    def _scoped(self, disk: int | None, cg: int | None) -> tuple[int | None, str]:
        # A cgroup below the root holds only this run's processes (and whatever shares it);
        # the root cgroup and /proc/diskstats count every reader on the machine.
        own = self.cgroup is not None and os.path.normpath(self.cgroup[1]) not in (_V1_BLKIO, _V2_ROOT)
        return (cg, "cgroup") if own and cg is not None else (disk, "system")

    def so_far(self) -> int | None:
        """Device bytes read since the counter started, in the scope ``stop()`` reports (a sample
        of the run's device read rate over time: iobench.loader.sysmon)."""
        return self._scoped(*self._since())[0] if self.dev is not None else None

    def stop(self, requested_bytes: int, delivered_bytes: int | None = None) -> dict | None:
        """``requested_bytes``: what the loader asked storage for; ``delivered_bytes``: payload handed on."""
        if self.dev is None:
            return None
        disk, cg = self._since()
        device_bytes, scope = self._scoped(disk, cg)
        out = {
            "device": self.dev.describe(),
            "device_bytes_read": device_bytes,
            "scope": scope,
            "diskstats_bytes_read": disk,
            "cgroup_bytes_read": cg,
            "cgroup": self.cgroup[1] if self.cgroup else None,
            "requested_bytes": int(requested_bytes),
            "delivered_bytes": int(delivered_bytes) if delivered_bytes is not None else None,
            "read_amplification": (device_bytes / requested_bytes
                                   if device_bytes is not None and requested_bytes > 0 else None),
        }
        if scope == "system":
            out["note"] = ("whole-system counter: other processes' reads of this device count too; "
                           "run in a cgroup of its own (iobench.throttle) for the run's own bytes")
        return out
