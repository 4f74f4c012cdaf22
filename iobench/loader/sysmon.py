"""psutil samples during a load: CPU %, RSS/USS of every loader process, disk and network I/O, and the
bytes the dataset's device read for the run (iobench.blockdev), each stamped in seconds on the step
series' clock (``series.t_s``), so a window of steps can be matched with what the device did in it."""

from __future__ import annotations

import threading
import time
from operator import attrgetter

import psutil

from ..blockdev import DeviceCounter


class SystemMonitor:
    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.series: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: dict[int, psutil.Process] = {}
        self._device: DeviceCounter | None = None

    def start(self, pids: list[int], device: DeviceCounter | None = None) -> "SystemMonitor":
        self._device = device
        for pid in pids:
            try:
                p = psutil.Process(pid)
                p.cpu_percent(None)
                self._procs[pid] = p
            except psutil.Error:
                pass
        psutil.cpu_percent(None)
        self._t0 = time.perf_counter_ns()
        self._disk0, self._net0 = _disk(), _net()
        self._thread = threading.Thread(target=self._run, name="iobench-sysmon", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        rss = uss = pss = alive = 0
        cpu = 0.0
        for p in list(self._procs.values()):
            try:
                with p.oneshot():
                    mi = p.memory_full_info()
                    rss += mi.rss
                    uss += getattr(mi, "uss", mi.rss)
                    pss += getattr(mi, "pss", mi.rss)
                    cpu += p.cpu_percent(None)
                    alive += p.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                continue
        disk, net = _disk(), _net()
        device = {} if self._device is None else {"device_read_bytes": self._device.so_far()}
        self.series.append({
            "t_s": (time.perf_counter_ns() - self._t0) / 1e9,
            "cpu_percent_system": psutil.cpu_percent(None),
            "cpu_percent_loader": cpu,
            "rss_bytes": rss, "uss_bytes": uss, "pss_bytes": pss,
            "processes_alive": alive,
            "disk_read_bytes": disk[0] - self._disk0[0],
            "disk_write_bytes": disk[1] - self._disk0[1],
            "net_recv_bytes": net[0] - self._net0[0],
            "net_sent_bytes": net[1] - self._net0[1],
        } | device)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stop.is_set()

    def stop(self, origin_ns: int | None = None) -> dict:
        """``origin_ns``: the step clock's start (``perf_counter_ns``); samples taken before it, during
        start-up, get negative ``t_s``."""
        if self._thread is not None and not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self._sample()
        s = self.series
        if origin_ns is not None:
            for x in s:
                x["t_s"] += (self._t0 - origin_ns) / 1e9
        # Once a worker exits, the pages it shared with the parent count as the parent's own:
        # USS peaks are taken while every process is alive.
        full = [x for x in s if x["processes_alive"] == len(self._procs)] or s
        return {
            "interval_s": self.interval_s,
            "processes": len(self._procs),
            "peak_uss_bytes": max((x["uss_bytes"] for x in full), default=None),
            "peak_pss_bytes": max((x["pss_bytes"] for x in s), default=None),
            "peak_rss_bytes": max((x["rss_bytes"] for x in s), default=None),
            "mean_cpu_percent_loader": sum(x["cpu_percent_loader"] for x in s) / len(s) if s else None,
            "series": s,
        }


def _counters(read, pair) -> tuple[int, int]:
    try:
        c = read()
        return pair(c) if c else (0, 0)
    except Exception:  # noqa: BLE001 — containers without /proc/diskstats
        return (0, 0)


def _disk() -> tuple[int, int]:
    return _counters(psutil.disk_io_counters, attrgetter("read_bytes", "write_bytes"))


def _net() -> tuple[int, int]:
    return _counters(psutil.net_io_counters, attrgetter("bytes_recv", "bytes_sent"))


def run_delay_s(pid: int) -> float | None:
    """Seconds process ``pid`` has spent runnable but waiting for a CPU (``/proc/PID/schedstat``,
    its second field; Linux with schedstats): a worker's share of that is the host's CPU contention,
    not storage.  None where the file is missing."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
