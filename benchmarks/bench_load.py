"""iobench's loader against peers, side by side on the same bytes, in one run.

    .venv/bin/python benchmarks/bench_load.py [--sections overhead,access,fio,s3,tar,parquet,tfrecord,memory]
                                              [--out reports/reference/load] [--scale 1.0] [--merge]

Each section generates one dataset with `iobench gen`, reads it with `iobench load`
(the library call behind it) and with the peer, alternating, and records the ratio
iobench / peer of bytes (or samples) per second.  Absolute numbers on a shared machine
are noise; ratios from the same run are what to compare (measurement rule 8, "ratios, same run", docs/design.md).
Writes OUT.json (everything) and OUT.md (a table), and prints the table.  ``--merge``
reruns only the chosen sections: their rows replace the same rows of an existing OUT.json,
the other rows stay, and the rerun's command and machine are recorded under meta.updates.
``--replay RUN.json --merge`` measures nothing: it merges the rows of an earlier run written
elsewhere (``--out``), so a branch's sections land on a report that changed in the meantime.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil

from iobench.loader.core import LoadConfig, run_load
from iobench.schema import STALL_RATIO

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (MiB, alternating, command, cpu_seconds, dataset, fio, fio_rate, fixed_records, header, iobench_exe,
                     last_json, machine, median_run, paired_row, parser, row, row_notes, run_sections, scratch,
                     sections_option, set_cache, skipped, table, timed, updates, whole_process, write_results, yes_no)

REPEATS = 3
FIO_ROUNDS = 7   # the raw-token rows: each round is ~1 s, and the disk's swings need more than 3


def load_rate(cfg: LoadConfig, **kw) -> dict:
    r = run_load(cfg, **kw)
    m = r.metrics
    return {**{k: m["throughput"][k] for k in ("bytes_per_s", "samples_per_s", "steady_samples_per_s")},
            **{k: m[k] for k in (STALL_RATIO, "accelerator_utilization", "bytes_read", "wall_s")},
            "cache": r.environment["cache"], "system": {k: v for k, v in m["system"].items() if k != "series"}}


def floor_row(name: str, iob: dict, peer: dict, metric: str, note: str) -> dict:
    """A row against a fixed floor (``peer``: the floor's value of ``metric``): target 1.0."""
    return row(name, metric, iob, peer, iob[metric] / peer[metric], 1.0, note)


# ------------------------------------------------------------------------------------------------

def _floor_rows(name: str, scale: float, accesses: tuple[str, ...]) -> list[tuple[str, dict, dict]]:
    """(access, the best of REPEATS fast runs, the best of REPEATS paced runs: 5 ms compute, 300 steps)
    per access pattern, on null storage: memory backend, 1 KiB token samples, batch 256, 1 worker."""
    from fsspec.implementations.memory import MemoryFileSystem

    url = f"memory://bench-{name}/tok"
    dataset(url, 131072 * scale, "4MiB")
    out = []
    for access in accesses:
        base = LoadConfig(dataset=url, access=access, workers=1, prefetch=4, batch_size=256, shuffle_buffer=8192,
                          monitor_interval_s=1.0)
        fast = max((load_rate(base) for _ in range(REPEATS)), key=lambda r: r["steady_samples_per_s"])
        paced = max((load_rate(replace(base, compute="5ms", steps=300)) for _ in range(REPEATS)),
                    key=lambda r: r["accelerator_utilization"])
        out.append((access, fast, paced))
    MemoryFileSystem.store.clear()
    return out


AU_PEER = {"accelerator_utilization": 0.99, "what": "target from the issue"}


def bench_overhead(work: Path, scale: float) -> list[dict]:
    """Harness overhead on null storage: memory backend, 1 KiB token samples, batch 256."""
    [(_, top, au)] = _floor_rows("overhead", scale, ("block",))
    return [floor_row("overhead: samples/s, compute 0, W=1 (memory backend)", top,
                      {"steady_samples_per_s": 1_000_000.0, "what": "target from issue 13 item 7"}, "steady_samples_per_s",
                      "1 KiB samples, batch 256, 1 worker, block access; peer = issue 13's floor of 1M "
                      "samples/s (best of 3 runs)"),
            floor_row("overhead: AU at compute 5 ms (memory backend)", au, AU_PEER, "accelerator_utilization",
                      "300 steps; stall = consumer-side harness cost")]


def bench_access(work: Path, scale: float) -> list[dict]:
    """The harness floor of the map and stream patterns (memory backend, 1 KiB token samples, batch 256):
    map makes one request per sample, stream one streamed request per shard read in 64 KiB pieces."""
    out = []
    for access, fast, paced in _floor_rows("access", scale, ("map", "stream")):
        out += [floor_row(f"overhead: samples/s, compute 0, W=1, access {access} (memory backend)", fast,
                          {"steady_samples_per_s": 100_000.0, "what": "floor for this pattern"}, "steady_samples_per_s",
                          "1 KiB samples, batch 256, 1 worker; peer 100k samples/s: issue 13's 1M floor "
                          "is stated for the block harness (the overhead row); map makes one request per "
                          "sample and stream copies each piece into its shuffle buffer, so their floor "
                          "is kept at 100k (best of 3 runs)"),
                floor_row(f"overhead: AU at compute 5 ms, access {access} (memory backend)", paced, AU_PEER,
                          "accelerator_utilization", "300 steps")]
    return out


def _fio(files: list[str], bs: int, jobs: int, direct: bool, iodepth: int = 1) -> dict:
    folder = os.path.dirname(files[0])
    assert all(os.path.dirname(f) == folder for f in files)
    engine = ["--ioengine=psync"] if iodepth == 1 else ["--ioengine=libaio", f"--iodepth={iodepth}"]
    # names relative to --directory: fio refuses a --filename list over 4096 characters
    t, job = fio(*(a for i in range(jobs) for a in (
        f"--name=j{i}", "--rw=read", f"--bs={bs}", *engine, f"--direct={int(direct)}", "--invalidate=0",
        f"--directory={folder}", "--filename=" + ":".join(os.path.basename(f) for f in files[i::jobs]),
        "--file_service_type=sequential")))
    rep = job["read"]
    return {"bytes_per_s": fio_rate(rep), "bytes_read": rep["io_bytes"], "runtime_s": rep["runtime"] / 1000,
            "wall_s": t, "jobs": jobs, "bs": bs, "direct": direct}


def _gather_loop(files: list[str], fixed, batch: int, seed: int = 0, mapped: bool = False) -> dict:
    """The least work any shuffling loader does on these bytes, in one process: each shard read
    whole (one preadv of the shard into a reused page-aligned buffer, fio's request), its rows
    permuted, and every ``batch`` of them gathered into one batch buffer; no worker process, no
    hand-off.  Against fio it is the price of the gather; against iobench, that of the hand-off.

    The buffer is the kind iobench reads a block into (``source._anonymous``: huge pages where the
    kernel gives them; NOTE [ Block buffers ] in docs/design.md).

    ``mapped``: each shard mapped with MAP_POPULATE instead of read, and gathered from the page
    cache (the design iobench's warm block path had before that note): one copy of each byte
    plus the mapping's page-table work."""
    import mmap

    import numpy as np

    from iobench.loader.source import _anonymous

    off0, rec, dtype = fixed
    size = max(os.path.getsize(f) for f in files)
    buf = np.frombuffer(_anonymous(size), dtype=np.uint8)
    out = np.empty((batch, rec // dtype.itemsize), dtype=dtype)
    rng = np.random.default_rng(seed)
    n_bytes = 0

    def run():
        nonlocal n_bytes
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                mm = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ) if mapped else None
                got = len(mm) if mm is not None else os.preadv(fd, [buf[:size]], 0)
            finally:
                os.close(fd)
            src = buf if mm is None else np.frombuffer(mm, dtype=np.uint8)
            n_bytes += got
            rows = src[off0:off0 + (got - off0) // rec * rec].view(dtype).reshape(-1, rec // dtype.itemsize)
            perm = rng.permutation(len(rows))
            for j in range(0, len(rows), batch):
                sel = perm[j:j + batch]
                np.take(rows, sel, axis=0, out=out[:len(sel)], mode="clip")
            if mm is not None:
                del rows, src
                mm.close()
    t, _ = timed(run)
    return {"bytes_per_s": n_bytes / t, "bytes_read": n_bytes, "wall_s": t, "batch": batch,
            "how": "mmap MAP_POPULATE + gather" if mapped else "pread + gather"}


SHARD = 8 * MiB


def raw_tokens(work: Path, scale: float):
    """The raw token dataset of the fio rows (bench_inprocess's too): 1 GiB in 8 MiB shards of 1 KiB
    samples; (its url, its manifest, its shard files)."""
    # 1 GiB (128 shards): at 32 shards a cold round was 32 requests in 0.3 s, and this disk's
    # speed moves by +-30% within seconds, so 3 such rounds measured the disk, not iobench
    # (rows 0.66-1.02 from one hour to the next; 10 sandwiched rounds at 1 GiB: 0.90).
    url = str(work / "raw-tokens")
    m, files = dataset(url, 1048576 * scale, f"{SHARD}B", fsync=True)
    return url, m, files


def bench_fio(work: Path, scale: float) -> list[dict]:
    """Raw tokens from local files: warm page cache vs fio --invalidate=0; cold vs fio --direct=1.

    fio is a fair peer for the reads (checked: the same files, the same bytes, one request of the
    shard size per shard, one stream), but it does less than a loader: it drops the bytes, while
    iobench shuffles them into batches (a gather: a second copy of every byte) and hands each batch
    to the consumer process.  So the warm rows also run, in the same rounds, the least work any
    shuffling loader does on these bytes (``_gather_loop``: the same reads and the same gather in
    one process), and report iobench against it: that ratio is the price of the hand-off alone.
    """
    if not shutil.which("fio"):
        return skipped("fio", "fio not installed")
    url, m, files = raw_tokens(work, scale)
    W = 1  # one stream each: the consumer is one process, as fio's job is
    fixed = fixed_records(m)
    out = []
    for state, batch in (("warm", 256), ("warm", 1024), ("cold", 256)):
        cold = state == "cold"
        cfg = LoadConfig(dataset=url, access="block", workers=W, prefetch=4, batch_size=batch, shuffle_buffer=8192,
                         monitor_interval_s=1.0, read_ahead=1, cache=state, odirect=cold, s3_block_size=f"{SHARD}B")

        def fio_side(cold=cold, state=state) -> dict:
            set_cache(files, state)
            return _fio(files, SHARD, W, direct=cold)

        # the sides swap which goes first every round, so a drift of the disk or the host within a
        # round does not always favour the same side; the diagnostics run after them
        after = ({"fio_qd2": lambda r: _fio(files, SHARD, W, direct=True, iodepth=2)} if cold else
                 {"gather": lambda r, batch=batch: _gather_loop(files, fixed, batch, seed=r),
                  "mapped": lambda r, batch=batch: _gather_loop(files, fixed, batch, seed=r, mapped=True)})
        runs = alternating(FIO_ROUNDS, {"iob": lambda cfg=cfg: load_rate(cfg), "fio": fio_side}, after)
        iob, peer = runs["iob"], runs["fio"]
        out.append(paired_row(
            f"raw tokens, {state}, batch {batch} x 1 KiB: iobench W={W} vs fio {W} jobs" +
            (" --direct=1" if cold else " --invalidate=0 after pre-read"),
            iob, peer, "bytes_per_s", 0.9 if cold else 0.7,
            f"{len(files)} shards of {SHARD // MiB} MiB, request size = shard; iobench also shuffles and "
            f"collates {batch}-sample batches into shared memory and hands each to the consumer; "
            "iobench --read-ahead 1; "
            "warm = the page cache: each block (--shuffle-buffer 8192 = one shard's samples) read with one preadv "
            "into a reused huge-page buffer and each batch gathered from it into its slot (NOTE [ Block buffers ] "
            "in docs/design.md; fio preads the shard into its buffer and drops it); "
            "cold = iobench --odirect (O_DIRECT preads of the shard size into aligned buffers); "
            "fio is a fair peer for the reads (same files and bytes, one shard-sized request per shard, "
            "one stream; fio skips each shard's 64-byte tail), not for the delivery: see the gather rows",
            bytes_checked={"iobench_bytes_read": median_run(iob, "bytes_per_s").get("bytes_read"),
                           "fio_bytes_read": median_run(peer, "bytes_per_s").get("bytes_read")}))
        head = f"raw tokens, {state}, batch {batch} x 1 KiB"
        diagnostics = [
            (f"raw tokens, {state}: fio 2 requests in flight (libaio --iodepth=2) vs fio 1 (psync)", "fio_qd2", "fio",
             "the same O_DIRECT shard reads with a second request in flight; near 1 means one request saturates this "
             "device, so a loader keeping two in flight would only hide its own gaps between reads, not use device "
             "parallelism fio leaves idle"),
            (f"{head}: one-process read + shuffled gather (no hand-off) vs fio", "gather", "fio",
             "the same shard reads as fio plus the shuffled gather of every batch, in one process "
             "(benchmarks/bench_load.py _gather_loop): the price of the gather alone"),
            (f"{head}: iobench W={W} vs one-process read + shuffled gather", "iob", "gather",
             "iobench against the same reads and gather with no worker process and no hand-off: the price of the "
             "per-batch hand-off (slot, pipe message, wake-ups, Batch view)"),
            (f"{head}: one-process map + shuffled gather (no hand-off) vs fio", "mapped", "fio",
             "the mapped alternative (iobench's warm design before NOTE [ Block buffers ]) with no worker process "
             "and no hand-off -- each shard mapped with MAP_POPULATE and every batch gathered from the page cache, "
             "in one process (_gather_loop mapped=True)"),
            (f"{head}: iobench W={W} vs one-process map + shuffled gather", "iob", "mapped",
             "iobench (read + gather) against the mapped alternative in one process (the worker process, the "
             "read-ahead thread and the per-batch hand-off on 2 cores included)")]
        out += [paired_row(name, runs[a], runs[b], "bytes_per_s", None, "diagnostic, no target: " + note)
                for name, a, b, note in diagnostics if a in runs and b in runs]
    return out


def s3_peer_main(name: str, paths_file: str, emulate: str | None, in_flight: int = 4) -> None:
    """One peer reading the objects in ``paths_file``, in its own process; prints a JSON line.

    Peers run in their own processes: obstore's and the CRT's runtimes do not survive the
    fork() that iobench's loader workers are made with, and whole-process times are fair.
    Credentials and the endpoint come from the AWS_* environment.  With ``emulate`` each
    GET first waits the latency the loader's EmulatedBackend would add (same spec).
    """
    import asyncio
    import random

    from iobench.wrappers import resolve_emulation

    t_start = time.perf_counter()
    paths = Path(paths_file).read_text().split()
    keys = [p.split("/", 1)[1] for p in paths]
    bucket = paths[0].split("/", 1)[0]
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    spec, rng = resolve_emulation(emulate), random.Random(1)

    def paced_loop(get):
        """A loop over the keys, each ``get`` paced as the emulation says."""
        def go(k):
            if spec.active:
                time.sleep(spec.sample_latency(rng))
            t0 = time.perf_counter()
            n = get(k)
            rest = spec.transfer_s(n) - (time.perf_counter() - t0) if spec.active else 0
            if rest > 0:
                time.sleep(rest)
            return n
        return lambda: sum(go(k) for k in keys)

    if name == "s3fs cat_file loop":
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, client_kwargs={"endpoint_url": endpoint})
        fs.info(paths[0])  # client and connection set up outside the timing
        run = paced_loop(lambda k: len(fs.cat_file(f"{bucket}/{k}")))
    elif name.startswith("obstore"):
        import obstore
        from obstore.store import S3Store

        st = S3Store(bucket, config={"endpoint": endpoint, "virtual_hosted_style_request": False},
                     client_options={"allow_http": True})
        obstore.head(st, keys[0])
        if name == "obstore get loop":
            run = paced_loop(lambda k: len(obstore.get(st, k).bytes()))
        else:
            async def go():
                sem = asyncio.Semaphore(in_flight)

                async def one(k):
                    async with sem:
                        return len(await (await obstore.get_async(st, k)).bytes_async())
                return sum(await asyncio.gather(*[one(k) for k in keys]))
            run = lambda: asyncio.run(go())  # noqa: E731
    else:
        from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

        c = MountpointS3Client(region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"), endpoint=endpoint,
                               force_path_style=True)
        c.head_object(bucket, keys[0])
        run = lambda: sum(len(ch) for k in keys for ch in c.get_object(bucket, k))  # noqa: E731
    c0 = cpu_seconds()
    t, n = timed(run)
    # client_cpu_s: this process's CPU inside the clock (its GETs; it has no child processes), comparable
    # with the server's CPU for the side; the whole-process figure the parent records adds interpreter
    # start and imports.
    print(json.dumps({"bytes_read": n, "wall_s": t, "bytes_per_s": n / t, "client_cpu_s": cpu_seconds() - c0,
                      "process_s": time.perf_counter() - t_start}))


def _s3_peer_names(emulate: str | None) -> list[str]:
    import importlib.util

    out = ["s3fs cat_file loop"]
    if importlib.util.find_spec("obstore"):
        out.append("obstore get loop")
        if not emulate:  # the emulated latency is applied per GET in sequence; not for the async variant
            out.append("obstore get_async, as many in flight as iobench")
    if importlib.util.find_spec("s3torchconnectorclient") is None:
        print("s3torchconnectorclient is not installed: the AWS CRT peer row is left out "
              "(pip install 'iobench[s3crt]')", file=sys.stderr, flush=True)
    elif not emulate:
        out.append("s3torchconnectorclient (AWS CRT) get_object loop")
    return out


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its children so far."""
    p = psutil.Process(pid)
    procs = [p] + p.children(recursive=True)
    return sum(sum(q.cpu_times()[:2]) for q in procs if q.is_running())


def _run_s3_peer(name: str, srv, paths_file: Path, emulate: str | None, in_flight: int = 4) -> dict:
    args = [sys.executable, __file__, "--peer", json.dumps({"s3": {"name": name, "paths_file": str(paths_file),
                                                                  "emulate": emulate, "in_flight": in_flight}})]
    for attempt in range(2):  # one retry: a peer that dies once (signal, server hiccup) is tried again
        s0 = _cpu_s(srv.pid)
        t, p, cpu = whole_process(args, 600, env={**os.environ, **srv.env()})
        if p.returncode == 0:
            return {**last_json(p.stdout), "whole_process_s": t, "attempts": attempt + 1,
                    "server_cpu_s": _cpu_s(srv.pid) - s0, "in_flight": in_flight if "in flight" in name else 1,
                    "client_cpu_s_whole_process": cpu}
        print(f"[s3] peer {name!r} exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return {"error": f"exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}", "bytes_per_s": None}


ONE_BATCH = "iobench (obstore), one batch per block"
# The shared server swings most between rounds: per-round ratios spread 0.58-0.84 in 5 rounds, and
# the median of 5 moved 0.61-0.73 between runs.  Each S3 round takes ~10 s.
S3_ROUNDS = 7


def _s3_read_plan(srv, opts: dict, shard_bytes: int, workers: int):
    """The loader's request size and GETs in flight, from a short `iobench probe s3` GET sweep of this server.

    The loader reads whole shards here (block access), so the plan takes the largest GET size near the
    best (whole_shards): the smallest one, 4 MiB on some runs, cut each shard in two GETs (more requests
    for the server sharing the 2 cores, and a copy out of obstore's buffers)."""
    from iobench.planner.s3_reads import plan_s3_reads
    from iobench.probe.s3_probe import S3ProbeConfig, run_s3_probe
    from iobench.probe.safety import ProbeArea

    with ProbeArea.open("s3://iobench/bench-probe", 256 * MiB, endpoint_url=srv.endpoint_url,
                        storage_options=opts) as area:
        res = run_s3_probe(area, S3ProbeConfig(sizes=("1MiB", "2MiB", "4MiB", "8MiB"), concurrency=(1, 2, 4, 8),
                                               runtime="0.5s", ops=("get",)))
    points = res["metrics"]["points"]
    return plan_s3_reads(points, shard_bytes, workers, whole_shards=True), [
        {k: p[k] for k in ("object_size", "concurrency", "bytes_per_s")} for p in points]


def _with_cpu(srv, fn) -> dict:
    """``fn()``'s result plus the CPU seconds the server and this process (and its reaped children) spent."""
    s0, c0 = _cpu_s(srv.pid), cpu_seconds()
    r = fn()
    return {**r, "server_cpu_s": _cpu_s(srv.pid) - s0, "client_cpu_s_whole_process": cpu_seconds() - c0}


def bench_s3(work: Path, scale: float) -> list[dict]:
    """Embedded S3 server: iobench's loader (obstore and s3fs clients) vs s3fs and the fastest clients.

    Fair on this host: the server runs here, so the loader gets one worker per core it leaves
    (the consumer shares the rest); its request size and GETs in flight come from a probe of
    this server (iobench.planner.s3_reads), and the concurrent peer keeps as many GETs in
    flight as the loader does.  Both sides' clocks start once their clients exist and stop at
    the last byte (the loader's: delivered to the consumer).  The server's CPU time per side
    is recorded: on 2 shared cores both sides are CPU-bound, and that is where a gap goes.
    """
    from iobench.dist.world import usable_cores
    from iobench.s3server import S3Server

    out = []
    with S3Server(bucket="iobench") as srv:
        opts = {"key": srv.access_key, "secret": srv.secret_key}
        url = "s3://iobench/bench/raw-tokens"
        m, paths = dataset(url, 2 * 262144 * scale, f"{SHARD}B",
                           gen={"endpoint_url": srv.endpoint_url, "storage_options": opts})
        total = sum(s.bytes for s in m.shards)
        # One worker per core, although the server runs here too: W = cores - 1 measured slower on
        # 2 cores (one worker's core then carries all the collation and hand-off as well as its GETs).
        W = max(1, usable_cores())
        plan, probe_points = _s3_read_plan(srv, opts, max(s.bytes for s in m.shards), W)
        print(f"[s3] read plan: {plan.block_size // 1024} KiB GETs, {plan.concurrency} in flight per worker, "
              f"read-ahead {plan.read_ahead}, W={W} ({plan.why})", file=sys.stderr)
        for emulate in (None, "object"):
            # With emulated latency the no-latency probe undersizes the GETs in flight (Little's law:
            # bandwidth x latency / request size): the earlier fixed 2 MiB x 4 per worker, W=2, stays.
            # Three blocks read ahead, not one: blocks are consumed in order, and a block waits for
            # its slowest GET (the profile's p99 is 10x its p50); with one block ahead the GET pool
            # ran dry behind it.  s3fs side, 5 alternating rounds: 1.08-1.33x the rate with one ahead.
            w, bs, conc, ra = (W, plan.block_size, plan.concurrency, plan.read_ahead) if not emulate else \
                (2, 2 * MiB, 4, 3)
            cfg = LoadConfig(dataset=url, endpoint_url=srv.endpoint_url, access="block", workers=w, prefetch=4,
                             batch_size=256, shuffle_buffer=8192, s3_block_size=f"{bs}B", s3_concurrency=conc,
                             monitor_interval_s=1.0, read_ahead=ra, emulate=emulate or "none")
            def iob(cfg=cfg, **change) -> dict:
                return _with_cpu(srv, lambda: load_rate(replace(cfg, **change), storage_options=opts))
            sides = {"iobench (obstore)": lambda: iob(s3_client="obstore"), "iobench (s3fs)": lambda: iob(s3_client="s3fs")}
            if not emulate:   # diagnostic: the same reads with 32x fewer batch hand-offs to the consumer
                sides[ONE_BATCH] = lambda: iob(s3_client="obstore", batch_size=8192)
            peers = _s3_peer_names(emulate)
            paths_file = work / "s3-paths.txt"
            paths_file.write_text("\n".join(paths))
            def peer_run(k: str) -> dict:
                r = _run_s3_peer(k, srv, paths_file, emulate, in_flight=w * conc)
                if r.get("error") is None and r["bytes_read"] != total:
                    raise RuntimeError(f"{k} read {r['bytes_read']} bytes, expected {total}")
                return r
            runs = alternating(S3_ROUNDS, {**sides, **{k: lambda k=k: peer_run(k) for k in peers}})

            fastest = max(peers, key=lambda k: median_run(runs[k], "bytes_per_s").get("bytes_per_s") or 0)
            tag = f", emulated {emulate} latency" if emulate else ""
            common = (f"{len(paths)} objects of {SHARD // MiB} MiB ({total / MiB:.0f} MiB); iobench W={w}, read-ahead {ra}, "
                      f"{bs // 1024} KiB ranged GETs, {conc} in flight per worker"
                      + (f" (from a probe of this server: {plan.why})" if not emulate else "")
                      + f", batches of 256 x 1 KiB delivered to the consumer; the concurrent peer keeps {w * conc} "
                      "GETs of whole objects in flight; the peers fetch the same objects and drop them: they neither "
                      "shuffle nor hand batches on, while iobench gathers every sample into a shuffled batch in shared "
                      "memory for the consumer; peers: one process each; each client made before its "
                      f"clock starts; the server shares the machine's {usable_cores()} cores; median of {S3_ROUNDS} "
                      "alternating rounds, the order reversed every other round; server_cpu_s = the server's "
                      "CPU time during each side; client_cpu_s (peers) = the peer's CPU inside its clock")
            if emulate:
                common += ("; every GET (iobench's and the peers') waits a latency drawn from the "
                           "'object' profile (lognormal p50 50 ms, p99 500 ms, 400 MB/s per stream)")
            s3fs_peer = "s3fs cat_file loop"
            pairs = [("iobench (obstore)", s3fs_peer, 1.5), ("iobench (obstore)", fastest, 0.9),
                     ("iobench (s3fs)", s3fs_peer, 1.5), (ONE_BATCH, fastest, None)]
            seen = set()
            for side, peer, target in pairs:
                if side not in sides or (side, peer) in seen:   # the fastest peer may be s3fs itself
                    continue
                seen.add((side, peer))
                # per-round ratios, then their median: the server and the host swing between rounds;
                # in_round_order: odd rounds ran in reverse order, so a position effect shows there
                out.append(paired_row(
                    f"S3{tag}: {side} vs {peer}", runs[side], runs[peer], "bytes_per_s", target, common + (
                        "; diagnostic row, no target: batches of 8192 samples (one per 8 MiB block) instead of 256, "
                        "i.e. 32x fewer hand-offs through the slots and pipes" if side == ONE_BATCH else ""),
                    all_peers={k: median_run(runs[k], "bytes_per_s") for k in peers},
                    read_plan=plan.to_dict() if not emulate else None,
                    probe_points=probe_points if not emulate else None))
    return out


# ---- file formats against their own libraries: whole processes, default access, cold and warm ----

def file_peer_main(kind: str, paths_file: str) -> None:
    """One format peer reading every shard in ``paths_file`` once, in its own process; prints a JSON line."""
    t0 = time.perf_counter()
    files = Path(paths_file).read_text().split()
    b = 0
    if kind == "webdataset":
        import webdataset as wds

        sizes = [len(sample["jpg"]) for sample in wds.WebDataset(files, shardshuffle=False, empty_check=False)]
        n, b = len(sizes), sum(sizes)
    elif kind == "pyarrow":
        import pyarrow.parquet as pq

        n = sum(rb.num_rows for f in files for rb in pq.ParquetFile(f).iter_batches())
    else:
        from tfrecord.reader import tfrecord_loader

        n = sum(1 for f in files for _rec in tfrecord_loader(f, None, {"tokens": "byte"}))
    print(json.dumps({"samples": n, "payload_bytes": b or None, "in_process_s": time.perf_counter() - t0}))


def _vs_format_peer(work: Path, spec: dict, peer: str, label: str, note: str, target: float,
                    workers: tuple[int, ...] = (1, 2), batch: int = 256, extra: tuple[str, ...] = ()) -> list[dict]:
    """``iobench load`` with its defaults (the format's default access pattern: stream for tar, Parquet
    and TFRecord; real worker processes) against the format's own library in one process, each a
    whole process timed from exec to exit (imports and start-up included), page cache warm and
    cold, REPEATS alternating rounds; the sides swap which goes first every round.

    The dataset is ``spec`` (``harness.dataset``'s arguments) generated under ``work``; ``note`` may
    name ``{samples}``, ``{mib}`` and ``{shards}`` of what was generated."""
    url = str(work / f"{spec['fmt']}-{spec['modality']}")
    m, files = dataset(url, **spec)
    note = note.format(samples=m.total_samples, mib=m.total_bytes / MiB, shards=len(files))
    paths_file = work / f"{peer}-paths.txt"
    paths_file.write_text("\n".join(files))
    jpath = work / "load.json"
    out = []
    for state in ("warm", "cold"):
        for w in workers:
            def side(cmd: list[str], state=state) -> tuple[dict, str]:
                resident = set_cache(files, state)
                t, p, cpu = whole_process(cmd)
                if p.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd[:3])} failed (exit {p.returncode}): {p.stderr[-1500:]}")
                return {"wall_s": t, "cpu_s": cpu, "resident_at_start": resident}, p.stdout

            def iob_side(w=w) -> dict:
                r, _ = side([iobench_exe(), "load", url, "-W", str(w), "--batch-size", str(batch), "--epochs", "1",
                             "--cache", "as-is", "--no-progress", "--json", str(jpath), *extra])
                m = json.loads(jpath.read_text())["metrics"]
                return {"samples_per_s": m["samples"] / r["wall_s"], "samples": m["samples"], **r, "access": m["access"],
                        "workers": w, "in_process_samples_per_s": m["throughput"]["samples_per_s"]}

            def peer_side() -> dict:
                r, so = side([sys.executable, __file__, "--peer",
                              json.dumps({"file": {"kind": peer, "paths_file": str(paths_file)}})])
                d = last_json(so)
                return {"samples_per_s": d["samples"] / r["wall_s"], "samples": d["samples"], **r,
                        "in_process_s": d["in_process_s"], "payload_bytes": d.get("payload_bytes")}
            iob, pr = alternating(REPEATS, {"iob": iob_side, "peer": peer_side}).values()
            if any(i["samples"] != p["samples"] for i, p in zip(iob, pr)):
                raise RuntimeError(f"{label}: iobench and the peer read different sample counts "
                                   f"({[i['samples'] for i in iob]} vs {[p['samples'] for p in pr]})")
            out.append(paired_row(label.format(workers=w, state=state), iob, pr, "samples_per_s", target,
                                  f"{note}; page cache {state} before each process (cold: pages dropped, largest "
                                  f"resident fraction left {max(r['resident_at_start'] for r in iob + pr):.0%}); "
                                  f"whole-process wall time from exec to exit, imports included; iobench: "
                                  f"`iobench load -W {w} -B {batch}` with its default access "
                                  f"({iob[0]['access']}); median of {REPEATS} alternating rounds; cpu_s = user + "
                                  "system seconds of the whole process tree"))
    return out


def bench_tar(work: Path, scale: float) -> list[dict]:
    """Tar (WebDataset) images without decode: iobench vs the webdataset library."""
    return _vs_format_peer(
        work, {"fmt": "tar", "modality": "images", "samples": 12000 * scale, "image_width": 160, "image_height": 120,
               "shard": "4MiB"},
        "webdataset", "tar images, no decode, {state}: iobench W={workers} vs webdataset.WebDataset (1 process)",
        "{samples} JPEGs ({mib:.0f} MiB) in {shards} shards; iobench delivers batches of 64 image byte strings "
        "(labels included), webdataset yields one dict per sample; torch is not installed, so the peer runs without "
        "DataLoader workers", 1.5, workers=(1,), batch=64)


def bench_parquet(work: Path, scale: float) -> list[dict]:
    return _vs_format_peer(
        work, {"fmt": "parquet", "modality": "tokens", "samples": 524288 * scale, "shard": "64MiB"},
        "pyarrow", "parquet tokens, {state}: iobench W={workers} vs pyarrow ParquetFile.iter_batches (1 process)",
        "{samples} samples of 512 uint16 tokens ({mib:.0f} MiB of Parquet: no compression, Parquet keeps uint16 as "
        "INT32) in {shards} shards; the peer only decodes Arrow batches, iobench also shuffles (the default buffer of "
        "1000 samples per worker), collates 256-sample 2-D token batches into shared memory and hands them over", 1.0)


def bench_tfrecord(work: Path, scale: float) -> list[dict]:
    return _vs_format_peer(
        work, {"fmt": "tfrecord", "modality": "tokens", "samples": 65536 * scale, "shard": "8MiB"},
        "tfrecord", "tfrecord tokens, {state}: iobench W={workers} vs tfrecord.reader.tfrecord_loader (1 process)",
        "{samples} samples ({mib:.0f} MiB) in {shards} shards; iobench checks both CRCs of every record, the peer "
        "checks none", 1.0)


def bench_memory(work: Path, scale: float) -> list[dict]:
    """Peak USS summed over the loader's processes, and its drift across epochs."""
    url = "memory://bench-mem/tok"
    dataset(url, 65536 * scale, "4MiB")
    Q, B, E = 4, 256, 4
    m = run_load(LoadConfig(dataset=url, access="block", workers=2, prefetch=Q, batch_size=B, epochs=E, compute="1ms",
                            shuffle_buffer=8192, monitor_interval_s=0.1)).metrics
    sysm, steps_t = m["system"], m["series"]["t_s"]
    bounds = [steps_t[i * (len(steps_t) // E)] for i in range(E)] + [float("inf")]
    peaks = [max((s["uss_bytes"] for s in sysm["series"] if bounds[e] <= s["t_s"] < bounds[e + 1]
                  and s["processes_alive"] == sysm["processes"]), default=None) for e in range(E)]
    limit = 256 * MiB + 2 * Q * m["batch_bytes"]
    peak, first, last = sysm["peak_uss_bytes"], peaks[0], peaks[-1]
    drift = (last - first) / first if first and last else None
    from fsspec.implementations.memory import MemoryFileSystem
    MemoryFileSystem.store.clear()
    return [{**row("memory: peak USS of all loader processes (W=2, Q=4, batch 256 x 1 KiB)", "peak_uss_bytes",
                   {"peak_uss_bytes": peak, "per_epoch_peak_uss_bytes": peaks, "processes": sysm["processes"]},
                   {"limit_bytes": limit, "what": "256 MiB + 2 x Q x batch bytes"}, peak / limit if peak else None,
                   "<= 1.0; last epoch's peak at most 5% above the first's",
                   "the parent holds the memory:// dataset itself (64 MiB); USS counts each process's own pages, "
                   "sampled every 0.1 s while all processes are alive (a worker's exit moves pages it shared "
                   "into the parent's USS)"),
             "met": bool(peak and peak <= limit and drift is not None and drift <= 0.05),
             "drift_last_vs_first_epoch": drift, "peak_pss_bytes": sysm["peak_pss_bytes"]}]


SECTIONS = {"overhead": bench_overhead, "access": bench_access, "fio": bench_fio, "s3": bench_s3, "tar": bench_tar,
            "parquet": bench_parquet, "tfrecord": bench_tfrecord, "memory": bench_memory}


def to_markdown(results: list[dict], meta: dict) -> str:
    def fmt(v, metric: str) -> str:
        if v is None:
            return "—"
        if "bytes" in metric:
            return f"{v / MiB:,.1f} MiB" + ("/s" if metric.endswith("_per_s") else "")
        return f"{v:.2%}" if metric == "accelerator_utilization" else f"{v:,.0f}"

    def cells(r: dict) -> list:
        if "skipped" in r:
            return [r["section"], f"skipped: {r['skipped']}", "", "", "", "", ""]
        metric, peer = r["metric"], r["peer"] or {}
        pv = peer.get(metric) if peer.get(metric) is not None else peer.get("limit_bytes")
        return [r["section"], metric, fmt(r["iobench"].get(metric), metric), fmt(pv, metric),
                "—" if r.get("ratio") is None else f"{r['ratio']:.2f}", r["target"], yes_no(r["met"])]
    return "\n".join([
        *header("Loader vs peers (reference run)", meta), *updates(meta),
        "Ratios are iobench / peer, measured in the same run on the same bytes: the median of the "
        f"per-round ratios of {REPEATS} alternating rounds (rows measured before 2026-11-30 22:00 UTC: "
        "best of each side instead).", "",
        *table(["comparison", "metric", "iobench", "peer", "ratio", "target", "met"], [cells(r) for r in results]),
        "", *row_notes(results)]) + "\n"


# How rows written before rows carried their section key begin (for --merge).
_LEGACY_PREFIX = {"s3": "S3", "fio": "raw tokens", "tar": "tar images", "parquet": "parquet tokens",
                  "tfrecord": "tfrecord tokens", "memory": "memory:", "overhead": "overhead:"}


def main(argv=None) -> int:
    ap = parser(__doc__, "reports/reference/load")
    sections_option(ap, SECTIONS)
    ap.add_argument("--scale", type=float, default=1.0, help="dataset size multiplier")
    ap.add_argument("--replay", metavar="RUN.json",
                    help="run nothing: take the rows of an earlier run's OUT.json (with --merge, into OUT), "
                         "so a branch's measured sections land on a report that moved on meanwhile")
    # internal: run one peer process, {"s3" | "file": its arguments} as JSON
    ap.add_argument("--peer", type=json.loads, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer:
        [(kind, kw)] = args.peer.items()
        if kind == "file":
            file_peer_main(**kw)
            return 0
        s3_peer_main(**kw)
        sys.stdout.flush()
        # Skip interpreter finalisation: obstore's runtime, torn down with asyncio's loop there,
        # sometimes aborts the process after the measurement is printed.
        os._exit(0)
    if args.replay:
        earlier = json.loads(Path(args.replay).read_text())
        meta, results = earlier["meta"], earlier["results"]
    else:
        t0 = time.perf_counter()
        with scratch("load", args.work) as work:
            results = run_sections(SECTIONS, args.sections, work, args.scale)
        meta = {"command": command("bench_load.py", argv), "machine": machine(), "seconds": time.perf_counter() - t0}
    return write_results(args.out, meta, results, args.merge, to_markdown, "load", _LEGACY_PREFIX)


if __name__ == "__main__":
    sys.exit(main())
