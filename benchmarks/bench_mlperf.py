"""MLPerf Storage's unet3d, scaled down, at 1..N simulated accelerators on this machine.

Per accelerator count: ``iobench mlperf run`` (cold page cache before every epoch, since the
dataset is far under 5x memory; several runs for the spread) gives min/mean AU with the worst
accelerator's 95% interval, samples/s and MB/s.  Two checks computed another way, in the same
run on the same bytes:

- model: the discrete-event loader model (iobench.planner.loader_sim) replays each
  accelerator's recorded per-batch worker times; its AU is set beside the measured one;
- no I/O: the same count with batches from memory (the harness's own ceiling: measurement rule 7, docs/design.md); the
  gap to it is what storage costs.

Then ``--find-max`` on the same dataset, and again with the disk's reads capped by the kernel
(cgroup blkio throttle, iobench.throttle) at ``--throttle`` bytes/s: there storage is the limit by
construction, and the count it can feed is known in advance -- N* = floor(B / (0.9 x d)), d = one
accelerator's bytes per step / compute -- so find-max is checked against it.  DLIO, MLPerf's own
tool, runs beside iobench in benchmarks/bench_dlio.py (its own venv).  Writes
reports/reference/mlperf.md and mlperf.json.

    .venv/bin/python benchmarks/bench_mlperf.py [--max 4] [--files 336] [--scale 0.001]
        [--compute-s 0.1] [--runs 3] [--epochs 2] [--dir DIR] [--out reports/reference]
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path

from iobench.cli import main as iobench_main
from iobench.mlperf.findmax import find_max
from iobench.mlperf.run import MlperfConfig, run_mlperf
from iobench.results import host_info, now_iso

from harness import REF, notes, parser, pct, read_throttle, scratch, table, write_report

def _ci(ci) -> str:
    return f"{pct(ci[0])}..{pct(ci[1])}" if ci else "-"


def _no_result(fm: dict) -> dict:
    return {k: v for k, v in fm.items() if k != "result_at_max"}


def main() -> int:
    ap = parser(__doc__, str(REF), scratch_flag="--dir", raw=True)
    ap.add_argument("--max", type=int, default=4, help="largest accelerator count (default 4)")
    ap.add_argument("--files", type=int, default=336)
    ap.add_argument("--scale", type=float, default=0.001)
    ap.add_argument("--compute-s", type=float, default=0.1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--throttle", default="8MB", help="kernel read cap for the throttled find-max (0: skip)")
    ap.add_argument("--throttle-compute-s", type=float, default=0.3)
    a = ap.parse_args()
    with scratch("mlperf", a.dir) as work:
        data = work / "unet3d"
        assert iobench_main(["gen", "--workload", "unet3d", "--scale", str(a.scale), "--num-samples", str(a.files),
                             "--out", str(data), "--no-progress"]) == 0
        cfg = partial(MlperfConfig, dataset=str(data), compute_s=a.compute_s, epochs=a.epochs)
        rows, raw = [], []
        for n in range(1, a.max + 1):
            load0 = os.getloadavg()[0]
            r = run_mlperf(cfg(accelerators=n, runs=a.runs))
            s = run_mlperf(cfg(accelerators=n, runs=1, synthetic=True))
            worst = next(p for p in r["per_rank"] if p["rank"] == r["worst_accelerator"])
            spread = r["spread"]["au_min"]
            rows.append([n, pct(r["au_min"]), _ci(r["au_ci95_worst"]), pct(worst["au_model"]), pct(s["au_min"]),
                         f"{r['samples_per_s']:.1f}", f"{r['MB_per_s']:.1f}", f"{pct(spread['min'])}..{pct(spread['max'])}",
                         "pass" if r["passed"] else "FAIL", f"{load0:.1f}"])
            raw.append({"accelerators": n, "run": {k: v for k, v in r.items() if k != "per_run"},
                        "no_io": {"au_min": s["au_min"], "samples_per_s": s["samples_per_s"]}})
            print(" | ".join(map(str, rows[-1])), flush=True)
        fm = find_max(cfg(runs=1), max_accelerators=a.max, say=print)
        print(fm["headline"])
        thr = throttled(data, a)
        out = Path(a.out) / "mlperf"
        ds = raw[0]["run"]["dataset"]
        md = ["# MLPerf Storage unet3d, scaled down: AU and throughput per simulated accelerator count", "",
              f"**{fm['headline']}** (this 2-core shared VM, local disk, cold cache every epoch).", "",
              f"Generated {now_iso()} by `.venv/bin/python benchmarks/bench_mlperf.py --max {a.max} --files {a.files} "
              f"--scale {a.scale} --compute-s {a.compute_s} --runs {a.runs} --epochs {a.epochs} --throttle {a.throttle} "
              f"--throttle-compute-s {a.throttle_compute_s}`.",
              f"Dataset: {ds['files']} npz files, {ds['bytes'] / 1e6:.1f} MB (unet3d sizes x{a.scale}: mean "
              f"{146600628 * a.scale / 1e3:.0f} kB); batch 7, 4 loader workers per accelerator, compute "
              f"{a.compute_s * 1e3:g} ms per step; {a.runs} runs x {a.epochs} epochs per count, first step of each "
              "epoch excluded; not rule-compliant (scaled, and under 5x memory: page cache dropped every epoch).", "",
              *table(["accelerators", "min AU", "worst's 95% interval", "model AU (worst)", "min AU, no I/O", "samples/s",
                      "MB/s", "min AU over runs", "verdict (90%)", "load avg"], rows), "",
              notes("mlperf"), "",
              "find-max probes: " + ", ".join(f"{p['accelerators']}: {pct(p['au_min'])}"
                                              f"{' (marginal)' if p['marginal'] else ''}" for p in fm["probes"])
              + (f"; next step: {fm['next_step']['explanation']}" if fm["next_step"] else ""), "",
              *thr["md"]]
        write_report(out, {"host": host_info(), "args": vars(a), "counts": raw, "find_max": _no_result(fm),
                           "throttled": thr["json"]}, "\n".join(md), indent=2, echo=False)
        print(f"wrote {out.with_suffix('.md')}")
    return 0


def throttled(data: Path, a) -> dict:
    """find-max with the disk's reads capped by the kernel: the answer is known in advance."""
    from iobench.manifest import read_manifest
    from iobench.storage import open_backend
    from iobench.units import parse_size

    if a.throttle in ("0", "", "none"):
        return {"md": [], "json": None}
    bw = parse_size(a.throttle, "--throttle")
    thr, why = read_throttle(data, bw, "h16bench")
    if thr is None:
        return {"md": [f"Throttled find-max skipped: {why}.", ""], "json": {"skipped": why}}
    m = read_manifest(open_backend(str(data)))
    per_step = 7 * m.total_bytes / m.total_samples
    demand = per_step / a.throttle_compute_s
    predicted = int(bw // (0.9 * demand))
    with thr as t:
        fm = find_max(MlperfConfig(dataset=str(data), compute_s=a.throttle_compute_s, epochs=1, runs=1,
                                   cache="cold", workers=2), max_accelerators=max(4, 2 * predicted), say=print)
        desc = t.describe()
    print(f"[throttled {a.throttle}/s] {fm['headline']} (predicted {predicted})")
    at = fm["at_max"] or {}
    md = [f"## With the disk's reads capped at {bw / 1e6:g} MB/s by the kernel (cgroup blkio)", "",
          f"**{fm['headline']}**; predicted N* = floor(B / (0.9 d)) = floor({bw / 1e6:g} MB/s / (0.9 x "
          f"{demand / 1e6:.2f} MB/s)) = **{predicted}** (d = 7 x {per_step / 7 / 1e3:.0f} kB per "
          f"{a.throttle_compute_s * 1e3:g} ms step; 2 loader workers per accelerator, cold cache every epoch).", "",
          *table(["accelerators", "min AU", "worst's 95% interval", "MB/s", "verdict"],
                 [[p["accelerators"], pct(p["au_min"]), _ci(p["au_ci95_worst"]), f"{p['throughput_bytes_per_s'] / 1e6:.1f}",
                   "pass" if p["passed"] else "FAIL"] for p in fm["probes"]]), "",
          f"Delivered at the max: {at.get('throughput_bytes_per_s', 0) / 1e6:.1f} MB/s of the {bw / 1e6:g} MB/s cap."
          + (f" Next step: {fm['next_step']['explanation']}." if fm["next_step"] else ""), ""]
    return {"md": md, "json": {"cap_bytes_per_s": bw, "predicted": predicted, "demand_bytes_per_s": demand,
                               "throttle": desc, "find_max": _no_result(fm)}}


if __name__ == "__main__":
    sys.exit(main())
