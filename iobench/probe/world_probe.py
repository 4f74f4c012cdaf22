"""Aggregate probes across MPI ranks, the way IOR and mdtest measure a shared file system.

Started under ``mpirun -n N``, ``iobench probe file|metadata|s3`` runs these instead of
the single-process sweeps:

- ``file``: every rank writes, then reads back, its share — ``n-n`` one file per rank, and
  ``n-1`` one shared file in which rank r owns the strided blocks r, r+N, r+2N, … (IOR's
  segmented layout).  Reads go to a neighbour's data (rank r reads rank r+1's file or
  blocks, as IOR's ``-C``) after dropping the page cache, so no rank reads what it just
  wrote from its own cache.  Writes end with fsync (IOR ``-e``).
- ``metadata``: create, stat and delete of small files at N ranks, in a directory per rank
  (``unique``) and in one directory shared by all (``shared``), like mdtest's ``-u`` and
  default modes; stat goes to a neighbour's files.
- ``s3``: PUT then GET of equal-size objects from every rank at a fixed concurrency.

Each phase is fenced by barriers: it starts together and is over when the slowest rank is
done, so the aggregate rate is the total over the slowest rank's time (IOR's "max" time).
Per-rank rates, a straggler line and merged latency histograms come with it.  The work
folder is claimed by rank 0 (ProbeArea's rules: empty target or --force, own subfolder);
every rank deletes exactly what it created, and the footprint cap (--size) is split
evenly between ranks.
"""

from __future__ import annotations

import os
import time

import numpy as np

from ..dist.aggregate import MergeSpec, merge
from ..errors import ConfigError
from ..metrics import LatencyHistogram
from ..units import format_bytes, parse_size
from .safety import ProbeArea

PHASE_SPEC = MergeSpec(duration="seconds", sums=("bytes", "ops"), spreads=("bytes_per_s", "ops_per_s"),
                       hists={"latency_s": "latency_hist"}, rates={"bytes_per_s": "bytes", "ops_per_s": "ops"})


def _phase(seconds: float, nbytes: int, hist: LatencyHistogram) -> dict:
    return {"seconds": seconds, "bytes": nbytes, "ops": hist.count,
            "bytes_per_s": nbytes / seconds if seconds > 0 else None,
            "ops_per_s": hist.count / seconds if seconds > 0 else None,
            "latency_s": hist.summary(), "latency_hist": hist.encode()}


def _fenced(world, what: str, fn) -> dict:
    """Run one phase between barriers: together in, and timed on this rank."""
    world.barrier(f"probe {what} start")
    t0 = time.perf_counter_ns()
    nbytes, hist = fn()
    sec = (time.perf_counter_ns() - t0) / 1e9
    world.barrier(f"probe {what} end")
    return _phase(sec, nbytes, hist)


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _shared_dirs(world, area: ProbeArea, rels) -> None:
    """Rank 0 makes the folders every rank writes into, so they are in its ledger alone and it
    removes them last (after every other rank has removed its own files)."""
    if world.rank == 0:
        for rel in rels:
            area.makedirs(rel)
    world.barrier("probe folders")


def close_world_area(world, area: ProbeArea) -> None:
    """Each rank deletes what it created; rank 0 last, with the shared folders and the work folder."""
    world.barrier("probe done")
    if world.rank != 0:
        area.close()
    world.barrier("probe cleaned")
    if world.rank == 0:
        area.close()


def open_world_area(world, url: str, size_cap: int, force: bool, endpoint_url: str | None) -> ProbeArea:
    """Rank 0 claims the work folder; every rank works inside it with its share of the cap."""
    share = size_cap // world.size
    area = world.all_ok(lambda: ProbeArea.open(url, share, force, endpoint_url=endpoint_url)
                        if world.rank == 0 else None, what="probe target")
    work_url = world.bcast(area.work.url if area is not None else None, what="probe work folder")
    if area is None:
        area = ProbeArea.adopt(url, work_url, share, endpoint_url=endpoint_url)
    return area


