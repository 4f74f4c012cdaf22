"""`iobench probe file`: bandwidth, IOPS and latency of a local directory's storage.

Sequential and random reads and writes over request sizes, queue depths, buffered and
O_DIRECT I/O and declared cache states, on one test file the probe lays out itself inside
its work folder.  fio is the engine where installed; otherwise the built-in Python engine,
labelled as such in every point and in ``environment.engine``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..config import check_choice
from ..errors import ConfigError
from ..units import format_bytes, parse_duration, parse_size
from . import fio_engine, py_engine
from ..io import pagecache
from .jobs import PATTERNS, Job, JobResult
from .plots import group, plot
from .safety import ProbeArea

IO_MODES = ("buffered", "direct")
CACHE_STATES = ("cold", "warm")
ENGINES = ("auto", "fio", "python")
TEST_FILE = "file-probe.dat"


@dataclass(frozen=True)
class FileProbeConfig:
    rw: tuple[str, ...] = PATTERNS
    bs: tuple[str, ...] = ("4KiB", "64KiB", "1MiB", "16MiB")
    qd: tuple[int, ...] = (1, 4, 32)
    io: tuple[str, ...] = IO_MODES
    cache: tuple[str, ...] = ("cold",)
    runtime: str = "1s"
    file_size: str = "1GiB"
    engine: str = "auto"
    qd_model: str = "async"
    layout: tuple[str, ...] = ("n-n", "n-1")   # under MPI (world_probe): file per rank, one shared file
    seed: int = 0

    def __post_init__(self) -> None:
        for x in self.layout:
            check_choice("probe.layout", x, ("n-n", "n-1"))
        for r in self.rw:
            check_choice("probe.rw", r, PATTERNS)
        for m in self.io:
            check_choice("probe.io", m, IO_MODES)
        for c in self.cache:
            check_choice("probe.cache", c, CACHE_STATES)
        check_choice("probe.engine", self.engine, ENGINES)
        check_choice("probe.qd_model", self.qd_model, ("async", "threads"))
        for q in self.qd:
            if not 1 <= q <= 1024:
                raise ConfigError("probe.qd", f"queue depth {q} is out of range", "use 1 to 1024, e.g. 1,4,32")
        for b in self.block_sizes:
            if "direct" in self.io and b % 4096:
                raise ConfigError("probe.bs", f"{b} bytes is not a multiple of 4096, which O_DIRECT needs",
                                  "use sizes like 4KiB, 64KiB, 1MiB, or --io buffered")
        if not self.rw or not self.bs or not self.qd or not self.io or not self.cache:
            raise ConfigError("probe", "an empty sweep", "give at least one value for rw, bs, qd, io and cache")
        parse_duration(self.runtime, "probe.runtime", allow_zero=False)
        parse_size(self.file_size, "probe.file_size")

    @property
    def block_sizes(self) -> list[int]:
        return sorted({parse_size(b, "probe.bs") for b in self.bs})

    @property
    def runtime_s(self) -> float:
        return parse_duration(self.runtime, "probe.runtime", allow_zero=False)


def pick_engine(requested: str):
    if requested == "fio" and not fio_engine.available():
        raise ConfigError("--engine", "fio is not installed", "install fio (apt-get install fio) or use --engine python")
    if requested == "python" or (requested == "auto" and not fio_engine.available()):
        return py_engine
    return fio_engine


def _layout(path: str, size: int, seed: int) -> None:
    """Write the test file in full (not sparse) with incompressible bytes, then fsync."""
    rng = np.random.default_rng(seed)
    chunk = rng.bytes(min(size, 4 << 20))
    with open(path, "xb", buffering=0) as f:  # x: never overwrite a file the probe did not create
        done = 0
        while done < size:
            n = min(len(chunk), size - done)
            f.write(chunk[:n] if n < len(chunk) else chunk)
            done += n
        os.fsync(f.fileno())


def run_file_probe(area: ProbeArea, cfg: FileProbeConfig, progress=None) -> dict:
    """The sweep; returns {"metrics": ..., "environment": ..., "warnings": [...]}."""
    if not area.backend.is_local:
        raise ConfigError("url", f"{area.backend.url} is not a local path",
                          "probe object stores with `iobench probe s3`")
    engine = pick_engine(cfg.engine)
    warnings: list[str] = []
    file_size = min(parse_size(cfg.file_size, "probe.file_size"), area.size_cap - area.reserved)
    sizes = [b for b in cfg.block_sizes if b * 2 <= file_size]
    if not sizes:
        raise ConfigError("--size", f"{format_bytes(file_size)} is too small for request size "
                          f"{format_bytes(cfg.block_sizes[0])}", "raise --size or lower --bs")
    for b in cfg.block_sizes:
        if b not in sizes:
            warnings.append(f"request size {format_bytes(b)} skipped: the test file "
                            f"({format_bytes(file_size)}) must hold at least two requests")
    file_size -= file_size % max(sizes)
    area.reserve(file_size, "the file probe's test file")
    path = area.track(TEST_FILE)
    _layout(path, file_size, cfg.seed)

    odirect, reason = pagecache.odirect_supported(area.work.root)
    modes = list(cfg.io)
    if "direct" in modes and not odirect:
        modes.remove("direct")
        warnings.append(f"O_DIRECT is not supported here ({reason}); direct points skipped")

    plan = []
    for mode in modes:
        for rw in cfg.rw:
            caches = cfg.cache if (mode == "buffered" and "write" not in rw) else ("n/a",)
            for cache in caches:
                for bs in sizes:
                    for qd in cfg.qd:
                        plan.append((mode, rw, cache, bs, qd))

    points = []
    task = progress.add_task("file probe", total=len(plan)) if progress is not None else None

    def job_of(mode, rw, bs, qd):
        return Job(path=path, file_size=file_size, rw=rw, bs=bs, qd=qd, direct=mode == "direct",
                   runtime_s=cfg.runtime_s, seed=cfg.seed, qd_model=cfg.qd_model)

    i = 0
    while i < len(plan):
        mode, rw, cache, bs, qd = plan[i]
        if cache in CACHE_STATES or engine is not fio_engine:
            batch = [plan[i]]
            residency = pagecache.set_file_state(path, cache) if cache in CACHE_STATES else None
            results = [engine.run(job_of(mode, rw, bs, qd))]
        else:
            # points that need no cache preparation share one fio process
            j = i
            while j < len(plan) and plan[j][2] not in CACHE_STATES:
                j += 1
            batch = plan[i:j]
            residency = None
            results = fio_engine.run_many([job_of(m, r, b, q) for m, r, _, b, q in batch])
        for (mode, rw, cache, bs, qd), res in zip(batch, results):
            point = point_dict(job_of(mode, rw, bs, qd), res, mode, cache, residency)
            if cache == "cold" and res.bytes > file_size:
                point["cold_passes"] = res.bytes / file_size
            points.append(point)
            if task is not None:
                progress.advance(task)
        i += len(batch)
    wrapped = [p for p in points if p.get("cold_passes", 0) > 1]
    if wrapped:
        warnings.append(f"{len(wrapped)} cold buffered point(s) read the {format_bytes(file_size)} test file more "
                        "than once, so later passes hit the page cache; raise --file-size or lower --runtime")
    area.forget(TEST_FILE)
    os.unlink(path)
    area.release(file_size)
    environment = {
        "engine": engine.ENGINE,
        "engine_detail": points[0]["engine_detail"] if points else None,
        "fio": fio_engine.find()[1] if fio_engine.available() else None,
        "odirect": {"supported": odirect, "reason": reason or None},
        "test_file_bytes": file_size,
        "cache": {"declared": list(cfg.cache), "measured": "residency_before per point (mincore)"},
    }
    if engine is py_engine:
        warnings.append("fio not used: numbers come from the built-in Python engine "
                        "(see benchmarks/bench_probe_engines.py for how close it comes)")
    return {"metrics": {"points": points, "summary": summarize(points), "plots": plots(points)},
            "environment": environment, "warnings": warnings}


def point_dict(job: Job, res: JobResult, mode: str, cache: str, residency: float | None) -> dict:
    d = {"rw": job.rw, "bs": job.bs, "qd": job.qd, "io": mode, "cache": cache, "residency_before": residency,
         "engine": res.engine, "engine_detail": res.engine_detail,
         "qd_model": "threads" if res.engine == py_engine.ENGINE else job.qd_model,
         "bytes": res.bytes, "seconds": res.seconds, "bytes_per_s": res.bytes_per_s, "iops": res.iops,
         "latency_s": res.latency_summary, "latency_cdf": res.latency_cdf}
    if res.job_file:
        d["job_file"] = res.job_file
    return d


def _storage_points(points: list[dict], rw: str) -> list[dict]:
    """Points that measure the device, not memory: direct where there are any, else cold buffered."""
    mine = [p for p in points if p["rw"] == rw]
    direct = [p for p in mine if p["io"] == "direct"]
    if direct:
        return direct
    return [p for p in mine if p["cache"] in ("cold", "n/a")]


def _nearest_qd(points: list[dict], qd: int) -> dict | None:
    if not points:
        return None
    return min(points, key=lambda p: (abs(p["qd"] - qd), -p["iops"]))


def summarize(points: list[dict]) -> dict:
    """The file columns of the per-tier table (see README: Storage probe)."""
    out: dict = {}
    for rw, key in (("read", "seq_read_bytes_per_s"), ("write", "seq_write_bytes_per_s")):
        ps = _storage_points(points, rw)
        out[key] = max((p["bytes_per_s"] for p in ps), default=None)
    small = [p for p in _storage_points(points, "randread") if p["bs"] == min(
        (q["bs"] for q in points), default=0)]
    for qd in (1, 32):
        p = _nearest_qd(small, qd)
        out[f"rand_read_iops_qd{qd}"] = p["iops"] if p else None
        out[f"rand_read_iops_qd{qd}_actual_qd"] = p["qd"] if p else None
    out["rand_read_bs"] = small[0]["bs"] if small else None
    p1 = _nearest_qd(small, 1)
    out["p99_read_latency_s"] = p1["latency_s"]["p99"] if p1 else None
    rnd = out.get("rand_read_iops_qd32")
    seq = out.get("seq_read_bytes_per_s")
    if rnd and seq and out["rand_read_bs"]:
        out["seq_over_random_read_ratio"] = seq / (rnd * out["rand_read_bs"])
    return out


def plots(points: list[dict]) -> dict:
    def series_bw(p):
        return f"{p['rw']} {p['io']} {p['cache']} qd{p['qd']}"

    def series_qd(p):
        return f"{p['rw']} {p['io']} {p['cache']} bs{p['bs']}"

    cdf = {}
    for p in points:
        if "read" in p["rw"] and p["latency_cdf"]:
            cdf[f"{p['rw']} {p['io']} {p['cache']} bs{p['bs']} qd{p['qd']}"] = [list(x) for x in p["latency_cdf"]]
    return {
        "bandwidth_vs_request_size": plot("Bandwidth vs request size", "request size (bytes)", "bytes_per_s",
                                          group(points, series_bw, "bs", "bytes_per_s")),
        "iops_vs_queue_depth": plot("IOPS vs queue depth", "queue depth", "IOPS",
                                    group(points, series_qd, "qd", "iops")),
        "latency_cdf": plot("Read latency CDF", "latency (s)", "fraction of requests", cdf, y_log=False),
    }
