"""What the kernel's read cap delivers, per read pattern: the premise of every bandwidth truth here.

    flock -w 1800 /work/heavy.lock .venv/bin/python benchmarks/bench_throttle_cap.py \
        [--rounds 2] [--seconds 3] [--out reports/reference/throttle_cap]

A truth of the form 1 - compute / (device bytes per step / cap) assumes the device reads at the cap
(cgroup blkio / io.max, iobench.throttle) whenever the loader keeps it busy.  fio keeps it busy: each
case runs one fio job (buffered psync reads of a cold 1 GiB file, ``--numjobs`` streams, each on its
own part) inside the cap's cgroup, while a thread samples the cgroup's device counter
(iobench.blockdev) every 10 ms; the same job without the cap, in the same round, says what the disk
itself gives now (it swings between runs here).  The row is the capped device rate, after the first
second (the cap lets a burst through at the start), over the lesser of the cap and the uncapped
rate; cases alternate between rounds, the median is shown.  No target: this says which truths need
the disk measured beside them (bench_front_door does).
Writes NAME.json, NAME.md and NAME.rows.json.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # benchmarks/ is not a package
from harness import (REF, MiB, alternating, fio, parser, read_throttle, refuse, run_line, run_meta, scratch, table,
                     write_report)
from summary import summary_row

FILE = 1024 * MiB
# (label, cap bytes/s, fio --rw, block size, streams)
CASES = [("random 4 KiB reads, 1 stream", 50 * MiB, "randread", "4k", 1),
         ("random 4 KiB reads, 2 streams", 50 * MiB, "randread", "4k", 2),
         ("sequential 64 KiB reads, 1 stream", 50 * MiB, "read", "64k", 1),
         ("sequential 1 MiB reads, 1 stream", 50 * MiB, "read", "1m", 1),
         ("sequential 1 MiB reads, 4 streams", 100 * 10**6, "read", "1m", 4),
         ("sequential 4 MiB reads, 4 streams", 100 * 10**6, "read", "4m", 4)]


def device_rate(path: Path, thr, rw: str, bs: str, streams: int, seconds: int) -> float:
    """Device bytes per second after the first second of one fio job, inside the cap ``thr`` (a
    ReadThrottle; None: uncapped, counted by the whole device, the machine's other readers too)."""
    from iobench.blockdev import cgroup_read_bytes, device_of, diskstats_read_bytes, own_cgroup
    from iobench.io.pagecache import drop_pages

    drop_pages(str(path))
    samples: list[tuple[float, int]] = []
    done = threading.Event()
    dev = device_of(str(path))
    with thr if thr is not None else contextlib.nullcontext():
        cg = own_cgroup()

        def sample() -> None:
            while not done.wait(0.01):
                n = cgroup_read_bytes(dev, cg) if thr is not None else diskstats_read_bytes(dev)
                samples.append((time.perf_counter(), n or 0))
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        try:
            fio("--name=cap", f"--filename={path}", f"--rw={rw}", f"--bs={bs}", "--ioengine=psync", "--invalidate=1",
                f"--numjobs={streams}", f"--size={FILE // streams}", f"--offset_increment={FILE // streams}",
                "--time_based", f"--runtime={seconds + 1}")
        finally:
            done.set()
            th.join()
    steady = [s for s in samples if s[0] - samples[0][0] >= 1.0]
    return (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])


def main(argv=None) -> int:
    ap = parser(__doc__, str(REF / "throttle_cap"), where="/var/tmp")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=3, help="seconds measured per case, after the first")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.seconds < 1:
        return refuse("--rounds/--seconds", "must be 1 or more", "pass a positive count")
    if not os.path.isdir(a.work):
        return refuse("--work", f"{a.work} is not a directory", "pass an existing directory on the disk to measure")
    caps = {c[1]: read_throttle(a.work, c[1], "cap") for c in CASES}
    why = next((w for t, w in caps.values() if t is None), "")
    if why:
        return refuse("--work", why, "run as root with cgroup blkio / io.max, --work on a real disk")
    t_start = time.time()
    with scratch("cap", a.work) as work:
        path = work / "cold.bin"
        with open(path, "wb") as f:
            for _ in range(FILE // MiB):
                f.write(os.urandom(MiB))
            os.fsync(f.fileno())
        got = alternating(a.rounds, {c[0]: (lambda c=c: {"capped": device_rate(path, caps[c[1]][0], *c[2:], a.seconds),
                                                         "uncapped": device_rate(path, None, *c[2:], a.seconds)})
                                     for c in CASES})
    cases = []
    for c in CASES:
        per_round = [r["capped"] / min(c[1], r["uncapped"]) for r in got[c[0]]]
        cases.append({"case": c[0], "cap_bytes_per_s": c[1], "rounds": got[c[0]], "per_round": per_round,
                      "median": statistics.median(per_round)})
    meta = run_meta("bench_throttle_cap.py", argv, t_start, rounds=a.rounds, seconds_per_case=a.seconds, file_bytes=FILE)
    rows = [summary_row(f"kernel read cap: device rate / min(cap, the uncapped disk), {c['case']}, {c['cap_bytes_per_s'] / MiB:.0f} MiB/s "
                        "(fio, cold file)", c["median"], None, detail=f"rounds {c['per_round']}") for c in cases]
    md = ["# What the kernel's read cap delivers, per read pattern", "", run_line(meta), "",
          "Device bytes per second (the cap's cgroup counter, after the first second) while one fio job reads a "
          "cold 1 GiB file with the pattern, over the lesser of the cap and the same job's uncapped rate in the "
          "same round. A bandwidth truth that takes the cap as the device's rate is off by this ratio for a "
          "loader with that pattern.", ""]
    md += table(["pattern", "cap", "delivered / min(cap, uncapped) (median)", "per round", "uncapped MiB/s"],
                [[c["case"], f"{c['cap_bytes_per_s'] / MiB:.0f} MiB/s", f"{c['median']:.3f}",
                  ", ".join(f"{x:.3f}" for x in c["per_round"]),
                  ", ".join(f"{r['uncapped'] / MiB:.0f}" for r in c["rounds"])] for c in cases], "---:")
    write_report(a.out, {"meta": meta, "cases": cases}, "\n".join(md) + "\n", rows, command=meta["command"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
