"""In-process loading (``--workers 0``), ``--access memmap`` and ``iobench.watch``, against peers.

    .venv/bin/python benchmarks/bench_inprocess.py [--sections w0,memmap,watch] [--out reports/reference/inprocess]
                                                   [--scale 1.0] [--rounds 7] [--work DIR] [--torch-python PY]

- ``w0``: raw token shards (1 GiB, 8 MiB shards, 1 KiB samples) read by ``iobench load --workers 0``
  (block access: each shard read whole and shuffled into batches, in the consumer process) against
  fio on the same files: warm (page cache, ``--block-read mmap``, fio ``--invalidate=0`` after a
  pre-read; target 0.7; the ``--block-read read`` designs beside it as diagnostics) and
  cold (iobench ``--odirect`` vs fio ``--direct=1``; target 0.9).  fio, its job layout and the row
  format are ``bench_load.py``'s (imported, not copied).
- ``memmap``: ``iobench load --access memmap --workers 0`` against a nanoGPT-style ``get_batch``
  loop on the same shard files (target 1.0): each shard an ``np.memmap`` (made once, as Megatron's
  reader does; nanoGPT remakes it per call, which only costs the peer more), random windows of
  ``seq_len`` tokens, ``np.stack`` into a batch.  Warm (target) and cold (diagnostic: device bytes and
  read amplification of both, as each reads the pages it faults).
- ``watch``: ground truth on a kernel-throttled disk (``iobench.throttle.ReadThrottle``, cold cache
  before every run): a real torch DataLoader (map-style Dataset, one pread per sample) run unchanged
  under ``iobench measure`` (so ``iobench.watch`` wraps it), ``iobench load --access map`` on the same
  bytes, and the bandwidth truth 1 - step time / (device bytes per step / bandwidth).  Targets: watch
  within 2 pp of load, both within 3 pp of the truth.

Ratios are iobench / peer from alternating rounds (sides swap order every round), the median of
the per-round ratios; the machine is shared, so the load average is recorded with every row.
Writes OUT.json, OUT.rows.json (for ``benchmarks/summary.py``) and OUT.md.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import replace
from itertools import count
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_load
from bench_load import SHARD, MiB, _fio, _gather_loop, load_rate, raw_tokens
from harness import (REF, alternating, command, dataset, fixed_records, header, machine, median, median_run, num,
                     paired_row, parser, read_throttle, run_sections, scratch, sections_option, set_cache, skipped, table,
                     updates, write_results, yes_no)

from iobench.loader.core import LoadConfig, run_load
from iobench.schema import STALL_RATIO

def _with_load(run: dict) -> dict:
    """A round's result with the 1-minute load average after it (the host is shared)."""
    return run | {"load_avg": round(os.getloadavg()[0], 2)}


def _load_avgs(*sides: list[dict]) -> list[float]:
    return [x["load_avg"] for runs in sides for x in runs]


