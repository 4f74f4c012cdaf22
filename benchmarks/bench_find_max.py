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

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from bench_front_door import fio_read, refuse  # noqa: E402  (benchmarks/ is not a package)
from harness import machine  # noqa: E402
from summary import write_rows  # noqa: E402


def _iobench() -> str:
    return str(Path(sys.executable).parent / "iobench")


def find_max(data: str, a, throttle=None) -> dict:
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    cmd = [_iobench(), "mlperf", "run", data, "--find-max", "--compute-s", str(a.compute_s), "--epochs", "1",
           "--runs", "1", "--no-warmup", "--no-checkpoint", "--max-accelerators", str(a.max), "--json", str(out),
           "--force"]
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    if throttle is not None:
        with throttle:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    else:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-3000:]}")
    doc = json.loads(out.read_text())
    out.unlink()
    fm = doc["metrics"]["find_max"]
    return {"find_max": {k: v for k, v in fm.items() if k != "result_at_max"}, "seconds": time.perf_counter() - t0,
            "load_avg_1m_start": load0, "load_avg_1m_end": os.getloadavg()[0],
            "command": " ".join(cmd[1:]).replace(str(out), "OUT.json"), "stdout": p.stdout[-3000:]}


def main(argv=None) -> int:
    from iobench.blockdev import device_of
    from iobench.throttle import ReadThrottle, available
    from iobench.units import parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--throttle", default="350MB")
    ap.add_argument("--files", type=int, default=1176)
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--compute-s", type=float, default=0.1)
    ap.add_argument("--max", type=int, default=16)
    ap.add_argument("--work", default="/var/tmp")
    ap.add_argument("--out", default=str(ROOT / "reports" / "reference" / "find_max"))
    a = ap.parse_args(argv)
    bw = parse_size(a.throttle, "--throttle")
    ok, why = available()
    dev = device_of(a.work) if os.path.isdir(a.work) else None
    if not ok or dev is None:
        return refuse("--work", why if not ok else f"{a.work} is not on a block device",
                      "run as root with cgroup blkio / io.max, --work on a real disk")
    work = Path(tempfile.mkdtemp(prefix="iobench-find-max-", dir=a.work))
    data = str(work / "unet3d")
    t_start = time.time()
    try:
        subprocess.run([_iobench(), "gen", "--workload", "unet3d", "--scale", str(a.scale), "--num-samples",
                        str(a.files), "--out", data, "--no-progress"], check=True, capture_output=True, timeout=1800)
        files = sorted(str(p) for p in Path(data).rglob("*.npz"))
        total = sum(os.path.getsize(f) for f in files)
        per_step = 7 * total / len(files)                 # unet3d: batch 7
        demand = per_step / a.compute_s
        predicted = int(bw // (0.9 * demand))
        cases = {}
        fio_free = fio_read(files[:64])
        cases["unthrottled"] = {**find_max(data, a), "fio_bytes_per_s": fio_free}
        thr = ReadThrottle(dev, bw, tag="find-max")
        with thr:
            fio_thr = fio_read(files[:64])
        cases["throttled"] = {**find_max(data, a, thr), "fio_bytes_per_s": fio_thr, "cap_bytes_per_s": bw,
                              "predicted": predicted}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, c in cases.items():
        fm = c["find_max"]
        print(f"[{name}] {fm['headline']} ({c['seconds']:.0f} s, load {c['load_avg_1m_start']:.1f})", flush=True)
    u, t = cases["unthrottled"]["find_max"], cases["throttled"]["find_max"]
    label = {k: (c["find_max"].get("next_step") or {}).get("bound") for k, c in cases.items()}
    differ = u["max_accelerators_per_node"] != t["max_accelerators_per_node"]
    # the unthrottled disk is the faster storage: an answer below the throttled one is the host's noise
    met = differ and u["max_accelerators_per_node"] > t["max_accelerators_per_node"] and \
        label["throttled"] == "storage-bound" and label["unthrottled"] in ("storage-bound", "host-bound")
    meta = {"command": " ".join(["python", "benchmarks/bench_find_max.py", *(argv or sys.argv[1:])]),
            "machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
            "seconds": time.time() - t_start, "files": a.files, "scale": a.scale, "dataset_bytes": total,
            "compute_s": a.compute_s, "demand_bytes_per_s": demand, "throttle_bytes_per_s": bw,
            "predicted_throttled": predicted}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "cases": cases, "differ": differ, "met": met},
                                                   indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(to_markdown(meta, cases, differ, met))
    write_rows(out.name, [{"comparison": f"mlperf find-max, {bw / 1e6:g} MB/s throttle vs unthrottled: different "
                                         "answers (unthrottled larger), each labelled (throttled storage-bound)",
                           "ratio": 1.0 if met else 0.0, "target": 1.0, "direction": ">=", "met": met,
                           "detail": f"{t['max_accelerators_per_node']} ({label['throttled']}) vs "
                                     f"{u['max_accelerators_per_node']} ({label['unthrottled']})"}],
               ref=out.parent, command=meta["command"])
    print(out.with_suffix(".md").read_text())
    return 0


