"""The planner against measurement: its predictions and the loader's numbers, same run, same bytes.

The planner has no peer tool to race; its claims are checked against what iobench measures:

  1. data stall, pipelined (Eq. 4.2): predicted max(0, io − c) / max(io, c) from the measured
     mean batch I/O time, vs the loader's measured stall, for compute shorter, equal and
     longer than the I/O.
  2. prefetch depth (Eq. 4.3): depth 1 on a long-tailed store, then the planner's depth from
     that run's measured P99 batch I/O (`iobench plan prefetch --from`), then a run at that
     depth: the recommendation should remove most of the stall.

Storage is a local raw dataset behind iobench's latency emulation (one shard per batch, one
request per shard), so the I/O time per batch is known and the comparison is about the
model, not about this VM's disk.

    python benchmarks/bench_planner.py [--steps 40] [--out reports/reference/planner]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from iobench.loader.core import LoadConfig, run_load
from iobench.planner.models import plan
from iobench.planner.pipeline import data_stall
from iobench.schema import STALL_RATIO

from harness import dataset, machine, notes, parser, scratch, table, write_report


def load(url: str, steps: int, compute_ms: float, emulate: str, prefetch: int) -> dict:
    return run_load(LoadConfig(dataset=url, access="block", workers=1, prefetch=prefetch, batch_size=16, steps=steps,
                               shuffle=False, shuffle_buffer=0, compute=f"{compute_ms}ms", emulate=emulate,
                               monitor_interval_s=5.0)).metrics


def main() -> int:
    ap = parser(__doc__, "reports/reference/planner", scratch_flag=None)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    res = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "stall": [], "prefetch": {}}
    with scratch("planner") as tmp:
        url = str(tmp / "tokens")
        dataset(url, 16 * (args.steps + 8), "16 samples", vocab_size=50257, seed=1)

        io_ms = 40.0
        for compute_ms in (20.0, 40.0, 80.0):
            m = load(url, args.steps, compute_ms, f"const:{io_ms}ms", prefetch=2)
            io = m["batch_io_s"]["mean"]
            predicted = data_stall(compute_ms / 1e3, io, pipelined=True).stall_ratio
            res["stall"].append({"compute_ms": compute_ms, "io_ms_emulated": io_ms, "io_mean_s": io,
                                 "predicted": predicted, "measured": m[STALL_RATIO]})
            print(f"compute {compute_ms:.0f} ms, I/O {io * 1e3:.1f} ms: stall predicted {predicted:.1%}, "
                  f"measured {m[STALL_RATIO]:.1%}", flush=True)

        tail = "lognormal:p50=15ms,p99=150ms"
        compute_ms = 30.0
        m1 = load(url, args.steps, compute_ms, tail, prefetch=1)
        # what `iobench plan prefetch --from` reads: the depth-1 run's results file, as JSON
        run_file = json.loads(json.dumps({"schema_version": 1, "metrics": m1}, default=str))
        p = plan("prefetch", {"compute_time": compute_ms / 1e3}, run_file)
        depth = p["outputs"]["depth_recommended"]
        mq = load(url, args.steps, compute_ms, tail, prefetch=depth)
        res["prefetch"] = {"emulation": tail, "compute_ms": compute_ms, "p99_io_s": m1["batch_io_s"]["p99"],
                           "depth_min": p["outputs"]["depth_min"], "depth_recommended": depth,
                           "stall_depth_1": m1[STALL_RATIO], "stall_recommended": mq[STALL_RATIO],
                           "mean_io_s": m1["batch_io_s"]["mean"]}
        print(f"prefetch: P99 batch I/O {m1['batch_io_s']['p99'] * 1e3:.0f} ms / compute {compute_ms:.0f} ms → depth "
              f"{depth}; stall {m1[STALL_RATIO]:.1%} at depth 1 → {mq[STALL_RATIO]:.1%} at depth {depth}", flush=True)
    write_report(args.out, res, render(res, " ".join(sys.argv)), echo=False)
    print(f"wrote {Path(args.out).with_suffix('.md')}")
    return 0


def render(r: dict, cmd: str) -> str:
    mc = r["machine"]
    lines = ["# Planner vs measurement (same run, same bytes)", "",
             f"Command: `{cmd}` — measured {r['started']}.",
             f"Machine: {mc['cpu_count']} CPUs, {mc['memory_bytes'] / 2**30:.1f} GiB, {mc['os']}, Python {mc['python']}. "
             f"{mc['note']}; load average at start {mc['load_avg_at_start']}.", "",
             "Storage: a local raw token dataset (one 16-sample shard per batch) behind iobench's latency "
             "emulation; loader with 1 worker, prefetch depth 2, compute emulated by sleeping.", "",
             "## 1. Data stall, pipelined (Eq. 4.2)", "",
             *table(["compute", "batch I/O (measured mean)", "stall predicted", "stall measured", "measured − predicted"],
                    [[f"{s['compute_ms']:.0f} ms", f"{s['io_mean_s'] * 1e3:.1f} ms", f"{s['predicted']:.1%}",
                      f"{s['measured']:.1%}", f"{(s['measured'] - s['predicted']) * 100:+.1f} points"] for s in r["stall"]])]
    p = r["prefetch"]
    lines += ["", "## 2. Prefetch depth from the measured P99 (Eq. 4.3)", "",
              f"Store: `{p['emulation']}` per batch; compute {p['compute_ms']:.0f} ms. The planner read the depth-1 "
              f"run's results (`plan prefetch --from`): P99 batch I/O {p['p99_io_s'] * 1e3:.0f} ms → minimum depth "
              f"{p['depth_min']}, recommended {p['depth_recommended']} (minimum + 2).", "",
              *table(["prefetch depth", "stall measured"], [[1, f"{p['stall_depth_1']:.1%}"],
                                                           [f"{p['depth_recommended']} (planner)", f"{p['stall_recommended']:.1%}"]]), "",
              f"Stall ratio at the planner's depth / at depth 1: "
              f"{(p['stall_recommended'] / p['stall_depth_1']) if p['stall_depth_1'] else float('nan'):.2f}.", "",
              f"Reading: in this run the measured stall is within "
              f"{max(abs(x['measured'] - x['predicted']) for x in r['stall']) * 100:.1f} points of Eq. 4.2's "
              "steady-state prediction. " + notes("planner")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