def bench_w0(work: Path, a) -> list[dict]:
    if not shutil.which("fio"):
        return skipped("w0", "fio not installed")
    url, m, files = raw_tokens(work, a.scale)
    fixed = fixed_records(m)
    out = []
    for state, batch in (("warm", 256), ("warm", 1024), ("cold", 256)):
        # cold: --read-ahead 1, the next shard's O_DIRECT pread on a thread of this process while the
        # consumer gathers this one's batches (device time hidden) -- still no worker process.
        # warm: --block-read mmap, one thread as torch num_workers=0: each shard mapped and its batches
        # gathered from the page cache (one copy of each byte, not a read's copy and then a gather);
        # the read designs run beside it (NOTE [ Block buffers ]: which is cheaper depends on the caches).
        cfg = LoadConfig(dataset=url, access="block", workers=0, batch_size=batch, shuffle_buffer=8192,
                         monitor_interval_s=1.0, read_ahead=int(state == "cold"), cache=state,
                         odirect=state == "cold", s3_block_size=f"{SHARD}B",
                         block_read="mmap" if state == "warm" else "read")

        def fio_round(state=state) -> dict:
            set_cache(files, state)
            return _with_load(_fio(files, SHARD, 1, direct=(state == "cold")))
        # warm: the one-process floor of the mapped design, and the read designs, after each round's pair
        others = {"floor": lambda r, batch=batch: _gather_loop(files, fixed, batch, seed=r, mapped=True),
                  **{ra: lambda r, ra=ra, cfg=cfg: _with_load(load_rate(replace(cfg, block_read="read", read_ahead=ra)))
                     for ra in (0, 1)}}
        runs = alternating(a.rounds, {"iobench": lambda cfg=cfg: _with_load(load_rate(cfg)), "peer": fio_round},
                           others if state == "warm" else None)
        iob, peer = runs["iobench"], runs["peer"]
        row = paired_row(
            f"raw tokens, {state}, batch {batch} x 1 KiB: iobench W=0 vs fio 1 job" +
            (" --direct=1" if state == "cold" else " --invalidate=0 after pre-read"),
            iob, peer, "bytes_per_s", 0.7 if state == "warm" else 0.9,
            f"{len(files)} shards of {SHARD // MiB} MiB; iobench --workers 0 --access block: the consumer process "
            "reads each shard and gathers every shuffled batch itself -- no worker process, no hand-off " +
            ("(warm, --block-read mmap: each shard mapped with MAP_POPULATE and its batches gathered from the page "
             "cache, one thread; NOTE [ Block buffers ] in docs/design.md)" if state == "warm" else
             "(cold, --odirect --read-ahead 1: O_DIRECT preads of the shard size on a read-ahead thread while the "
             "consumer gathers the previous shard's batches)") +
            "; fio reads the same files, one shard-sized request each, and drops the bytes")
        row["bytes_checked"] = {"iobench_bytes_read": median_run(iob, "bytes_per_s").get("bytes_read"),
                                "fio_bytes_read": median_run(peer, "bytes_per_s").get("bytes_read")}
        row["load_avg"] = _load_avgs(iob, peer)
        out.append(row)
        if state == "warm":
            out.append(paired_row(
                f"raw tokens, {state}, batch {batch} x 1 KiB: iobench W=0 vs one-process map + shuffled gather",
                iob, runs["floor"], "bytes_per_s", None,
                "diagnostic, no target: bench_load's _gather_loop mapped=True -- each shard mapped with MAP_POPULATE "
                "and every batch gathered from the page cache, in one process, one thread, nothing else -- the "
                "least work of this design; iobench W=0 adds the per-step bookkeeping"))
            for ra in (0, 1):
                out.append(paired_row(
                    f"raw tokens, {state}, batch {batch} x 1 KiB: iobench W=0 --block-read read" +
                    (" --read-ahead 1" if ra else "") + " vs fio 1 job --invalidate=0 after pre-read",
                    runs[ra], peer, "bytes_per_s", None,
                    "diagnostic, no target: " + (
                        "each shard read with one preadv into a reused huge-page buffer, then its batches gathered "
                        "(a read's copy, then the gather's)" if not ra else
                        "the same with the next shard read on a read-ahead thread while this one's batches are "
                        "gathered (two cores; every gather then reads rows the other core wrote)")))
                out[-1]["load_avg"] = _load_avgs(runs[ra])
    return out


def _nanogpt_loop(files: list[str], fixed, batch: int, batches: int, seed: int) -> dict:
    """nanoGPT's ``get_batch`` on these shards: random windows of seq_len tokens stacked into a batch
    (without the int64 cast, the shifted targets and the device copy it adds: the peer's cheapest form)."""
    off0, rec, dtype = fixed
    seq = rec // dtype.itemsize
    maps = [np.memmap(f, dtype=dtype, mode="r", offset=off0) for f in files]
    lens = np.array([len(x) for x in maps])
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter_ns()
    n = 0
    for _ in range(batches):
        s = rng.integers(len(maps), size=batch)
        ix = (rng.random(batch) * (lens[s] - seq)).astype(np.int64)
        x = np.stack([maps[a][i:i + seq] for a, i in zip(s.tolist(), ix.tolist())])
        n += x.nbytes
    t = (time.perf_counter_ns() - t0) / 1e9
    del maps
    return {"bytes_per_s": n / t, "bytes": n, "wall_s": t, "batch": batch}


