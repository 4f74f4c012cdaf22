"""Cluster runs under MPI on this machine: 1, 2 and 3 ranks doing the same total work.

  1. load: one dataset read by 1, 2 and 3 ranks (one worker each), alternating rounds.
     Ground truth: the merged samples and bytes equal the single-process run's, exactly.
     Reported: world throughput per world size as a ratio to 1 rank (median over rounds).
  2. aggregation overhead of the launch model in a ~10 s load on 3 ranks: the time rank 0
     spent in collectives after the last rank had arrived (transfer) plus the merge, as a
     share of the run's wall time.                                            target < 1 %
     The waits (ranks arriving late) are reported apart: they are launch skew, not overhead.
  3. the bounded barrier (Ibarrier + Test polling) vs MPI's blocking Barrier, 3 ranks.
  4. ckpt: one checkpoint (TP×PP×DP = 3, ZeRO-3) saved by 1 process holding all 3 ranks vs
     3 processes with one rank each; save time = max across ranks (MLPerf), bytes identical.

    python benchmarks/bench_mpi.py [--rounds 3] [--out reports/reference/mpi]

The machine is shared (2 cores): compare ratios, not absolute times; the load average is
printed with the results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from itertools import count
from pathlib import Path

from iobench.dist.mpirun import find_mpirun, run_ranks
from iobench.schema import STALL_RATIO

from harness import alternating, last_json, median, parser, ratios, scratch, table, write_report

PY = sys.executable


def iobench(*args):
    return [PY, "-m", "iobench.cli", *args]


def launch(n: int, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``argv`` on ``n`` ranks, checked; one rank is a single process, no launcher: the baseline the
    world numbers are compared with."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout) if n == 1 else \
        run_ranks(n, argv, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"command failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def metrics(n: int, out: Path, *args: str) -> dict:
    """``iobench ARGS --json OUT`` on ``n`` ranks: the merged results' metrics."""
    launch(n, iobench(*args, "--json", str(out)))
    return json.loads(out.read_text())["metrics"]


def bench_load(ds: str, tmp: Path, rounds: int) -> dict:
    def one(n: int) -> dict:
        m = metrics(n, tmp / f"load-{n}-{next(k)}.json", "load", ds, "--workers", "1", "--batch-size", "32",
                    "--prefetch", "2", "--cache", "cold")
        return {"samples": m["samples"], "bytes": m["bytes_read"], "wall_s": m["wall_s"],
                "bytes_per_s": m["throughput"]["bytes_per_s"], "samples_per_s": m["throughput"]["samples_per_s"],
                STALL_RATIO: m[STALL_RATIO]}
    k = count()   # alternate, so drift hits all sizes alike
    rows = alternating(rounds, {n: lambda n=n: one(n) for n in (1, 2, 3)})
    base = rows[1]
    same = all(r["samples"] == base[0]["samples"] and r["bytes"] == base[0]["bytes"] for v in rows.values() for r in v)
    return {"same_total_work": same, "samples": base[0]["samples"], "bytes": base[0]["bytes"], "per_world": {
        n: {"samples_per_s_median": median(v, "samples_per_s"), "wall_s_median": median(v, "wall_s"),
            "ratio_to_1_rank_median": ratios(v, base, "samples_per_s")["median"], "rounds": v} for n, v in rows.items()}}


def bench_overhead(ds: str, tmp: Path) -> dict:
    """A load of about 10 s on 3 ranks (emulated 40 ms steps); rank 0's collective time."""
    m = metrics(3, tmp / "overhead.json", "load", ds, "--workers", "1", "--batch-size", "8", "--compute", "40ms",
                "--epochs", "1", "--steps", "250")
    coll = m["world"]["collectives"]
    transfer = sum(v["transfer_s"] for v in coll.values())
    waits = sum(v["wait_s"] for v in coll.values())
    wall = m["wall_s"]
    return {"wall_s": wall, "steps": m["steps"], "transfer_and_merge_s": transfer, "waits_s": waits,
            "overhead_ratio": transfer / wall, "waits_ratio": waits / wall, "collectives": coll}


_BARRIER = r"""
import json, sys, time
from iobench.dist import detect_world
w = detect_world()
comm = w._comm
n = int(sys.argv[1])
for _ in range(50): comm.Barrier()
t0 = time.perf_counter()
for _ in range(n): comm.Barrier()
native = (time.perf_counter() - t0) / n
t0 = time.perf_counter()
for _ in range(n): w.barrier("bench")
ours = (time.perf_counter() - t0) / n
t0 = time.perf_counter()
for _ in range(n // 10): w.gather({"x": list(range(100))}, what="bench gather")
gather = (time.perf_counter() - t0) / (n // 10)
if w.rank == 0:
    print(json.dumps({"native_barrier_s": native, "bounded_barrier_s": ours, "gather_s": gather}))
"""


def bench_barrier(reps: int = 2000) -> dict:
    d = last_json(launch(3, [PY, "-c", _BARRIER, str(reps)], timeout=120).stdout)
    d["ratio_bounded_to_native"] = d["bounded_barrier_s"] / d["native_barrier_s"]
    return d


