"""gdsio-style benchmark: read path × IO size × threads × cache state, verified by checksum.

Each cell opens a reader with ``threads`` workers and ``task_size = io_size`` and reads
the file(s) front to back in calls of ``threads × io_size`` bytes, so ``threads`` IOs of
``io_size`` are in flight at once.  Reported per cell: bytes/s over the steady calls
(the first call, which pays for lazy setup such as cuFile buffer registration, is apart,
as is opening the reader), p50/p99 latency of single ``io_size`` reads at queue depth 1,
CPU-seconds per GB (process CPU time during the steady calls), the cache state declared
and measured, and whether the delivered bytes hash to the file's own (xxh64).

A requested path this node lacks falls back (or, with ``strict``, is an error); rows are
per *effective* path and list the requested paths they stand for.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from iobench.config import check_choice
from iobench.errors import ConfigError, IntegrityError
from iobench.io.checksum import new_hasher
from iobench.io.pagecache import prepare_file
from iobench.metrics import LatencyHistogram
from iobench.units import parse_size

from .base import DEVICE_PATHS, PATH_NAMES, aligned_host

GB = 1e9
CACHE_STATES = ("cold", "warm")


@dataclass(frozen=True)
class GdsBenchConfig:
    target: str
    paths: tuple[str, ...] = PATH_NAMES
    io_sizes: tuple[str, ...] = ("64KiB", "1MiB", "16MiB")
    threads: tuple[int, ...] = (1, 4)
    cache: tuple[str, ...] = CACHE_STATES
    odirect: bool = False
    strict: bool = False
    max_bytes: str | None = None         # per cell, per file; default the whole file
    max_seconds: float | None = None     # per cell steady loop
    qd1_samples: int = 200
    qd1_max_seconds: float = 2.0
    verify: bool = True
    probe_timeout_s: float = 20.0
    create: str | None = None            # create the target file with this many random bytes if missing
    seed: int = 0

    def __post_init__(self) -> None:
        from . import check_path_name

        if not self.target:
            raise ConfigError("gds.target", "is empty", "give a file or a local dataset directory")
        if not self.paths:
            raise ConfigError("gds.paths", "is empty", f"give some of {', '.join(PATH_NAMES)}")
        for p in self.paths:
            check_path_name(p, "gds.paths")
        for s in self.io_sizes:
            parse_size(s, "gds.io_sizes")
        if not self.io_sizes:
            raise ConfigError("gds.io_sizes", "is empty", "give e.g. 64KiB,1MiB")
        if not self.threads or any(t < 1 or t > 1024 for t in self.threads):
            raise ConfigError("gds.threads", f"{self.threads!r} must be between 1 and 1024", "give e.g. 1,4,16")
        if not self.cache:
            raise ConfigError("gds.cache", "is empty", "give cold, warm or both")
        for c in self.cache:
            check_choice("gds.cache", c, CACHE_STATES)
        if self.max_bytes is not None:
            parse_size(self.max_bytes, "gds.max_bytes")
        if self.create is not None:
            parse_size(self.create, "gds.create")
        if self.qd1_samples < 0:
            raise ConfigError("gds.qd1_samples", "must be zero or more", "give e.g. 200")
        if self.probe_timeout_s <= 0:
            raise ConfigError("gds.probe_timeout_s", "must be positive", "give e.g. 20")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ConfigError("gds.max_seconds", "must be positive", "give e.g. 10")

    @property
    def io_size_bytes(self) -> tuple[int, ...]:
        return tuple(parse_size(s, "gds.io_sizes") for s in self.io_sizes)


def create_file(path: str, size: int, seed: int = 0, block: int = 16 << 20) -> None:
    """Random bytes (seeded), written to a temp name, fsynced and renamed into place."""
    from iobench.io.atomic import atomic_open

    rng = np.random.default_rng(seed)
    with atomic_open(path, "wb", fsync=True) as f:
        left = size
        while left:
            n = min(block, left)
            f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            left -= n


def resolve_files(target: str) -> list[str]:
    """A file, or a local dataset directory (its manifest's shards)."""
    if "://" in target and not target.startswith("file://"):
        raise ConfigError("target", f"{target} is not local: GPU-direct reads need a local or RDMA-attached file "
                                    "system (GDS cannot remove an object store's latency)",
                          "stage the dataset to local NVMe first (`iobench stage`) and bench that copy")
    local = target[len("file://"):] if target.startswith("file://") else target
    if os.path.isdir(local):
        from iobench.manifest import read_manifest
        from iobench.storage import open_backend

        backend = open_backend(local, field_name="target")
        m = read_manifest(backend)
        return [backend.local_path(s.path) for s in m.shards]
    if not os.path.exists(local):
        raise ConfigError("target", f"{local} does not exist", "give an existing file, or add --create SIZE")
    from iobench.io.inputs import require_regular

    require_regular(local, "target", "give a regular file or a dataset directory")   # a FIFO would block the reads
    if os.path.getsize(local) == 0:   # every cell would read nothing and report 0 GiB/s, "ok"
        raise ConfigError("target", f"{local} is empty: there is nothing to read", "give a file with data, or "
                          "--create SIZE on a new path")
    return [local]


class _Dst:
    """The destination buffer of one cell: host (aligned) or device memory."""

    def __init__(self, path_name: str, nbytes: int, lib: Any = None) -> None:
        self.device = path_name in DEVICE_PATHS
        if self.device:
            from .bounce import device_lib

            self.lib = lib or device_lib()
            self.buf = self.lib.alloc(nbytes)
        else:
            self.lib = None
            self.buf = aligned_host(nbytes)

    def host_bytes(self, n: int) -> memoryview:
        if self.device:
            return memoryview(np.ascontiguousarray(self.lib.to_host(self.buf, n)))
        return memoryview(self.buf[:n])


def _file_hash(path: str, limit: int) -> str:
    h = new_hasher("xxh64")
    with open(path, "rb", buffering=0) as f:
        left = limit
        buf = bytearray(8 << 20)
        while left:
            n = f.readinto(memoryview(buf)[:min(len(buf), left)])
            if not n:
                break
            h.update(memoryview(buf)[:n])
            left -= n
    return h.hexdigest()


def _cpu_ns() -> int:
    return time.process_time_ns()


def run_cell(path_name: str, files: list[str], io_size: int, threads: int, cache_state: str,
             cfg: GdsBenchConfig, ref_hashes: dict, make: Callable[..., Any]) -> dict:
    limit = parse_size(cfg.max_bytes, "gds.max_bytes") if cfg.max_bytes else None
    step = io_size * threads
    cache_info = [prepare_file(f, cache_state) for f in files]
    t0 = time.perf_counter_ns()
    dst = _Dst(path_name, step)
    setup_ns = time.perf_counter_ns() - t0
    steady_ns = steady_cpu_ns = steady_bytes = 0
    first_io_ns = None
    total = 0
    calls = 0
    verified = True if cfg.verify else None
    evidence: dict = {}
    effective = path_name
    describe: dict = {}
    deadline = (time.perf_counter_ns() + int(cfg.max_seconds * 1e9)) if cfg.max_seconds else None
    for f in files:
        t_open = time.perf_counter_ns()
        reader = make(path_name, f, threads=threads, task_size=io_size, odirect=cfg.odirect)
        setup_ns += time.perf_counter_ns() - t_open
        h = new_hasher("xxh64")
        size = os.path.getsize(f)
        end = min(size, limit) if limit else size
        off = 0
        try:
            while off < end:
                n = min(step, end - off)
                c0 = _cpu_ns()
                t = time.perf_counter_ns()
                got = reader.read_into(dst.buf, off, n)
                dt = time.perf_counter_ns() - t
                dc = _cpu_ns() - c0
                if first_io_ns is None:
                    first_io_ns = dt
                else:
                    steady_ns += dt
                    steady_cpu_ns += dc
                    steady_bytes += got
                calls += 1
                if cfg.verify and got:
                    h.update(dst.host_bytes(got))
                off += got
                total += got
                if got < n:
                    raise IntegrityError(f"{f} ended at {off} bytes, before its expected {end} "
                                         "(the file changed during the run)")
                if deadline and time.perf_counter_ns() > deadline:
                    break
            evidence[os.path.basename(f)] = reader.evidence()
            effective = reader.effective_path()
            describe = reader.describe()
        finally:
            reader.close()
        if cfg.verify:
            key = (f, off)
            if key not in ref_hashes:
                ref_hashes[key] = _file_hash(f, off)
            verified = verified and h.hexdigest() == ref_hashes[key]
        if deadline and time.perf_counter_ns() > deadline:
            break
    if steady_ns == 0 and first_io_ns is not None:  # one call only: no steady state to speak of
        steady_ns, steady_bytes = first_io_ns, total
    describe.pop("evidence", None)
    cell = {
        "path": path_name, "path_effective": effective, "io_size_bytes": io_size, "threads": threads,
        "cache": {"declared": cache_state, "resident_ratio": _mean(c.get("resident_ratio") for c in cache_info),
                  "verified": all(c.get("verified") for c in cache_info),
                  **({"note": cache_info[0]["note"]} if cache_info and "note" in cache_info[0] else {})},
        "bytes": total, "calls": calls,
        "setup_s": setup_ns / 1e9,
        "first_io_s": (first_io_ns or 0) / 1e9,
        "steady_s": steady_ns / 1e9,
        "throughput": {"bytes_per_s": steady_bytes / (steady_ns / 1e9) if steady_ns else 0.0,
                       "gib_per_s": steady_bytes / (steady_ns / 1e9) / 2**30 if steady_ns else 0.0},
        "cpu_s_per_gb": (steady_cpu_ns / 1e9) / (steady_bytes / GB) if steady_bytes else None,
        "verified": verified,
        "reader": describe,
        "evidence": evidence,
    }
    if cfg.qd1_samples:
        cell["latency_qd1_s"] = qd1_latency(path_name, files[0], io_size, cache_state, cfg, make, dst)
    return cell


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def qd1_latency(path_name: str, f: str, io_size: int, cache_state: str, cfg: GdsBenchConfig,
                make: Callable[..., Any], dst: _Dst) -> dict:
    """Single reads of ``io_size`` at random aligned offsets, one at a time (queue depth 1)."""
    size = os.path.getsize(f)
    prepare_file(f, cache_state)
    rng = np.random.default_rng(cfg.seed)
    slots = max(1, size // io_size)
    hist = LatencyHistogram()
    reader = make(path_name, f, threads=1, task_size=io_size, odirect=cfg.odirect)
    deadline = time.perf_counter_ns() + int(cfg.qd1_max_seconds * 1e9)
    try:
        for _ in range(cfg.qd1_samples):
            off = int(rng.integers(0, slots)) * io_size
            n = min(io_size, size - off)
            with hist.time():
                reader.read_into(dst.buf, off, n)
            if time.perf_counter_ns() > deadline:
                break
    finally:
        reader.close()
    return hist.summary()


def run_bench(cfg: GdsBenchConfig, results: Any = None, progress: Callable[[str], None] | None = None,
              probe: Any = None) -> dict:
    """Run every cell; returns ``{"metrics": ..., "environment": ...}`` and fills ``results`` if given."""
    from . import make_reader, open_reader
    from . import detect

    target = cfg.target
    if cfg.create and not os.path.exists(target):
        create_file(target, parse_size(cfg.create, "gds.create"), cfg.seed)
    files = resolve_files(target)
    pr = probe or detect.probe(files[0], timeout_s=cfg.probe_timeout_s)
    # Which path really runs for each requested one (fallbacks recorded, or an error with --strict).
    effective: dict[str, dict] = {}
    for name in cfg.paths:
        reader, eff, reason = open_reader(name, files[0], strict=cfg.strict, probe=pr, field="--paths")
        reader.close()
        effective[name] = {"effective": eff, "fallback_reason": reason}
        if reason and results is not None:
            results.warn(f"requested path {name!r} ran as {eff!r}: {reason}")
    order = []
    for name in cfg.paths:
        eff = effective[name]["effective"]
        if eff not in order:
            order.append(eff)
    cells = []
    ref_hashes: dict = {}
    total = len(order) * len(cfg.io_sizes) * len(cfg.threads) * len(cfg.cache)
    for state in cfg.cache:
        for eff in order:
            for io_size in cfg.io_size_bytes:
                for threads in cfg.threads:
                    if progress:
                        progress(f"[{len(cells) + 1}/{total}] {eff} io={io_size} threads={threads} cache={state}")
                    cell = run_cell(eff, files, io_size, threads, state, cfg, ref_hashes, make_reader)
                    cell["requested"] = [n for n in cfg.paths if effective[n]["effective"] == eff]
                    cells.append(cell)
                    if results is not None and not cell["cache"]["verified"]:
                        results.warn(f"{eff} {state}: cache state not achieved ({cell['cache'].get('note', '')})")
    metrics = {"cells": cells, "files": len(files), "file_bytes": sum(os.path.getsize(f) for f in files),
               "all_verified": all(c["verified"] is not False for c in cells)}
    best = max(cells, key=lambda c: c["throughput"]["bytes_per_s"], default=None)
    if best is not None:
        metrics["best"] = {k: best[k] for k in ("path_effective", "io_size_bytes", "threads")} | {
            "bytes_per_s": best["throughput"]["bytes_per_s"], "cache": best["cache"]["declared"]}
    environment = {"gds": pr.to_dict(), "effective_gds_path": effective,
                   "cache": {"declared": list(cfg.cache), "verified": all(c["cache"]["verified"] for c in cells)}}
    if results is not None:
        results.metrics.update(metrics)
        results.environment.update(environment)
    return {"metrics": metrics, "environment": environment}


def table_rows(cells: list[dict]) -> list[tuple[str, ...]]:
    """Human-readable rows: path, io size, threads, cache, GiB/s, p50, p99, CPU-s/GB, setup, verified."""
    from iobench.units import format_bytes, format_seconds

    rows = []
    for c in cells:
        lat = c.get("latency_qd1_s") or {}
        eff = c["path_effective"]
        label = eff + ("*" if any(r != eff for r in c["requested"]) else "")
        rows.append((label, format_bytes(c["io_size_bytes"]), str(c["threads"]),
                     c["cache"]["declared"] + ("" if c["cache"]["verified"] else "?"),
                     f"{c['throughput']['gib_per_s']:.2f}",
                     format_seconds(lat["p50"]) if lat.get("p50") is not None else "-",
                     format_seconds(lat["p99"]) if lat.get("p99") is not None else "-",
                     f"{c['cpu_s_per_gb']:.3f}" if c["cpu_s_per_gb"] is not None else "-",
                     format_seconds(c["setup_s"]),
                     {True: "ok", False: "MISMATCH", None: "-"}[c["verified"]]))
    return rows


TABLE_COLUMNS = ("path", "io size", "threads", "cache", "GiB/s", "p50 QD1", "p99 QD1", "CPU-s/GB", "setup",
                 "checksum")
