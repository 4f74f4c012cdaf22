"""`mlperf run --find-max` tells the storage's limit from the host's: the same unet3d-shaped dataset,
once on the disk as it is and once with its reads capped by the kernel (cgroup blkio, iobench.throttle).

    flock -w 1800 /work/heavy.lock .venv/bin/python benchmarks/bench_find_max.py \
        [--throttle 350MB] [--files 1176] [--scale 0.01] [--compute-s 0.1] [--max 16] [--out reports/reference/find_max]

Each case runs exactly ``iobench mlperf run DS --find-max --compute-s C --epochs 1 --runs 1 --no-warmup
--no-checkpoint --max-accelerators M`` (cold cache every epoch: the dataset is far under 5x memory).
Throttled, storage is the limit by construction and the count it can feed is known in advance,
N* = floor(B / (0.9 d)) with d one accelerator's bytes per step over its compute; the answer must be
labelled storage-bound.  Unthrottled, fio (O_DIRECT sequential 1 MiB reads of the same files) says
what the disk gives; where that is more than the loaders took, the label must be host-bound.  Target:
the two answers differ (the unthrottled one the larger) and each carries its label.  Writes NAME.json, NAME.md, NAME.rows.json.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_front_door import fio_read  # (benchmarks/ is not a package)
from harness import (REF, iobench_exe, iobench_json, parser, read_throttle, refuse, run_line, run_meta, scratch, table,
                     write_report)
from summary import summary_row


def find_max(data: str, a, throttle=None) -> dict:
    load0 = os.getloadavg()[0]
    doc, run = iobench_json(["mlperf", "run", data, "--find-max", "--compute-s", str(a.compute_s), "--epochs", "1",
                             "--runs", "1", "--no-warmup", "--no-checkpoint", "--max-accelerators", str(a.max),
                             "--force"], timeout=1800, throttle=throttle)
    fm = doc["metrics"]["find_max"]
    return {"find_max": {k: v for k, v in fm.items() if k != "result_at_max"}, "seconds": run["seconds"],
            "load_avg_1m_start": load0, "load_avg_1m_end": os.getloadavg()[0], "command": run["command"],
            "stdout": run["stdout"][-3000:]}


def main(argv=None) -> int:
    from iobench.units import parse_size

    ap = parser(__doc__, str(REF / "find_max"), where="/var/tmp")
    ap.add_argument("--throttle", default="350MB")
    ap.add_argument("--files", type=int, default=1176)
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--compute-s", type=float, default=0.1)
    ap.add_argument("--max", type=int, default=16)
    a = ap.parse_args(argv)
    bw = parse_size(a.throttle, "--throttle")
    thr, why = read_throttle(a.work, bw, "find-max")
    if thr is None:
        return refuse("--work", why, "run as root with cgroup blkio / io.max, --work on a real disk")
    t_start = time.time()
    with scratch("find-max", a.work) as work:
        data = str(work / "unet3d")
        subprocess.run([iobench_exe(), "gen", "--workload", "unet3d", "--scale", str(a.scale), "--num-samples",
                        str(a.files), "--out", data, "--no-progress"], check=True, capture_output=True, timeout=1800)
        files = sorted(str(p) for p in Path(data).rglob("*.npz"))
        total = sum(os.path.getsize(f) for f in files)
        demand = 7 * total / len(files) / a.compute_s     # unet3d: batch 7
        predicted = int(bw // (0.9 * demand))
        fio_free = fio_read(files[:64])
        cases = {"unthrottled": {**find_max(data, a), "fio_bytes_per_s": fio_free}}
        with thr:
            fio_thr = fio_read(files[:64])
        cases["throttled"] = {**find_max(data, a, thr), "fio_bytes_per_s": fio_thr, "cap_bytes_per_s": bw,
                              "predicted": predicted}
    for name, c in cases.items():
        print(f"[{name}] {c['find_max']['headline']} ({c['seconds']:.0f} s, load {c['load_avg_1m_start']:.1f})",
              flush=True)
    u, t = (cases[k]["find_max"]["max_accelerators_per_node"] for k in ("unthrottled", "throttled"))
    label = {k: (c["find_max"].get("next_step") or {}).get("bound") for k, c in cases.items()}
    # the unthrottled disk is the faster storage: an answer below the throttled one is the host's noise
    met = u > t and label["throttled"] == "storage-bound" and label["unthrottled"] in ("storage-bound", "host-bound")
    meta = run_meta("bench_find_max.py", argv, t_start, files=a.files, scale=a.scale, dataset_bytes=total,
                    compute_s=a.compute_s, demand_bytes_per_s=demand, throttle_bytes_per_s=bw,
                    predicted_throttled=predicted)
    res = {"meta": meta, "cases": cases, "differ": u != t, "met": met}
    write_report(a.out, res, to_markdown(meta, cases, u != t, met), rows(res), command=meta["command"])
    return 0


def rows(res: dict) -> list[dict]:
    """The one summary row: both answers, each with its label, and whether they tell storage from host."""
    c = res["cases"]
    label = {k: f"{v['find_max']['max_accelerators_per_node']} ({(v['find_max'].get('next_step') or {}).get('bound')})"
             for k, v in c.items()}
    return [summary_row(f"mlperf find-max, {res['meta']['throttle_bytes_per_s'] / 1e6:g} MB/s throttle vs unthrottled: "
                        "different answers (unthrottled larger), each labelled (throttled storage-bound)",
                        1.0 if res["met"] else 0.0, 1.0, ">=", f"{label['throttled']} vs {label['unthrottled']}")]


def to_markdown(meta: dict, cases: dict, differ: bool, met: bool) -> str:
    def mb(bps) -> str:
        return f"{(bps or 0) / 1e6:.0f} MB/s"

    def line(name: str, c: dict) -> list:
        ns = c["find_max"].get("next_step") or {}
        return [name, f"`{c['command']}`", c["find_max"]["max_accelerators_per_node"], ns.get("bound", "-"),
                mb(ns.get("delivered_bytes_per_s")), mb((ns.get("host_ceiling") or {}).get("bytes_per_s")),
                mb((ns.get("storage_ceiling") or {}).get("bytes_per_s")), mb(c["fio_bytes_per_s"]),
                f"{c['load_avg_1m_start']:.1f}–{c['load_avg_1m_end']:.1f}", f"{c['seconds']:.0f}"]
    L = ["# `mlperf run --find-max`: the storage's limit apart from the host's", "", run_line(meta, " at the start"), "",
         f"unet3d-shaped npz files ({meta['files']} files, {meta['dataset_bytes'] / 1e6:.0f} MB, scale {meta['scale']}), compute "
         f"{meta['compute_s'] * 1e3:g} ms per step: one accelerator needs {meta['demand_bytes_per_s'] / 1e6:.1f} MB/s. Cold "
         f"cache every epoch. Throttled: the kernel caps the disk's reads at {meta['throttle_bytes_per_s'] / 1e6:g} MB/s, so "
         f"storage feeds N* = floor(B / (0.9 d)) = **{meta['predicted_throttled']}** accelerators at AU ≥ 90%.", ""]
    L += table(["case", "command", "answer", "label of the next count", "delivered at the next count", "host ceiling",
                "storage ceiling (find-max's own)", "fio (O_DIRECT seq)", "load avg", "s"],
               [line(name, c) for name, c in cases.items()])
    L += ["", f"**Answers {'differ' if differ else 'are the same'}; target {'met' if met else 'missed'}** (different answers, "
              "the unthrottled one the larger, the throttled one storage-bound).", "", "## Headlines as printed", ""]
    for name, c in cases.items():
        fm = c["find_max"]
        L.append(f"- **{name}**: {fm['headline']}")
        if fm.get("next_step"):
            L.append(f"  - why: {fm['next_step']['explanation']}")
        L.append("  - probes: " + ", ".join(f"{p['accelerators']}: AU {p['au_min']:.1%} ({'pass' if p['passed'] else 'FAIL'}, "
                                            f"{p['throughput_bytes_per_s'] / 1e6:.0f} MB/s)" for p in fm["probes"]))
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