# ------------------------------------------------------------------------------------ file
def file_probe(world, area: ProbeArea, transfer: int, per_rank: int, layouts: tuple[str, ...],
               fsync: bool = True) -> dict:
    if not area.backend.is_local:
        raise ConfigError("url", "the file probe needs a directory", "use `iobench probe s3` for object stores")
    blocks = per_rank // transfer
    if blocks < 1:
        raise ConfigError("--size", f"each of {world.size} ranks gets {format_bytes(per_rank)}, less than one "
                                    f"{format_bytes(transfer)} request", "raise --size or lower --bs")
    nbytes = blocks * transfer
    area.reserve(nbytes, "this rank's share of the aggregate file probe")
    n, r = world.size, world.rank
    buf = np.random.default_rng(r).integers(0, 256, transfer, dtype=np.uint8).tobytes()
    out: dict = {"transfer_bytes": transfer, "bytes_per_rank": nbytes, "blocks_per_rank": blocks}
    _shared_dirs(world, area, layouts)
    for layout in layouts:
        if layout == "n-n":
            def path_of(rank):
                return area.work.path(f"n-n/rank-{rank:05d}.dat")
            mine, theirs = path_of(r), path_of((r + 1) % n)

            def offsets(rank):
                return range(0, nbytes, transfer)
            area.track(f"n-n/rank-{r:05d}.dat")
        else:
            shared = area.work.path("n-1/shared.dat")
            mine = theirs = shared
            if r == 0:      # one creator; the others open it without truncating
                area.track("n-1/shared.dat")
                with open(shared, "wb") as f:
                    f.truncate(nbytes * n)
            world.barrier("probe n-1 create")

            def offsets(rank):
                return ((i * n + rank) * transfer for i in range(blocks))

        def write(path=mine, offs=offsets(r)):  # noqa: B008 — bound now: this rank's offsets
            h = LatencyHistogram()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                for off in offs:
                    t = time.perf_counter_ns()
                    os.pwrite(fd, buf, off)
                    h.record_ns(time.perf_counter_ns() - t)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            return nbytes, h

        res_w = _fenced(world, f"{layout} write", write)
        _drop_cache(theirs)
        world.barrier(f"probe {layout} cache dropped")

        def read(path=theirs, offs=offsets((r + 1) % n)):  # noqa: B008 — bound now: the next rank's offsets
            h = LatencyHistogram()
            got = 0
            fd = os.open(path, os.O_RDONLY)
            try:
                for off in offs:
                    t = time.perf_counter_ns()
                    got += len(os.pread(fd, transfer, off))
                    h.record_ns(time.perf_counter_ns() - t)
            finally:
                os.close(fd)
            return got, h

        res_r = _fenced(world, f"{layout} read", read)
        out[layout] = {"write": res_w, "read": res_r}
    return out


# ------------------------------------------------------------------------------------ metadata
def _time_each(op, paths) -> LatencyHistogram:
    """The latency of ``op(path)`` for each path, one histogram."""
    h = LatencyHistogram()
    for p in paths:
        t = time.perf_counter_ns()
        op(p)
        h.record_ns(time.perf_counter_ns() - t)
    return h


def metadata_probe(world, area: ProbeArea, files_per_rank: int, file_size: int) -> dict:
    if not area.backend.is_local:
        raise ConfigError("url", "the aggregate metadata probe runs on a directory",
                          "give a directory on the shared file system")
    n, r = world.size, world.rank
    area.reserve(files_per_rank * 2 * max(file_size, 1), "this rank's small files")
    payload = b"\0" * file_size
    out: dict = {"files_per_rank": files_per_rank, "file_size": file_size}
    _shared_dirs(world, area, ("md-unique", "md-shared"))
    area.makedirs(f"md-unique/rank-{r:05d}")
    for mode in ("unique", "shared"):
        def rel(rank, i, mode=mode):
            return f"md-unique/rank-{rank:05d}/f{i:07d}" if mode == "unique" else f"md-shared/r{rank:05d}-f{i:07d}"
        mine = [area.work.path(rel(r, i)) for i in range(files_per_rank)]
        theirs = [area.work.path(rel((r + 1) % n, i)) for i in range(files_per_rank)]
        area.track_many(rel(r, i) for i in range(files_per_rank))

        def create():
            h = LatencyHistogram()
            for p in mine:
                t = time.perf_counter_ns()
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                if payload:
                    os.write(fd, payload)
                os.close(fd)
                h.record_ns(time.perf_counter_ns() - t)
            return len(mine) * file_size, h

        def stat():
            return 0, _time_each(os.stat, theirs)

        def delete():
            return 0, _time_each(os.unlink, mine)

        out[mode] = {"create": _fenced(world, f"{mode} create", create),
                     "stat": _fenced(world, f"{mode} stat", stat),
                     "delete": _fenced(world, f"{mode} delete", delete)}
        for i in range(files_per_rank):
            area.forget(rel(r, i))
    return out