def to_markdown(meta: dict, cases: dict, differ: bool, met: bool) -> str:
    L = ["# `mlperf run --find-max`: the storage's limit apart from the host's", "",
         f"`{meta['command']}` — {meta['started']}, {meta['seconds']:.0f} s; {meta['machine']['cpu_count']} cores, "
         f"load average {', '.join(f'{x:.1f}' for x in meta['machine']['load_avg_at_start'])} at the start.", "",
         f"unet3d-shaped npz files ({meta['files']} files, {meta['dataset_bytes'] / 1e6:.0f} MB, scale "
         f"{meta['scale']}), compute {meta['compute_s'] * 1e3:g} ms per step: one accelerator needs "
         f"{meta['demand_bytes_per_s'] / 1e6:.1f} MB/s. Cold cache every epoch. Throttled: the kernel caps the "
         f"disk's reads at {meta['throttle_bytes_per_s'] / 1e6:g} MB/s, so storage feeds N* = floor(B / (0.9 d)) = "
         f"**{meta['predicted_throttled']}** accelerators at AU ≥ 90%.", "",
         "| case | command | answer | label of the next count | delivered at the next count | host ceiling | "
         "storage ceiling (find-max's own) | fio (O_DIRECT seq) | load avg | s |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in cases.items():
        fm = c["find_max"]
        ns = fm.get("next_step") or {}
        ceil = ((ns.get("host_ceiling") or {}).get("bytes_per_s") or 0) / 1e6
        sto = ((ns.get("storage_ceiling") or {}).get("bytes_per_s") or 0) / 1e6
        L.append(f"| {name} | `{c['command']}` | {fm['max_accelerators_per_node']} | {ns.get('bound', '-')} | "
                 f"{(ns.get('delivered_bytes_per_s') or 0) / 1e6:.0f} MB/s | {ceil:.0f} MB/s | {sto:.0f} MB/s | "
                 f"{(c['fio_bytes_per_s'] or 0) / 1e6:.0f} MB/s | {c['load_avg_1m_start']:.1f}–"
                 f"{c['load_avg_1m_end']:.1f} | {c['seconds']:.0f} |")
    L += ["", f"**Answers {'differ' if differ else 'are the same'}; target "
              f"{'met' if met else 'missed'}** (different answers, the unthrottled one the larger, the throttled "
              "one storage-bound).", "",
          "## Headlines as printed", ""]
    for name, c in cases.items():
        fm = c["find_max"]
        L.append(f"- **{name}**: {fm['headline']}")
        if fm.get("next_step"):
            L.append(f"  - why: {fm['next_step']['explanation']}")
        L.append("  - probes: " + ", ".join(f"{p['accelerators']}: AU {p['au_min']:.1%} "
                                            f"({'pass' if p['passed'] else 'FAIL'}, "
                                            f"{p['throughput_bytes_per_s'] / 1e6:.0f} MB/s)" for p in fm["probes"]))
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