def bench_ckpt(tmp: Path, rounds: int) -> dict:
    k = count()

    def one(n: int) -> dict:
        i = next(k)
        dur = tmp / f"ck-{n}-{i}"
        ck = metrics(n, tmp / f"ck-{n}-{i}.json", "ckpt", "--params", "6e6", "--dp", "3", "--zero", "3", "--count", "3",
                     "--mode", "sync", "--durable", str(dur))["checkpoint"]
        row = {"bytes_per_save": ck["state"]["bytes_per_save"] if n == 1 else ck["bytes_per_save"],
               "save_s_p50": ck["local_write_s"]["p50"], "commit_latency_s_p50": ck["commit_latency_s"]["p50"]}
        if n != 1:
            row.update(commit_after_slowest_s_p50=ck["commit_after_slowest_rank_s"]["p50"],
                       durable_spread_s_p50=ck["durable_spread_s"]["p50"])
        # the restored checkpoint is the same on any number of processes
        row["restored_bytes"] = metrics(n, tmp / f"rs-{n}-{i}.json", "ckpt", "restore", "--durable",
                                        str(dur))["checkpoint"]["restore_bytes"]
        return row
    rows = alternating(rounds, {n: lambda n=n: one(n) for n in (1, 3)})
    same = all(len({r[key] for v in rows.values() for r in v}) == 1 for key in ("bytes_per_save", "restored_bytes"))
    ratio = ratios(rows[3], rows[1], "commit_latency_s_p50")["median"]
    return {"same_bytes": same, "rows": rows, "commit_latency_ratio_3_to_1_median": ratio}


def make_dataset(tmp: Path) -> str:
    ds = str(tmp / "ds")
    launch(1, iobench("gen", "--format", "raw", "--modality", "tokens", "--num-samples", "24000", "--shard-size",
                      "500 samples", "--seq-len", "512", "--out", ds, "--no-progress"))
    return ds


def render(r: dict) -> str:
    L = ["# MPI: world numbers vs one process, and what the launch model costs", "",
         f"`python benchmarks/bench_mpi.py --rounds {r['rounds']}` on {r['host']} "
         f"({os.cpu_count()} cores, shared), {r['mpi']}, load average before/after {r['loadavg_before']} / "
         f"{r['loadavg_after']}. Ratios over alternating rounds (medians); absolute times are noise here.", ""]
    ld = r["load"]
    L += ["## 1. Load: the same dataset on 1, 2, 3 ranks (1 worker each)", "",
          f"Merged samples and bytes equal the single-process run's exactly: **{ld['same_total_work']}** "
          f"({ld['samples']} samples, {ld['bytes']} bytes).", "",
          *table(["ranks", "world samples/s (median)", "ratio to 1 rank", "wall s (slowest rank)"],
                 [[n, f"{v['samples_per_s_median']:,.0f}", f"{v['ratio_to_1_rank_median']:.2f}", f"{v['wall_s_median']:.2f}"]
                  for n, v in ld["per_world"].items()]), "",
          "On 2 cores, more ranks add readers but compete for the same CPUs: the ratio says what this machine "
          "gives, not what a cluster would.", ""]
    o = r["overhead"]
    L += ["## 2. Aggregation overhead in a ~10 s run (3 ranks)", "",
          f"Wall {o['wall_s']:.2f} s, {o['steps']} steps. Transfers after every rank arrived + the merge: "
          f"{o['transfer_and_merge_s'] * 1e3:.1f} ms = **{o['overhead_ratio']:.3%}** of the run (target < 1 %). Waiting for "
          f"ranks to arrive: {o['waits_s'] * 1e3:.1f} ms ({o['waits_ratio']:.2%}; launch skew, reported apart).", ""]
    b = r["barrier"]
    L += ["## 3. Bounded barrier vs MPI_Barrier (3 ranks)", "",
          f"Ibarrier + Test polling {b['bounded_barrier_s'] * 1e6:.0f} µs vs Barrier {b['native_barrier_s'] * 1e6:.0f} µs "
          f"per call (ratio {b['ratio_bounded_to_native']:.2f}); a gather of a small dict {b['gather_s'] * 1e6:.0f} µs. "
          "The price of never hanging is this per collective; a command makes a handful.", ""]
    c = r["ckpt"]
    L += ["## 4. Checkpoint: 3 ranks' state saved by 1 process vs 3 processes", "",
          f"Same bytes per save and same restored bytes on both: **{c['same_bytes']}**. Commit latency (each save as long as its "
          f"slowest rank, MLPerf) 3 processes / 1 process, median: **{c['commit_latency_ratio_3_to_1_median']:.2f}**.", "",
          *table(["processes", "round", "bytes/save", "save p50 s (max over ranks)", "commit latency p50 s",
                  "commit after slowest rank p50 s"],
                 [[n, i, row["bytes_per_save"], f"{row['save_s_p50']:.3f}", f"{row['commit_latency_s_p50']:.3f}",
                   "" if row.get("commit_after_slowest_s_p50") is None else f"{row['commit_after_slowest_s_p50']:.4f}"]
                  for n, rows in c["rows"].items() for i, row in enumerate(rows)]), "",
          "With 3 processes the commit is a gather of every process's durable report and one manifest published by rank 0; "
          "'commit after slowest rank' is the time between the last rank's files being durable and that publish.", ""]
    return "\n".join(L) + "\n"


def main() -> int:
    ap = parser(__doc__, "reports/reference/mpi", scratch_flag=None)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    _, kind = find_mpirun()
    lib = subprocess.run([PY, "-c", "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"],
                         capture_output=True, text=True, check=False).stdout
    res: dict = {"rounds": args.rounds, "host": os.uname().nodename, "mpi": f"{kind} ({' '.join(lib.split()) or 'unknown'})",
                 "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    with scratch("mpi") as tmp:
        ds = make_dataset(tmp)
        t0 = time.perf_counter()
        res["load"] = bench_load(ds, tmp, args.rounds)
        res["overhead"] = bench_overhead(ds, tmp)
        res["barrier"] = bench_barrier()
        res["ckpt"] = bench_ckpt(tmp, args.rounds)
        res["bench_s"] = time.perf_counter() - t0
    res["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    write_report(args.out, res, render(res))
    ok = res["load"]["same_total_work"] and res["ckpt"]["same_bytes"] and res["overhead"]["overhead_ratio"] < 0.01
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