def bench_memmap(work: Path, a) -> list[dict]:
    from iobench.blockdev import DeviceCounter

    url, m, files = raw_tokens(work, a.scale)
    fixed = fixed_records(m)
    batch = 256
    batches = m.total_samples // batch
    out = []
    for state in ("warm", "cold"):
        cfg = LoadConfig(dataset=url, access="memmap", workers=0, batch_size=batch, monitor_interval_s=1.0,
                         cache=state, steps=batches)

        def ours(cfg=cfg) -> dict:
            res = run_load(cfg)
            mm = res.metrics
            return _with_load({"bytes_per_s": mm["throughput"]["bytes_per_s"], "bytes_read": mm["bytes_read"],
                               "device_io": mm["device_io"], "faults": mm["requests"],
                               "residency": res.environment["cache"].get("measured_residency")})

        seeds = count()   # the round

        def theirs(state=state, seeds=seeds) -> dict:
            set_cache(files, state)
            dc = DeviceCounter(files[0])
            p = _nanogpt_loop(files, fixed, batch, batches, seed=next(seeds))
            p["device_io"] = dc.stop(p["bytes"], p["bytes"])
            return _with_load(p)

        runs = alternating(a.rounds if state == "warm" else max(3, a.rounds // 2), {"iobench": ours, "peer": theirs})
        iob, peer = runs["iobench"], runs["peer"]
        row = paired_row(
            f"raw tokens, {state}, batch {batch} x 1 KiB: iobench --access memmap W=0 vs nanoGPT-style get_batch "
            "(np.memmap windows + np.stack)", iob, peer, "bytes_per_s", 1.0 if state == "warm" else None,
            f"{len(files)} shards of {SHARD // MiB} MiB, {batches} batches a side; iobench: map's order (every sample "
            "once), each shard mapped once, one gather of a batch's rows from the mappings; peer: random windows "
            "(any token offset) from per-shard np.memmap views, np.stack per batch, one process" +
            ("" if state == "warm" else "; diagnostic, no target: cold pages come in by page faults and the "
             "kernel's read-around, and the device_io blocks say how much each side read"))
        row["read_amplification"] = {k: [(x.get("device_io") or {}).get("read_amplification") for x in v]
                                     for k, v in (("iobench", iob), ("peer", peer))}
        row["load_avg"] = _load_avgs(iob, peer)
        out.append(row)
    return out


# -- watch: a real torch DataLoader under `iobench measure`, on a kernel-throttled disk ---------------

_PEER = '''
import bisect, json, os, sys, time
import numpy as np, torch
from torch.utils.data import DataLoader, Dataset, Sampler
spec = json.loads(sys.argv[1])
class Shards(Dataset):
    def __init__(self):
        self.paths = [s["path"] for s in spec["shards"]]
        self.first = [s["first_sample"] for s in spec["shards"]]
        self.fds = {}
    def __len__(self):
        return sum(s["samples"] for s in spec["shards"])
    def __getitem__(self, i):
        s = bisect.bisect_right(self.first, i) - 1
        fd = self.fds.get(s)
        if fd is None:
            fd = self.fds[s] = os.open(self.paths[s], os.O_RDONLY)
        b = os.pread(fd, spec["sample_bytes"], spec["header"] + (i - self.first[s]) * spec["sample_bytes"])
        return torch.from_numpy(np.frombuffer(b, dtype="<u2").copy())
class Order(Sampler):
    def __iter__(self):
        return iter(spec["indices"])
    def __len__(self):
        return len(spec["indices"])
dl = DataLoader(Shards(), batch_size=spec["batch"], sampler=Order(), num_workers=spec["workers"],
                prefetch_factor=spec["prefetch"])
for k, batch in enumerate(dl):
    time.sleep(spec["compute_s"])
    if k + 1 == spec["steps"]:
        break
'''


def _pp(pairs) -> tuple[float | None, list[float]]:
    """Median of the per-round |a - b| in percentage points (each round's pair is the comparison)."""
    d = sorted(abs(a - b) * 100 for a, b in pairs if a is not None and b is not None)
    return (d[len(d) // 2] if d else None), d


def bench_watch(work: Path, a) -> list[dict]:
    from iobench.cli import main as measure
    from iobench.loader.sampler import delivery_order

    if not a.torch_python or not os.path.exists(a.torch_python):
        return skipped("watch", "no torch interpreter (--torch-python)")
    # bench_fidelity's throttled map case: 64 KiB samples (one pread each), 16-sample (1 MiB) batches,
    # 50 MiB/s cap (20 ms of transfer a batch), 14 ms compute, W=2 Q=2
    url = str(work / "raw64k")
    W, Q, batch, steps, compute_s, bw = 2, 2, 16, 64, 0.014, 50 * MiB
    man, paths = dataset(url, 32 * 80, "32 samples", seq_len=32768, vocab_size=50000, fsync=True)
    thr, why = read_throttle(url, bw, "bench-watch")
    if thr is None:
        return skipped("watch", why)
    cfg = LoadConfig(dataset=url, workers=W, prefetch=Q, batch_size=batch, steps=steps, cache="cold", seed=1,
                     compute=f"{compute_s * 1000:.3f}ms", monitor_interval_s=1.0, access="map")
    order = delivery_order("map", [s.samples for s in man.shards], batch, cfg.seed, 0)[:steps * batch]
    spec = {"shards": [{"path": p, "first_sample": s.first_sample, "samples": s.samples}
                       for p, s in zip(paths, man.shards)], "sample_bytes": 32768 * 2, "header": 64,
            "indices": order.tolist(), "batch": batch, "workers": W, "prefetch": Q, "steps": steps,
            "compute_s": compute_s}
    script = work / "torch_peer.py"
    script.write_text(_PEER)

    def truth(m: dict) -> float | None:
        """1 - step compute / (device bytes per step / bandwidth), over the steady window's compute."""
        d = (m.get("device_io") or {}).get("device_bytes_read")
        if not d:
            return None
        per_step = d / m["steps"] / bw
        c = m["compute_s"]["mean"]
        return max(0.0, 1 - c / per_step) if per_step > c else 0.0

    def stall(mm: dict, **extra) -> dict:
        return _with_load({STALL_RATIO: mm[STALL_RATIO], "truth": truth(mm), "device_io": mm["device_io"]}) | extra

    def ours() -> dict:
        with thr:
            return stall(run_load(cfg).metrics)

    rounds = count()

    def theirs() -> dict:
        set_cache(paths, "cold")
        out = work / f"watch-{next(rounds)}.json"
        with thr:
            # the peer runs unchanged; `iobench measure` wraps its DataLoader in iobench.watch
            rc = measure(["measure", "--json", str(out), "--path", url, "--", a.torch_python, str(script),
                          json.dumps(spec)])
        if rc != 0:
            raise RuntimeError(f"iobench measure of the torch peer exited {rc}")
        mm = json.loads(out.read_text())["metrics"]
        return stall(mm, steps=mm["steps"])

    runs = alternating(a.rounds, {"iobench": ours, "peer": theirs})
    iob, peer = runs["iobench"], runs["peer"]
    lw, li = median(peer, STALL_RATIO), median(iob, STALL_RATIO)
    setup = (f"{bw // MiB} MiB/s read cap (cgroup), cold cache every run, {steps} steps of {batch} x 64 KiB, W={W} "
             f"Q={Q}, {compute_s * 1000:.0f} ms compute, the same sample order on both sides; 'ratio' is the median "
             "over rounds of |a - b| in percentage points")
    truth_note = ("truth = 1 - mean step compute / (device bytes per step / bandwidth), each run against its own "
                  "compute and device bytes (read-ahead included)")
    rows = []
    for name, pairs, target, note in (
            ("watch around a torch DataLoader vs iobench load --access map, throttled disk (pp)",
             [(w[STALL_RATIO], i[STALL_RATIO]) for w, i in zip(peer, iob)], 2, setup),
            ("watch stall vs the bandwidth truth, throttled disk (pp)",
             [(w[STALL_RATIO], w["truth"]) for w in peer], 3, truth_note + "; watch's runs"),
            ("iobench load --access map stall vs the bandwidth truth, throttled disk (pp)",
             [(i[STALL_RATIO], i["truth"]) for i in iob], 3, truth_note + "; iobench load's runs")):
        v, d = _pp(pairs)
        rows.append({"section": name, "metric": "percentage points", "iobench": {STALL_RATIO: lw},
                     "peer": {STALL_RATIO: li}, "ratio": v, "target": f"<= {target}", "direction": "<=",
                     "met": v is not None and v <= target, "note": note,
                     "rounds": {"per_round_ratios": d, "iobench_load": iob, "watch": peer},
                     "load_avg": _load_avgs(iob, peer)})
    return rows


SECTIONS = {"w0": bench_w0, "memmap": bench_memmap, "watch": bench_watch}


def _cells(r: dict) -> list:
    if "skipped" in r:
        return [r["section"], f"skipped: {r['skipped']}", "", "", "", ""]
    rr = (r.get("rounds") or {}).get("per_round_ratios")
    la = r.get("load_avg") or []
    return [r["section"], num(r.get("ratio")), ", ".join(f"{x:.2f}" for x in rr or []), r.get("target"),
            yes_no(r.get("met")), f"{min(la):.1f}-{max(la):.1f}" if la else ""]


def to_markdown(results: list[dict], meta: dict) -> str:
    lines = [*header("In-process loading, memmap access and iobench.watch vs peers (reference run)", meta),
             f"{meta['rounds']} alternating rounds per row (cold memmap: fewer); load average {meta['load_avg_end']:.1f} "
             "at the end.", "", *updates(meta, "Those rows come from the rerun (their load averages are in the last column)."),
             *table(["comparison", "ratio", "per-round ratios", "target", "met", "load avg (min-max)"],
                   [_cells(r) for r in results]), "", "Notes:", ""]
    for r in results:
        if r.get("note"):
            lines.append(f"- {r['section']}: {r['note']}")
        if r.get("read_amplification"):
            lines.append("  - read amplification (device bytes / bytes asked for), " + "; ".join(
                f"{side}: {', '.join(f'{x:.2f}' for x in v if x is not None)}"
                for side, v in r["read_amplification"].items()))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = parser(__doc__, str(REF / "inprocess"))
    sections_option(ap, SECTIONS)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=bench_load.FIO_ROUNDS)
    ap.add_argument("--torch-python", default=os.environ.get("IOBENCH_TORCH_PYTHON", "/work/venvs/torch/bin/python"))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    la0 = os.getloadavg()[0]
    at_start = machine()   # its load average is the start's, as the header says
    with scratch("inproc", args.work) as work:
        results = run_sections(SECTIONS, args.sections, work, args)
    meta = {"command": command("bench_inprocess.py", argv), "machine": at_start, "seconds": time.perf_counter() - t0,
            "rounds": args.rounds, "load_avg_start": la0, "load_avg_end": os.getloadavg()[0]}
    return write_results(args.out, meta, results, args.merge, to_markdown, "load")


if __name__ == "__main__":
    sys.exit(main())
