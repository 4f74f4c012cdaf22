"""`iobench probe metadata`: the mdtest pattern, on a local directory or an S3 prefix.

Local: W worker threads each create, stat, open+read and unlink their own small files,
spread over D directories per worker; each phase starts on a barrier and its rate is the
phase's operations over its wall time (first start to last finish).  S3: the same with
PUT, HEAD, GET, LIST (one request per page of up to 1000 keys) and DELETE of small
objects, with exactly W requests in flight.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..metrics import LatencyHistogram
from ..units import parse_size
from .safety import ProbeArea
from .threads import Released

LOCAL_PHASES = ("create", "stat", "open_read", "unlink")
S3_PHASES = ("put", "head", "get", "list", "delete")


@dataclass(frozen=True)
class MetadataConfig:
    files: int = 10000        # in all, across workers
    workers: int = 4
    dirs: int = 10            # directories (or key prefixes) per worker
    file_size: str = "4KiB"   # bytes written into each file / object

    def __post_init__(self) -> None:
        if not 1 <= self.files <= 10**8:   # each file's name is held in memory before the first is made
            raise ConfigError("probe.files", f"{self.files} is out of range", "use 1 to 100000000, e.g. --files 10000")
        if not 1 <= self.workers <= 1024:
            raise ConfigError("probe.workers", f"{self.workers} is out of range", "use 1 to 1024")
        if not 1 <= self.dirs <= max(1, self.files // self.workers):   # a directory holds at least one file
            raise ConfigError("probe.dirs", f"{self.dirs} directories per worker for {self.files // self.workers} "
                              "files each", "give 1 to the files per worker, e.g. --dirs 10")
        if self.file_bytes < 0:
            raise ConfigError("probe.file_size", "must not be negative", "e.g. 4KiB")

    @property
    def file_bytes(self) -> int:
        return 0 if str(self.file_size).strip() in ("0", "0B") else parse_size(self.file_size, "probe.file_size")


def _names(cfg: MetadataConfig) -> list[list[str]]:
    """Each worker's file names, relative to the work folder (round-robin over its directories)."""
    out = []
    for w in range(cfg.workers):
        n = cfg.files // cfg.workers + (1 if w < cfg.files % cfg.workers else 0)
        out.append([f"md/w{w:03d}/d{i % cfg.dirs:04d}/f{i:07d}" for i in range(n)])
    return out


def _phase_result(hists: list[LatencyHistogram], starts: list[int], ends: list[int]) -> dict:
    h = LatencyHistogram()
    for x in hists:
        h.merge(x)
    seconds = (max(ends) - min(starts)) / 1e9 if starts else 0.0
    return {"ops": h.count, "seconds": seconds, "ops_per_s": h.count / seconds if seconds > 0 else None,
            "latency_s": h.summary()}


def _footprint(cfg: MetadataConfig) -> int:
    # a small file still takes at least one filesystem block
    return cfg.files * max(4096, cfg.file_bytes)


def run_local(area: ProbeArea, cfg: MetadataConfig) -> dict:
    area.reserve(_footprint(cfg), "the metadata probe's files")   # before the names: refused at once
    names = _names(cfg)
    for w in range(cfg.workers):
        for d in range(min(cfg.dirs, len(names[w]))):
            area.makedirs(f"md/w{w:03d}/d{d:04d}")
    for ns in names:
        area.track_many(ns)
    root = area.work.root
    payload = np.random.default_rng(0).bytes(cfg.file_bytes)
    size = cfg.file_bytes
    now_ns = time.perf_counter_ns

    def create(p):
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            if size:
                os.write(fd, payload)
        finally:
            os.close(fd)

    def open_read(p):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.read(fd, size or 1)
        finally:
            os.close(fd)

    ops = {"create": create, "stat": os.stat, "open_read": open_read, "unlink": os.unlink}
    phases = {}
    for phase in LOCAL_PHASES:
        fn = ops[phase]
        hists = [LatencyHistogram() for _ in range(cfg.workers)]
        pool = Released(cfg.workers)

        def work(w: int) -> None:
            paths = [f"{root}/{n}" for n in names[w]]
            lat: list[int] = []
            record = lat.append
            try:
                pool.go(w)
                for p in paths:
                    t0 = now_ns()
                    fn(p)
                    record(now_ns() - t0)
            finally:
                for v in lat:
                    hists[w].record_ns(v)

        pool.run(work)
        phases[phase] = _phase_result(hists, pool.starts, pool.ends)
    for ns in names:
        for n in ns:
            area.forget(n)
    area.release(_footprint(cfg))
    return {"phases": phases, "ops_per_s": _headline(phases, ("create", "stat", "open_read", "unlink")),
            "engine": "python threads (os.open/os.stat/os.unlink)"}


def run_s3(area: ProbeArea, cfg: MetadataConfig) -> dict:
    from .s3ops import OpStats, S3Ops, pool

    ops = S3Ops(area.work)
    names = [n for ns in _names(cfg) for n in ns]
    prefixes = sorted({n.rsplit("/", 1)[0] for n in names})
    area.reserve(cfg.files * cfg.file_bytes, "the metadata probe's objects")
    area.track_many(names)
    payload = np.random.default_rng(0).bytes(cfg.file_bytes)
    stats = {p: OpStats() for p in S3_PHASES}

    async def go():
        s3 = await ops.client()
        await pool(names, cfg.workers, lambda n: ops.put(s3, n, payload, stats["put"]), stats["put"])
        await pool(names, cfg.workers, lambda n: ops.head(s3, n, stats["head"]), stats["head"])
        await pool(names, cfg.workers, lambda n: ops.get(s3, n, stats["get"]), stats["get"])
        await pool(prefixes, cfg.workers, lambda p: ops.list_prefix(s3, p, stats["list"]), stats["list"])
        await pool(names, cfg.workers, lambda n: ops.delete(s3, n, stats["delete"]), stats["delete"])

    ops.run(go)
    for n in names:
        area.forget(n)
    area.release(cfg.files * cfg.file_bytes)
    phases = {p: s.to_dict() for p, s in stats.items()}
    return {"phases": phases, "ops_per_s": _headline(phases, ("put", "head", "get", "delete")),
            "retries": sum(s.retries for s in stats.values()),
            "throttled": sum(s.throttled for s in stats.values()),
            "throttle_answers": ops.throttle_answers,
            "engine": "aiobotocore (one request per operation)"}


def _headline(phases: dict, names: tuple[str, ...]) -> float | None:
    """Total operations over total time of the per-file phases: the one 'metadata ops/s' figure."""
    ops = sum(phases[n]["ops"] for n in names)
    secs = sum(phases[n]["seconds"] for n in names)
    return ops / secs if secs > 0 else None


def run_metadata_probe(area: ProbeArea, cfg: MetadataConfig) -> dict:
    out = run_s3(area, cfg) if area.backend.speaks_s3 else run_local(area, cfg)
    return {"metrics": out, "environment": {"engine": out["engine"], "workers": cfg.workers}, "warnings": []}
