"""Real slow storage: a cgroup that caps the read bandwidth of one block device, for ground truth.

``ReadThrottle(device, bytes_per_s)`` creates a cgroup of its own (v1
``/sys/fs/cgroup/blkio/iobench-TAG-PID`` with ``blkio.throttle.read_bps_device``, or v2
``io.max`` ``rbps=``), moves the *calling process* into it and, on exit, moves it back
to where it was and removes the cgroup.  Processes forked while inside (the loader's
workers, a peer loader's workers) inherit the cgroup, so the whole loader reads through
the kernel's throttle; nothing is emulated.  Needs root and a cgroup hierarchy with the
blkio/io controller; ``available()`` says why not where it is missing.

The kernel throttles at the block layer: page-cache hits are free (make the files cold
first, ``iobench.io.pagecache``) and read-ahead is throttled with the read that caused it, so a
small random read can cost ``read_ahead_kb`` of the budget (``iobench.blockdev`` counts it).
"""

from __future__ import annotations

import os
import time

from .blockdev import _V1_BLKIO, _V2_ROOT, BlockDevice, own_cgroup
from .errors import IobenchError


class ThrottleUnavailable(IobenchError, RuntimeError):
    """No cgroup read throttle here (not root, no blkio/io controller)."""


def available() -> tuple[bool, str]:
    """(True, 'v1'|'v2') or (False, the reason)."""
    if os.geteuid() != 0:
        return False, "not root: cgroup read throttles need root"
    if os.path.exists(os.path.join(_V1_BLKIO, "blkio.throttle.read_bps_device")):
        return True, "v1"
    ctl = os.path.join(_V2_ROOT, "cgroup.controllers")
    if os.path.exists(ctl):
        with open(ctl) as f:
            if "io" in f.read().split():
                return True, "v2"
        return False, "cgroup v2 without the io controller"
    return False, "no cgroup v1 blkio hierarchy at /sys/fs/cgroup/blkio and no cgroup v2 io controller"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class ReadThrottle:
    """Context manager: the calling process (and children forked inside) read ``device`` at ≤ ``bytes_per_s``."""

    def __init__(self, device: BlockDevice, bytes_per_s: int, tag: str = "run") -> None:
        ok, why = available()
        if not ok:
            raise ThrottleUnavailable(f"cannot throttle reads of {device.disk}: {why}")
        if bytes_per_s < 1:
            raise ValueError("bytes_per_s must be positive")
        self.kind = why
        self.device = device
        self.bytes_per_s = int(bytes_per_s)
        root = _V1_BLKIO if self.kind == "v1" else _V2_ROOT
        self.path = os.path.join(root, f"iobench-{tag}-{os.getpid()}")
        self._home: str | None = None

    def __enter__(self) -> "ReadThrottle":
        if self.kind == "v2":
            # A v2 child gets the io controller only if its parent delegates it.
            try:
                _write(os.path.join(_V2_ROOT, "cgroup.subtree_control"), "+io")
            except OSError:
                pass
        os.makedirs(self.path, exist_ok=True)
        try:
            if self.kind == "v1":
                _write(os.path.join(self.path, "blkio.throttle.read_bps_device"),
                       f"{self.device.devno} {self.bytes_per_s}")
            else:
                _write(os.path.join(self.path, "io.max"), f"{self.device.devno} rbps={self.bytes_per_s}")
            cg = own_cgroup()
            self._home = cg[1] if cg else (_V1_BLKIO if self.kind == "v1" else _V2_ROOT)
            _write(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))
        except OSError:
            self._remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._remove()

    def add(self, pid: int) -> None:
        """Put another (already running) process under the throttle too."""
        _write(os.path.join(self.path, "cgroup.procs"), str(pid))

    def _remove(self) -> None:
        if self._home is not None:
            try:
                _write(os.path.join(self._home, "cgroup.procs"), str(os.getpid()))
            except OSError:
                pass
        # Exited children leave the cgroup at once; give stragglers a moment before rmdir.
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                self._evict_stragglers()
                time.sleep(0.1)

    def _evict_stragglers(self) -> None:
        """Processes still inside (a child that outlived the run) go back to the parent cgroup."""
        home = self._home or os.path.dirname(self.path)
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                pids = f.read().split()
        except OSError:
            return
        for pid in pids:
            try:
                _write(os.path.join(home, "cgroup.procs"), pid)
            except OSError:
                pass

    def describe(self) -> dict:
        return {"cgroup": self.kind, "path": self.path, "device": self.device.describe(),
                "read_bytes_per_s": self.bytes_per_s}
