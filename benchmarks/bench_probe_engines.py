"""The built-in Python file engine against fio, on the same jobs, in one run; and the small-file penalty.

Both engines run each job on the same test file with the same request size, queue depth,
O_DIRECT flag and runtime; fio with ``ioengine=psync numjobs=qd`` (the built-in engine's
model: qd threads, one synchronous request each) and, for reference, with libaio iodepth.
Each pair runs in alternating order (ABBA) and the ratios built-in ÷ fio are printed —
absolute numbers on a shared machine are noise, ratios measured side by side are not.

    .venv/bin/python benchmarks/bench_probe_engines.py --dir /work/tmp-probe \
        --out reports/reference/probe_engines.md
"""

from __future__ import annotations

import os
import sys
import time

from iobench.io import pagecache
from iobench.probe import fio_engine, py_engine
from iobench.probe.file_probe import _layout
from iobench.probe.jobs import Job

import harness

JOBS = [  # rw, bs, qd, direct, cache
    ("randread", 4096, 1, False, "warm"),
    ("randread", 4096, 4, False, "warm"),
    ("randread", 4096, 1, True, "n/a"),
    ("randread", 4096, 4, True, "n/a"),
    ("randread", 4096, 16, True, "n/a"),
    ("read", 1 << 20, 1, True, "n/a"),
    ("read", 1 << 20, 4, True, "n/a"),
    ("randwrite", 4096, 1, True, "n/a"),
    ("write", 1 << 20, 1, True, "n/a"),
]


def machine(where: str = ".") -> str:
    """harness.machine() as a sentence, with the test file's file system and fio's version."""
    m, fs = harness.machine(), harness.filesystem(where)
    return (f"{m['cpu']}, {m['cpu_count']} CPUs, {m['memory_bytes'] / 2**30:.0f} GiB RAM, {m['os']}, "
            f"test file on {fs['type']} on {fs['device']}, Python {m['python']}, {fio_engine.find()[1]}; {m['note']}.")


def one(engine, job: Job, cache: str) -> dict:
    if cache == "warm":
        pagecache.set_file_state(job.path, "warm")
    r = engine.run(job)
    return {"iops": r.iops, "bytes_per_s": r.bytes_per_s, "p50": r.latency_summary["p50"],
            "p99": r.latency_summary["p99"]}


def main() -> int:
    ap = harness.parser(__doc__, "", scratch_flag="--dir")   # --out: the Markdown report (OUT.json beside it)
    ap.add_argument("--file-size", type=int, default=256 << 20)
    ap.add_argument("--runtime", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=2, help="ABBA repetitions per job")
    ap.add_argument("--smallfiles", type=int, default=400, help="samples for the small-file penalty (0: skip)")
    args = ap.parse_args()
    if not fio_engine.available():
        print("fio is not installed: nothing to compare against", file=sys.stderr)
        return 2
    rows, raw = [], []
    with harness.scratch("probe", args.dir) as base:
        path = os.path.join(base, "data.bin")
        _layout(path, args.file_size, 0)
        for rw, bs, qd, direct, cache in JOBS:
            job = Job(path=path, file_size=args.file_size, rw=rw, bs=bs, qd=qd, direct=direct,
                      runtime_s=args.runtime, qd_model="threads")
            runs = harness.alternating(args.reps, {"py": lambda: one(py_engine, job, cache),
                                                   "fio": lambda: one(fio_engine, job, cache)})
            aio = one(fio_engine, Job(**{**job.__dict__, "qd_model": "async"}), cache) if direct else None
            row = {"job": f"{rw} {bs // 1024} KiB qd{qd} {'direct' if direct else 'buffered ' + cache}",
                   **{f"{side}_{k}": harness.median(runs[side], k) for k in ("iops", "p50", "p99") for side in runs},
                   "fio_libaio_iops": aio["iops"] if aio else None}
            row["ratio_iops"] = row["py_iops"] / row["fio_iops"]
            rows.append(row)
            raw.append({"job": row["job"], "python": runs["py"], "fio_psync": runs["fio"], "fio_libaio": aio})
            print(f"{row['job']:<32} built-in/fio IOPS {row['ratio_iops']:.2f}", file=sys.stderr)
        os.unlink(path)
        penalty = smallfiles(str(base), args.smallfiles) if args.smallfiles else None
        where = machine(os.path.dirname(base))
    report = render(rows, penalty, args, where)
    if args.out:
        harness.write_report(args.out, {"rows": rows, "raw": raw, "smallfiles": penalty, "machine": where}, report)
    else:
        print(report)
    return 0


