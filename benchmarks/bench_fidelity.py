"""Loader fidelity: iobench's stall against ground truth three ways, on the same bytes, in one run.

    .venv/bin/python benchmarks/bench_fidelity.py [--sections grid,throttled,fio,wds] [--quick]
                                                  [--out reports/reference/fidelity] [--venv DIR]

- ``grid``: the discrete-event model (iobench.planner.loader_sim) replays each real run on
  emulated storage: pattern × W {1,2,4} × Q {1,2,4} × storage {const, lognormal, spike, bw}
  × compute {const, normal}; measured − predicted (target within 2 pp).
- ``throttled``: the kernel caps reads of the dataset's disk (cgroup blkio / io.max,
  iobench.throttle) for iobench and for the peers alike, cold cache before every run:
  iobench ``--access map`` vs a torch DataLoader (map-style Dataset, one ranged read per
  sample, ``num_workers`` W, ``prefetch_factor`` Q) on raw token shards, and iobench
  ``--access stream`` vs a webdataset pipeline on tar shards; alternating rounds, median;
  iobench stall − peer stall (target within 3 pp), the bandwidth formula, and the device
  bytes each read (read-ahead amplification).
- ``fio``: map-style small random reads vs ``fio --rw=randread`` at the same request size
  and queue depth (target ≥ 0.8x).
- ``wds``: stream-mode tar vs webdataset, samples/s over the whole process's wall time
  (imports and start-up included), 10k+ samples (target ≥ 1.5x).

The peers run in a benchmark-only venv (``--venv``, default ``benchmarks/.venv-torch``,
git-ignored), created on first use with ``pip install torch==2.13.0 webdataset``; torch is
never installed into the project's venv.  Absolute times on a shared machine are noise:
compare within a row; the load average is recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import replace
from math import nan
from pathlib import Path

from iobench.blockdev import device_of, diskstats_read_bytes, own_cgroup
from iobench.loader import fidelity
from iobench.loader.core import LoadConfig, run_load
from iobench.loader.sampler import delivery_order
from iobench.loader.stability import steady_window, window_stall
from iobench.planner.loader_sim import bandwidth_stall, consumer_busy_s
from iobench.schema import STALL_RATIO

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import (MiB, alternating, bench_venv, command, dataset, fio, iobench_exe, loadavg, machine,  # noqa: E402
                     machine_line, median, notes, parser, read_throttle, run_json, run_sections, scratch, sections_option, set_cache,
                     skipped, table, timed, whole_process, write_report, write_results)
from harness import row as result_row  # noqa: E402  (benchmarks/ is not a package)


# ------------------------------------------------------------------ the peers (their own venv)

def run_peer(py: str, spec: dict) -> dict:
    return run_json([py, str(HERE / "fidelity_peers.py"), json.dumps(spec)], f"peer {spec['kind']}", timeout=600)


# ------------------------------------------------------------------ stall, computed one way for everyone

def stalls(wait: list[float], t_s: list[float], busy: list[float]) -> dict:
    """Stall with step 0 excluded (iobench's, MLPerf's) and steady-state stall over the loader's own
    steady window (``iobench.loader.stability.steady_window``: the head start drained), for iobench
    and the peers alike."""
    n = len(t_s) - 1
    steps = [t_s[k + 1] - t_s[k] for k in range(n)]
    first = sum(wait[1:n]) / sum(steps[1:]) if n > 1 and sum(steps[1:]) > 0 else None
    k0, k1, rule = steady_window(wait[:n])
    steady = window_stall(wait, steps, (k0, k1)) if k1 > k0 else None
    b = busy[k0:k1]
    return {STALL_RATIO: first, "steady_stall_ratio": steady, "steady_from_step": k0, "steady_to_step": k1,
            "steady_rule": rule, "steady_busy_s": sum(b) / len(b) if b else None}


def iobench_series(m: dict) -> dict:
    s = m["series"]
    return stalls(s["wait_s"], s["t_s"], consumer_busy_s(s))


def peer_series(p: dict) -> dict:
    return stalls(p["wait_s"], p["t_s"], p["compute_s"])


# ------------------------------------------------------------------ sections

def bench_grid(work: Path, quick: bool) -> list[dict]:
    url = str(work / "grid-tok")
    B, SEQ = 8, 512
    dataset(url, B * 64, f"{B} samples", seq_len=SEQ, vocab_size=1000)
    cells = fidelity.grid(patterns=fidelity.PATTERNS)
    if quick:
        cells = [c for c in cells if c.prefetch != 2 and c.workers != 2]
    rows = []
    for c in cells:
        def run(c=c) -> dict:
            return fidelity.run_cell(url, c, batch_size=B, shard_samples=B, sample_bytes=SEQ * 2, steps=24, compute_s=0.06)
        r = run()
        if abs(r["diff_pp"]) > 2.0:   # one re-run, as the test does: a descheduled process is not the loader
            r = {**run(), "first_try_diff_pp": r["diff_pp"]}
        print(f"[grid] {r['cell']}: measured {r['measured_stall']:.3f} predicted {r['predicted_stall']:.3f} "
              f"({r['diff_pp']:+.2f} pp)", flush=True)
        rows.append(r)
    return [{"section": "grid", "cells": rows, "within_2pp": sum(abs(r["diff_pp"]) <= 2 for r in rows),
             "total": len(rows), "max_abs_diff_pp": max(abs(r["diff_pp"]) for r in rows)}]


# (name, pattern, peer, read cap, batch, steps, compute s, sample bytes of the raw case)
# map: raw tokens, 64 KiB samples (one pread each), 16-sample (1 MiB) batches, 50 MiB/s cap (20 ms a
# batch), 14 ms compute; samples large enough that per-sample Python work (torch's __getitem__ and
# collate, on a loaded 2-core host) stays small beside the transfer.
# stream: tar tokens, 64 KiB samples, 32-sample (2 MiB) batches, 20 MiB/s cap (100 ms a batch), 60 ms
# compute (the formula's 40 %), shuffle buffer 32 samples per worker in both loaders.
THROTTLED = (("map: raw tokens, one 64 KiB ranged read per sample", "map", "torch-map", 50 * MiB, 16, 64, 0.014,
              32768 * 2, {"samples": 32 * 80, "shard": "32 samples"}),
             ("stream: tar tokens, shards in order", "stream", "wds-stream", 20 * MiB, 32, 100, 0.060, None,
              {"samples": 32 * 110, "shard": "8MiB", "fmt": "tar"}))


def bench_throttled(work: Path, quick: bool, py: str, cases: tuple[str, ...] = ("map", "stream")) -> list[dict]:
    rounds = 1 if quick else 3
    W, Q = 2, 2
    out = []
    for name, pattern, peer_kind, bw, batch, steps, compute_s, sample_bytes, gen in THROTTLED:
        if pattern not in cases:
            continue
        url = str(work / ("raw" if pattern == "map" else "tar"))
        man, paths = dataset(url, **gen, seq_len=32768, vocab_size=50000, fsync=True)
        batch_bytes = batch * (sample_bytes or man.total_bytes / man.total_samples)
        thr, why = read_throttle(url, bw, "bench")
        if thr is None:
            out += skipped(f"throttled {name}", why)
            continue
        cfg = LoadConfig(dataset=url, workers=W, prefetch=Q, batch_size=batch, steps=steps, cache="cold",
                         compute=f"{compute_s * 1000:.3f}ms", monitor_interval_s=1.0, seed=1, access=pattern,
                         **({"shuffle_buffer": 32} if pattern == "stream" else {}))
        peer_spec = {"kind": peer_kind, "batch": batch, "workers": W, "prefetch": Q, "steps": steps,
                     "compute_s": compute_s, "seed": 1}
        if peer_kind == "torch-map":
            # iobench's own sample order for this seed: the peer reads the same samples in the same
            # batches, and exactly ``steps`` of them (a RandomSampler over the whole dataset let its
            # workers read prefetch_factor x W batches past the last step, counted as its device bytes)
            order = delivery_order("map", [s.samples for s in man.shards], batch, cfg.seed, 0)[:steps * batch]
            peer_spec.update(shards=[{"path": p, "first_sample": s.first_sample, "samples": s.samples}
                                     for p, s in zip(paths, man.shards)], sample_bytes=sample_bytes, dtype="<u2",
                             indices=order.tolist())
        else:
            peer_spec.update(urls=paths, shuffle_buffer=32, key="npy")

        def finish(row: dict, who: str) -> dict:
            # the formula with the bytes this run's device really read per step (prefetch past the
            # last step, headers and read-ahead included): each side against its own bytes
            dbytes = (row["device_io"] or {}).get("device_bytes_read")
            row["steps_run"] = steps
            row["formula_stall_own_bytes"] = bandwidth_stall(row["steady_busy_s"], dbytes / steps, bw) \
                if dbytes and row.get("steady_busy_s") else None
            row["load_avg"] = os.getloadavg()[0]
            print(f"[throttled] {pattern} {who}: stall {row[STALL_RATIO]} steady {row['steady_stall_ratio']} "
                  f"amplification {(row['device_io'] or {}).get('read_amplification')}", flush=True)
            return row

        def iobench_side(cfg=cfg, thr=thr) -> dict:
            with thr:
                r = run_load(cfg)
            m = r.metrics
            return finish({"stall_ratio_reported": m[STALL_RATIO], **iobench_series(m), "device_io": m.get("device_io"),
                           "residency": r.environment["cache"].get("measured_residency"),
                           "samples_per_s": m["throughput"]["samples_per_s"]}, "iobench")

        def peer_side(thr=thr, paths=paths, peer_spec=peer_spec) -> dict:
            res = set_cache(paths, "cold")
            with thr:
                cg = own_cgroup()
                # counted inside the peer around its loop: importing torch reads its libraries too
                p = run_peer(py, {**peer_spec, "cgroup": [cg[0], cg[1], thr.device.devno] if cg else None})
            dev = {"device_bytes_read": p["device_bytes_read"], "requested_bytes": p["bytes"],
                   "read_amplification": p["device_bytes_read"] / p["bytes"]
                   if p.get("device_bytes_read") is not None and p["bytes"] else None,
                   "device_bytes_by_last_step": p.get("device_bytes_by_last_step")}
            return finish({**peer_series(p), "device_io": dev, "residency": res,
                           "samples_per_s": p["samples"] / p["wall_s"]}, "peer")

        iob, peer = alternating(rounds, {"iobench": iobench_side, "peer": peer_side}).values()

        def amp(rows):
            return statistics.median((r["device_io"] or {}).get("read_amplification") or 0 for r in rows)

        # each side's medians over the rounds (nan where no round had the value)
        med = {f"{side}_{name}": nan if (v := median(rows, key)) is None else v
               for side, rows in (("iobench", iob), ("peer", peer))
               for name, key in (("stall", STALL_RATIO), ("steady_stall", "steady_stall_ratio"),
                                 ("formula_own_bytes", "formula_stall_own_bytes"), ("busy", "steady_busy_s"))}
        out.append({
            "section": f"throttled {name}", "pattern": pattern, "peer": peer_kind, "bandwidth_bytes_per_s": bw,
            "batch_bytes": batch_bytes, "compute_s": compute_s, "workers": W, "prefetch": Q, "steps": steps,
            "rounds": rounds, **{k: v for k, v in med.items() if not k.endswith("_busy")},
            "diff_pp": 100 * (med["iobench_stall"] - med["peer_stall"]),
            "steady_diff_pp": 100 * (med["iobench_steady_stall"] - med["peer_steady_stall"]),
            "formula_stall": bandwidth_stall(med["iobench_busy"], batch_bytes, bw),
            "formula_stall_amplified": bandwidth_stall(med["iobench_busy"], batch_bytes * amp(iob), bw),
            "formula_note": "1 - consumer time per step / (batch bytes / bandwidth); 'amplified': batch bytes x "
                            "iobench's read amplification",
            "iobench_read_amplification": amp(iob), "peer_read_amplification": amp(peer),
            "iobench_runs": iob, "peer_runs": peer})
    return out


def _pread_proc(paths, files, offs, length, bar, q) -> None:
    import numpy as np

    fds = [os.open(p, os.O_RDONLY) for p in paths]
    out = np.empty((64, length), dtype=np.uint8)
    preadv, n = os.preadv, len(offs)
    bar.wait()
    t0 = time.perf_counter()
    for i in range(n):
        preadv(fds[files[i]], (out[i & 63],), offs[i])
    q.put((t0, time.perf_counter(), n))


def map_worker_reads(man, batch: int, seed: int, steps: int, workers: int, first: int, length: int) -> list:
    """The (shard index, offset) of every record read by each of iobench's map workers, in its
    order: the domain models' sample order (``delivery_order``), batch k to worker k % W, each batch's
    reads grouped by shard as ``LocalFileSource.read_records`` makes them."""
    import numpy as np

    ids = delivery_order("map", [s.samples for s in man.shards], batch, seed, 0)[:steps * batch]
    starts = np.array([s.first_sample for s in man.shards], dtype=np.int64)
    out = []
    for w in range(workers):
        files: list[int] = []
        offs: list[int] = []
        for k in range(w, steps, workers):
            b = ids[k * batch:(k + 1) * batch]
            sh = np.searchsorted(starts, b, side="right") - 1
            o = np.argsort(sh, kind="stable")
            files += sh[o].tolist()
            offs += (first + (b - starts[sh])[o] * length).tolist()
        out.append((files, offs))
    return out


def fio_iolog(path: Path, paths: list[str], files: list[int], offs: list[int], length: int) -> Path:
    """A fio version-2 iolog that reads ``length`` bytes at each (paths[files[i]], offs[i]), in order
    (``fio --read_iolog``: no timestamps, so replayed as fast as the job goes)."""
    with open(path, "w") as f:
        f.write("fio version 2 iolog\n")
        f.writelines(f"{p} add\n" for p in paths)
        f.writelines(f"{p} open\n" for p in paths)
        f.writelines(f"{paths[i]} read {o} {length}\n" for i, o in zip(files, offs))
        f.writelines(f"{p} close\n" for p in paths)
    return path


def bare_pread_loop(paths: list[str], reads: list, length: int) -> float:
    """The least a Python map-style reader can do: one process per worker, each a bare loop of
    one os.preadv per record of ``reads`` (that worker's (shard indices, offsets): iobench's own
    reads, see ``map_worker_reads``), with no sampler, batches or hand-off; started together,
    timed inside the loops: reads over first start to last end."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    bar, q = ctx.Barrier(len(reads)), ctx.Queue()
    ps = [ctx.Process(target=_pread_proc, args=(paths, f, o, length, bar, q)) for f, o in reads]
    for p in ps:
        p.start()
    got = [q.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    return sum(n for _, _, n in got) / (max(b for _, b, _ in got) - min(a for a, _, _ in got))


def row(section: str, note: str, ours: list[float], peer: list[float], target: float | None = None, **extra) -> dict:
    """A 4 KiB-reads row from same-run rounds: the medians of each side, their ratio, the per-round ratios."""
    i, p = statistics.median(ours), statistics.median(peer)
    return result_row(section, "4 KiB reads per s", i, p, i / p, target, note, iobench_runs=ours, peer_runs=peer,
                      round_ratios=[x / y for x, y in zip(ours, peer)], **extra)


def bench_fio(work: Path, quick: bool) -> list[dict]:
    """Map-style 4 KiB random reads vs fio randread, same request size and queue depth; cold and warm cache."""
    if not shutil.which("fio"):
        return skipped("fio randread", "fio not installed (scripts/install-system-deps.sh)")
    url = str(work / "fio-raw")
    # 4 KiB samples in 64 MiB shards: 512 MiB, so cold random reads rarely meet a page read before
    man, paths = dataset(url, 131072, "64MiB", seq_len=2048, vocab_size=50000, fsync=True)
    dev = device_of(paths[0])
    W, batch = 2, 64
    out = []

    def device_kib(fn, reads: int):
        """fn()'s result and the device's KiB read per record read meanwhile (/proc/diskstats: the
        whole device, so another process's reads count too; None where unavailable)."""
        b0 = diskstats_read_bytes(dev) if dev else None
        r = fn()
        b1 = diskstats_read_bytes(dev) if dev else None
        return r, (b1 - b0) / 1024 / reads if None not in (b0, b1) else None

    for state in ("cold", "warm"):
        cold = state == "cold"
        steps = (100 if quick else 200) if cold else (200 if quick else 600)
        cfg = LoadConfig(dataset=url, access="map", workers=W, prefetch=2, batch_size=batch, steps=steps, cache=state,
                         monitor_interval_s=1.0, seed=3)
        # fio's default fadvise_hint tells the kernel the reads are random (POSIX_FADV_RANDOM), which turns the
        # disk's read-ahead off; a map-style Dataset (torch's, ours) does not, so a cold miss may pull more
        # than it asked for.  The cold target row compares at the same kernel policy (--fadvise_hint=0) and
        # on the very same reads: one fio job per loader worker replays that worker's reads (read_iolog:
        # its samples, in its order).  Random offsets were not the same reads: --blockalign=64 (random
        # 64-byte-aligned offsets, no random map) repeated ~4.7% of its reads, which the page cache then
        # served (0.95 device reads per read); --offset=64 with fio's random map takes the next free block
        # on a collision, an adjacent one that the kernel's read-ahead treats as sequential (8.5 KiB read
        # per 4 KiB); lfsr's sequence did so more (9.5 KiB).  Warm rows stay random (2 s, time-based).
        # The default-hint row is shown too.
        peers = {"same read-ahead": ["--fadvise_hint=0"] + (["--replay"] if cold else ["--blockalign=64"]),
                 "fio default (FADV_RANDOM)": []}
        iob: list[float] = []
        peer: dict[str, list[float]] = {k: [] for k in peers}
        kib: dict[str, list] = {"iobench": [], **{k: [] for k in peers}}
        lat: list[dict] = []
        # cold only, diagnostics in the same rounds: a bare Python pread loop (W processes making the
        # loader's own reads: the ceiling of one pread per sample from Python here) and iobench W=1 with
        # 2 reads in flight in its one worker (read_ahead=1: the same queue depth 2 from one process)
        bare: list[float] = []
        iob_t: list[float] = []
        cfg_t = replace(cfg, workers=1, read_ahead=W - 1)
        reads = map_worker_reads(man, batch, cfg.seed, steps, W, 64, 4096) if cold else []
        logs = [fio_iolog(work / f"fio-w{w}.iolog", paths, f, o, 4096) for w, (f, o) in enumerate(reads)]
        n = steps * batch
        # cold: the same number of reads as the loader made, from the same dropped cache (a time-based fio
        # run would go on reading a cache its own read-ahead has warmed); warm: 2 s of reads
        span = [f"--number_ios={n // W}"] if cold else ["--time_based", "--runtime=2"]
        for _round in range(1 if quick else 3):
            m, k = device_kib(lambda: run_load(cfg).metrics, n)
            iob.append(m["throughput"]["steady_samples_per_s"])
            kib["iobench"].append(k)
            rl = (m.get("read_latency_s") or {}).get("read") or {}
            lat.append({q: rl.get(q) for q in ("p50", "p90", "p99", "max")})
            if cold:
                iob_t.append(run_load(cfg_t).metrics["throughput"]["steady_samples_per_s"])
                set_cache(paths, "cold")
                bare.append(bare_pread_loop(paths, reads, 4096))
            for name, extra in peers.items():
                if cold:
                    set_cache(paths, "cold")
                args = ["--rw=randread", "--bs=4k", "--ioengine=psync", "--iodepth=1", f"--invalidate={int(cold)}"]
                if "--replay" in extra:   # one job per worker, each replaying that worker's reads
                    args += [x for x in extra if x != "--replay"]
                    args += [a for w, log in enumerate(logs) for a in (f"--name=w{w}", f"--read_iolog={log}")]
                else:
                    args += ["--name=randread", f"--numjobs={W}", *span, *extra,
                             "--filename=" + ":".join(p.replace(":", "\\:") for p in paths)]
                (_, job), k = device_kib(lambda args=args: fio(*args), n)
                peer[name].append(job["read"]["iops"])
                kib[name].append(k if cold else None)

        for name, extra in peers.items():
            how = ("--invalidate=1 --fadvise_hint=0, one job per loader worker replaying its reads with "
                   "--read_iolog: the same samples in the same order)" if "--replay" in extra else
                   f"{'--invalidate=1 --number_ios=' + str(n // W) if cold else '--invalidate=0'} {' '.join(extra)})")
            out.append(row(f"fio randread, {state} cache" + ("" if extra else f", {name}"),
                           f"{state} page cache; iobench --access map W={W} (one pread per 4 KiB sample, queue "
                           f"depth {W}; samples sit 64 bytes off page boundaries, so a cold one costs two pages) "
                           f"vs fio randread bs=4k psync numjobs={W} iodepth=1 (buffered, {how} over the same shard files",
                           iob, peer[name], 0.8 if cold and extra else None,
                           iobench_device_kib_per_read=median(kib["iobench"]) if cold else None,
                           peer_device_kib_per_read=median(kib[name]), iobench_read_latency_s=lat))
        if cold:
            fio_note = (f"fio bs=4k psync iodepth=1 --invalidate=1 --fadvise_hint=0, {W} jobs replaying the loader "
                        f"workers' reads (--read_iolog), the same rounds, the same cold shard files")
            out += [row("fio randread, cold cache: bare Python pread loop vs fio",
                        f"diagnostic, the ceiling of one pread per sample from Python here: {W} processes, each "
                        f"a bare loop of os.preadv over one iobench worker's own reads (the same samples, in "
                        f"the same order, grouped by shard per batch; queue depth {W}; no sampler, batches or "
                        f"hand-off), timed inside the loops, vs {fio_note}", bare, peer["same read-ahead"]),
                    row("fio randread, cold cache: iobench vs bare Python pread loop",
                        f"diagnostic: iobench --access map W={W} (the target row's loader) vs the bare loop above "
                        f"(the same reads, the same queue depth {W}): the loader's own per-sample cost", iob, bare),
                    row(f"fio randread, cold cache: iobench W=1 with {W} reads in flight vs fio",
                        f"iobench --access map W=1 --read-ahead {W - 1} (one worker keeps {W} of its batch's "
                        f"4 KiB preads in flight on threads: queue depth {W}) vs {fio_note}", iob_t,
                        peer["same read-ahead"])]
    return out


def bench_wds(work: Path, quick: bool, py: str) -> list[dict]:
    """Stream-mode tar vs webdataset: samples/s over the whole process (imports included), 1 worker, no compute."""
    url = str(work / "wds-tar")
    n = 12000 if quick else 24000
    _, paths = dataset(url, n, "8MiB", fmt="tar", vocab_size=50000)
    batch = 64
    steps = n // batch
    iob_cmd = [iobench_exe(), "load", url, "--access", "stream", "-W", "1", "-Q", "2", "--batch-size", str(batch),
               "--steps", str(steps), "--cache", "warm", "--no-progress"]
    spec = {"kind": "wds-stream", "urls": paths, "batch": batch, "workers": 0, "prefetch": 2, "steps": steps,
            "compute_s": 0.0, "shuffle_buffer": 1000, "key": "npy"}
    iob, peer = [], []
    for _round in range(1 if quick else 3):
        t, r, _ = whole_process(iob_cmd)
        if r.returncode != 0:
            return skipped("stream tar vs webdataset", f"iobench load failed: {r.stderr[-500:]}")
        iob.append(steps * batch / t)
        t, pr = timed(lambda: run_peer(py, spec))
        peer.append(pr["samples"] / t)
    i, p = statistics.median(iob), statistics.median(peer)
    return [result_row("stream tar vs webdataset", "samples/s, whole-process wall", i, p, i / p, 1.5,
                       f"{steps * batch} samples of 1 KiB tokens in tar shards, warm cache, one process each (iobench "
                       "-W 1: one worker process + consumer; webdataset in the consumer), shuffle buffer 1000, batch "
                       "64, no compute; wall time of the whole command, imports included",
                       iobench_runs=iob, peer_runs=peer)]


# ------------------------------------------------------------------ report

def verdicts(results: list[dict]) -> list[str]:
    """One line per section, the answer first."""
    out = []
    for r in results:
        if "skipped" in r:
            out.append(f"{r['section']}: skipped ({r['skipped']})")
        elif r["section"] == "grid":
            out.append(f"model vs loader: {r['within_2pp']}/{r['total']} grid cells within 2 pp "
                       f"(max {r['max_abs_diff_pp']:.2f} pp)")
        elif r["section"].startswith("throttled"):
            ok = abs(r["diff_pp"]) <= 3
            out.append(f"{r['pattern']} on a throttled disk: iobench − {r['peer']} = {r['diff_pp']:+.1f} pp "
                       f"(steady {r['steady_diff_pp']:+.1f} pp): {'within' if ok else 'NOT within'} 3 pp; iobench "
                       f"{r['iobench_steady_stall']:.1%} steady vs bandwidth formula {r['formula_stall']:.1%} "
                       f"(× read amplification {r['iobench_read_amplification']:.2f}: {r['formula_stall_amplified']:.1%})")
        else:
            tgt = f"target ≥ {r['target']}: {'met' if r['met'] else 'NOT met'}" if r.get("target") else "no target"
            out.append(f"{r['section']}: {r['ratio']:.2f}x ({tgt})")
    return out


def to_markdown(results: list[dict], meta: dict) -> str:
    m = meta["machine"]
    L = ["# Loader fidelity: iobench's stall against ground truth", "",
         f"Command: `{meta['command']}`  ", f"Machine: {machine_line(m)}; shared with ~8 agents' builds and tests (load "
         f"average {loadavg(m)} at start, {loadavg(meta['load_avg_at_end'])} at end). "
         f"Run took {meta['seconds']:.0f} s.", ""]
    L += ["Verdict:", ""] + [f"- {v}" for v in verdicts(results)] + [""]
    for u in meta.get("updates", []):
        L += [f"Rerun for sections {', '.join(u['sections'])}: `{u['command']}` (load average "
              f"{u['machine']['load_avg_at_start'][0]:.1f} at start, {u['load_avg_at_end'][0]:.1f} at end, "
              f"{u['seconds']:.0f} s); those results come from the rerun.", ""]
    for r in results:
        if "skipped" in r:
            L += [f"## {r['section']}", "", f"Skipped: {r['skipped']}", ""]
            continue
        if r["section"] == "grid":
            L += ["## Discrete-event model vs the real loader (emulated storage)", "",
                  f"{r['within_2pp']} of {r['total']} cells within 2 pp (max |diff| {r['max_abs_diff_pp']:.2f} pp). "
                  "The model (iobench.planner.loader_sim) replays each run's recorded per-batch worker times "
                  "and consumer times; batch I/O ≈ 1.25 × W × compute, split over the pattern's requests.", "",
                  *table(["cell", "emulate", "measured", "predicted", "diff (pp)"],
                         [[c["cell"], f"`{c['emulate']}`", f"{c['measured_stall']:.3f}", f"{c['predicted_stall']:.3f}",
                           f"{c['diff_pp']:+.2f}"] for c in r["cells"]]), ""]
        elif r["section"].startswith("throttled"):
            def own(side: str, r=r) -> str:
                f = r[f"{side}_formula_own_bytes"]
                return f"{side} {f:.3f} (measured − formula {100 * (r[f'{side}_steady_stall'] - f):+.1f} pp)"
            L += [f"## Kernel-throttled disk: {r['section'][10:]}", "",
                  f"cgroup read cap {r['bandwidth_bytes_per_s'] / MiB:.0f} MiB/s on the dataset's disk, cold cache "
                  f"before every run, W={r['workers']} Q={r['prefetch']}, batch {r['batch_bytes'] / 1024:.0f} KiB, "
                  f"compute {r['compute_s'] * 1000:.1f} ms, {r['steps']} steps, median of {r['rounds']} alternating "
                  f"rounds. Peer: {r['peer']}.", "",
                  *table(["", "iobench", "peer", "iobench − peer"], [
                      *([what, f"{r[f'iobench_{k}']:.3f}", f"{r[f'peer_{k}']:.3f}", f"{r[diff]:+.2f} pp"] for what, k, diff in (
                          ("stall (step 0 excluded)", "stall", "diff_pp"), ("steady-state stall", "steady_stall", "steady_diff_pp"))),
                      ["device bytes / requested bytes", f"{r['iobench_read_amplification']:.2f}",
                       f"{r['peer_read_amplification']:.2f}", ""]]), "",
                  f"Bandwidth formula ({r['formula_note']}): {r['formula_stall']:.3f} "
                  f"(amplified: {r['formula_stall_amplified']:.3f})."
                  + (" With the bytes each side's device really read per step (its DataLoader's workers stopped "
                     f"before the counter is read): {own('iobench')}, {own('peer')}."
                     if None not in (r.get("iobench_formula_own_bytes"), r.get("peer_formula_own_bytes")) else ""), ""]
        else:
            why = ("fio tells the kernel its reads are random, so it reads no more than asked" if "FADV_RANDOM" in
                   r["section"] else "a diagnostic beside the target row" if "cold cache:" in r["section"] else
                   "the harness's ceiling with the page cache in the way")
            extra = []
            if r.get("round_ratios"):
                extra += ["Per-round ratios: " + ", ".join(f"{x:.2f}" for x in r["round_ratios"]) + "."]
            if r.get("peer_device_kib_per_read") is not None:
                ik = r.get("iobench_device_kib_per_read")
                extra += ["Device KiB read per 4 KiB read (median over rounds, /proc/diskstats, the whole disk): "
                          + (f"iobench {ik:.2f}, " if ik is not None else "") + f"fio {r['peer_device_kib_per_read']:.2f}."]
            lat = [x for x in r.get("iobench_read_latency_s") or [] if x.get("p50") is not None]
            if lat and r.get("target"):
                extra += ["iobench's pread latency per round (p50 / p99 / max, µs): " + "; ".join(
                    f"{1e6 * x['p50']:.0f} / {1e6 * x['p99']:.0f} / {1e6 * x['max']:.0f}" for x in lat) + "."]
            L += [f"## {r['section']}", "", f"{r['note']}.", "",
                  f"iobench {r['iobench']:,.0f} vs peer {r['peer']:,.0f} {r['metric']}: ratio **{r['ratio']:.2f}** "
                  + (f"(target ≥ {r['target']}: {'met' if r['met'] else 'NOT met'})." if r["target"] else
                     f"(no target: {why})."), *(x for e in extra for x in ("", e)), ""]
    L += ["## Reading these numbers", "", notes("fidelity"), ""]
    return "\n".join(L) + "\n"


SECTIONS = ("grid", "throttled", "fio", "wds")


def main(argv=None) -> int:
    ap = parser(__doc__, "reports/reference/fidelity")
    sections_option(ap, SECTIONS)
    ap.add_argument("--quick", action="store_true", help="fewer cells, rounds and steps")
    ap.add_argument("--venv", default=str(HERE / ".venv-torch"), help="the peers' venv (created if missing)")
    ap.add_argument("--throttled", default="map,stream", help="the throttled section's patterns (map, stream)")
    ap.add_argument("--render", action="store_true", help="only rewrite OUT.md from OUT.json")
    args = ap.parse_args(argv)   # --work: scratch on the disk to throttle
    if args.render:
        d = json.loads(Path(args.out).with_suffix(".json").read_text())
        write_report(args.out, d, to_markdown(d["results"], d["meta"]))
        return 0
    meta = {"command": command("bench_fidelity.py", argv), "machine": machine()}
    t0 = time.perf_counter()
    py = bench_venv(Path(args.venv), "torch==2.13.0", "webdataset", "numpy") \
        if {"throttled", "wds"} & set(args.sections.split(",")) else None
    with scratch("fidelity", args.work) as work:
        results = run_sections({"grid": lambda: bench_grid(work, args.quick),
                                "throttled": lambda: bench_throttled(work, args.quick, py,
                                                                     tuple(args.throttled.split(","))),
                                "fio": lambda: bench_fio(work, args.quick),
                                "wds": lambda: bench_wds(work, args.quick, py)}, args.sections)
    meta["seconds"] = time.perf_counter() - t0
    meta["load_avg_at_end"] = os.getloadavg()
    return write_results(args.out, meta, results, args.merge, to_markdown)


if __name__ == "__main__":
    sys.exit(main())