# ------------------------------------------------------------------------------------ s3
def s3_probe(world, area: ProbeArea, object_size: int, objects: int, concurrency: int) -> dict:
    from .s3ops import OpStats, S3Ops, pool

    if not area.backend.speaks_s3:
        raise ConfigError("url", "the s3 probe needs s3://bucket/prefix", "use `iobench probe file` for directories")
    area.reserve(object_size * objects, "this rank's objects")
    ops = S3Ops(area.work)
    r = world.rank
    names = [f"s3/rank-{r:05d}/o{i:06d}" for i in range(objects)]
    theirs = [f"s3/rank-{(r + 1) % world.size:05d}/o{i:06d}" for i in range(objects)]
    data = np.random.default_rng(r).integers(0, 256, object_size, dtype=np.uint8).tobytes()
    area.track_many(names)

    def phase(kind):
        stats = OpStats()

        async def go():
            s3 = await ops.client()
            if kind == "put":
                await pool(names, concurrency, lambda k: ops.put(s3, k, data, stats), stats)
            else:
                await pool(theirs, concurrency, lambda k: ops.get(s3, k, stats), stats)
        ops.run(go)
        return stats.bytes, stats.latency

    return {"object_bytes": object_size, "objects_per_rank": objects, "concurrency": concurrency,
            "put": _fenced(world, "s3 put", lambda: phase("put")),
            "get": _fenced(world, "s3 get", lambda: phase("get"))}