def smallfiles(base: str, samples: int) -> dict:
    from iobench.config import build
    from iobench.probe.safety import ProbeArea
    from iobench.probe.smallfiles import SmallFilesConfig, run_smallfiles_probe

    out = {}
    for modality, extra in (("images", {}), ("tokens", {"seq_len": 2048})):
        cfg = build(SmallFilesConfig, {"samples": samples, "modality": modality, "shard_formats": ["tar", "raw"],
                                       "workers": 4, **extra})
        with ProbeArea.open(os.path.join(base, f"sf-{modality}"), 2 << 30) as area:
            m = run_smallfiles_probe(area, cfg)["metrics"]
        out[modality] = {"penalty": m["penalty"], "best": m["best_shard_format"], "reader": cfg.reader,
                         "mean_sample_bytes": m["mean_sample_bytes"],
                         **{k: {f: v.get(k) for f, v in m["formats"].items()}
                            for k in ("samples_per_s_wall", "samples_per_s", "per_sample_s")}}
        print(f"small files {modality}: penalty {m['penalty']:.1f}x", file=sys.stderr)
    return out


def render(rows, penalty, args, where: str) -> str:
    us = lambda s: f"{s * 1e6:.0f}"  # noqa: E731
    lines = ["# Storage probe: built-in Python engine vs fio", "",
             f"Command: `.venv/bin/python benchmarks/bench_probe_engines.py --runtime {args.runtime} "
             f"--reps {args.reps} --smallfiles {args.smallfiles}` ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {where}", "",
             "Same test file, same job, same run; fio with `ioengine=psync numjobs=qd` (the built-in engine's "
             "model); medians of ABBA repetitions. Ratio = built-in ÷ fio.", "",
             harness.notes("probe_engines"), "",
             *harness.table(["job", "built-in IOPS", "fio IOPS", "ratio", "built-in p50 µs", "fio p50 µs",
                             "built-in p99 µs", "fio p99 µs", "fio libaio IOPS"],
                            [[r["job"], f"{r['py_iops']:,.0f}", f"{r['fio_iops']:,.0f}", f"{r['ratio_iops']:.2f}",
                              us(r["py_p50"]), us(r["fio_p50"]), us(r["py_p99"]), us(r["fio_p99"]),
                              harness.num(r["fio_libaio_iops"], ",.0f")] for r in rows], "---:")]
    if penalty:
        def cell(v, f):
            s, w = v["samples_per_s"][f], v["samples_per_s_wall"].get(f)
            return f"{s:,.0f} ({w:,.0f})" if w else f"{s:,.0f}"
        lines += ["", "## Small-file penalty (`iobench probe smallfiles`: same samples, cold page cache, read "
                  "through the iobench loader with 4 worker processes)", "",
                  "samples/s = workers ÷ worker busy time per sample (read + parse; start-up excluded); "
                  "wall = samples ÷ wall time including worker start-up. Penalty = best shard format ÷ files.", "",
                  *harness.table(["modality", "mean sample", "files samples/s (wall)", "tar samples/s (wall)",
                                  "raw samples/s (wall)", "penalty"],
                                 [[mod, f"{v['mean_sample_bytes'] / 1024:.0f} KiB", cell(v, "files"), cell(v, "tar"),
                                   cell(v, "raw"), f"{v['penalty']:.1f}× ({v['best']})"] for mod, v in penalty.items()],
                                 "---:")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