# ------------------------------------------------------------------------------------ small files
def smallfiles_probe(world, area: ProbeArea, cfg, storage_options=None, endpoint_url=None) -> dict:
    """Each rank its own copy of the small-file comparison (1/N of the samples), read format by
    format behind barriers, so all ranks hit the storage with the same format at once."""
    from dataclasses import replace

    from .smallfiles import _generate, _set_cache, read_dataset, read_with_loader

    n, r = world.size, world.rank
    _shared_dirs(world, area, [f"rank-{k:05d}" for k in range(n)])
    mine = ProbeArea.adopt(area.backend.url, area.work.child(f"rank-{r:05d}").url, area.size_cap,
                           endpoint_url=endpoint_url, storage_options=storage_options)
    per = max(2, cfg.samples // n)
    rcfg = replace(cfg, samples=per, batch_size=min(cfg.batch_size, per))
    formats = ["files", *cfg.shard_formats]
    out: dict = {"samples_per_rank": rcfg.samples, "formats": {}}
    try:
        manifests = {fmt: _generate(mine, rcfg, fmt, storage_options, endpoint_url) for fmt in formats}
        for fmt in formats:
            rel = f"smallfiles/{fmt}"
            residency = _set_cache(mine, rel, manifests[fmt], cfg.cache)
            url = mine.work.child(rel).url
            world.barrier(f"probe smallfiles {fmt} start")
            if cfg.reader == "loader":
                res = read_with_loader(url, manifests[fmt], rcfg, storage_options=storage_options,
                                       endpoint_url=endpoint_url)
            else:
                res = read_dataset(url, manifests[fmt], rcfg.workers, rcfg.seed, storage_options=storage_options,
                                   endpoint_url=endpoint_url)
            world.barrier(f"probe smallfiles {fmt} end")
            out["formats"][fmt] = {"seconds": res["seconds"], "samples": res["samples"], "bytes": res["bytes"],
                                   "opens": res["opens"], "samples_per_s": res["samples"] / res["seconds"]
                                   if res["seconds"] > 0 else None, "residency_before": residency}
    finally:
        mine.close()
    return out


def merge_smallfiles(per_rank: list[dict], hosts: list[str]) -> dict:
    spec = MergeSpec(duration="seconds", sums=("samples", "bytes", "opens"), spreads=("samples_per_s",),
                     rates={"samples_per_s": "samples", "bytes_per_s": "bytes"})
    fmts = per_rank[0]["formats"]
    out = {f: merge([p["formats"][f] for p in per_rank], spec, hosts) for f in fmts}
    shard = [f for f in fmts if f != "files"]
    best = max(shard, key=lambda f: out[f]["samples_per_s"] or 0) if shard else None
    base = out["files"]["samples_per_s"]
    return {"samples_per_rank": per_rank[0]["samples_per_rank"], "formats": out, "best_shard_format": best,
            "penalty": (out[best]["samples_per_s"] / base) if best and base else None}


# ------------------------------------------------------------------------------------ world view
def merge_probe_ranks(per_rank: list[dict], hosts: list[str]) -> dict:
    """Every phase of every layout/mode merged: rates are totals over the slowest rank's phase time."""
    first = per_rank[0]["aggregate"]
    out: dict = {}
    for section, body in first.items():
        if section == "smallfiles":
            out[section] = merge_smallfiles([p["aggregate"][section] for p in per_rank], hosts)
            continue
        if not isinstance(body, dict):
            continue
        sec_out = {}
        for name, phases in body.items():
            if not isinstance(phases, dict):
                sec_out[name] = phases
                continue
            if "seconds" in phases:     # a phase directly (s3 put/get)
                sec_out[name] = merge([p["aggregate"][section][name] for p in per_rank], PHASE_SPEC, hosts)
                continue
            sec_out[name] = {ph: merge([p["aggregate"][section][name][ph] for p in per_rank], PHASE_SPEC, hosts)
                             for ph in phases}
        out[section] = sec_out
    return {"aggregate": out}


def summary_lines(agg: dict) -> list[str]:
    """One line per phase: the aggregate figure first, then the slowest rank."""
    lines = []
    sf = agg.get("smallfiles")
    if sf:
        pen = sf["penalty"]
        lines.append(f"smallfiles: {sf['best_shard_format']} shards give {pen:.2f}x the aggregate samples/s of one "
                     "file per sample (start-up included)" if pen else "smallfiles: no penalty measured")
        for f, v in sf["formats"].items():
            lines.append(f"smallfiles {f}: {v['samples_per_s'] or 0:,.0f} samples/s aggregate, {v['opens']} opens; "
                         f"{v['world']['straggler'].get('line', '')}")
    for section, body in agg.items():
        if section == "smallfiles":
            continue
        for name, phases in body.items():
            if not isinstance(phases, dict):
                continue
            items = [(name, phases)] if "seconds" in phases else [(f"{name} {ph}", v) for ph, v in phases.items()]
            for label, v in items:
                lat = v.get("latency_s") or {}
                rate = (f"{format_bytes(v['bytes_per_s'])}/s" if v.get("bytes") else f"{v['ops_per_s'] or 0:,.0f} ops/s")
                lines.append(f"{section} {label}: {rate} aggregate, {v['ops']} ops in {v['seconds']:.3f} s "
                             f"(slowest rank), p99 {1e3 * (lat.get('p99') or 0):.2f} ms; "
                             f"{v['world']['straggler'].get('line', '')}")
    return lines


def parse_one(values, default: str, field: str) -> int:
    """The single size a world probe uses: the one given, else the default."""
    if values and len(values) == 1:
        return int(parse_size(str(values[0]), field))
    return int(parse_size(default, field))


__all__ = ["open_world_area", "close_world_area", "file_probe", "metadata_probe", "s3_probe", "smallfiles_probe",
           "merge_probe_ranks", "summary_lines"]
