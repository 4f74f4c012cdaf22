"""iobench's `cpu` GPU-read path vs fio, same file, same bytes, same run; prints ratios.

For each IO size × threads × cache state (warm, cold, and ``direct``: O_DIRECT in both), both tools read the whole file once with
``threads`` concurrent preads of ``io_size``: iobench's CpuReader (thread pool of
preadv, task size = io size) and fio (psync, ``numjobs=threads`` each reading its own
contiguous part).  Cache state is set the same way before each run (fadvise DONTNEED
for cold, a pre-read for warm) and measured with mincore.  Rounds alternate between the
tools (who goes first swaps every round) and the median of ``--repeat`` runs is reported, as a
ratio iobench / fio.

    .venv/bin/python benchmarks/bench_gds_cpu_vs_fio.py [--size 256MiB] [--dir /tmp] [--out reports/reference]
"""

from __future__ import annotations

import itertools
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness

from iobench.config import build
from iobench.gds import make_reader
from iobench.gds.bench import GdsBenchConfig, create_file, run_cell
from iobench.gds.detect import file_facts
from iobench.io.pagecache import prepare_file
from iobench.results import host_info, now_iso
from iobench.units import format_bytes, parse_size


def fio_read(path: str, size: int, io_size: int, threads: int, cache_state: str) -> float:
    """bytes/s fio reports for a read of the whole file by ``threads`` psync jobs, from ``cache_state``."""
    prepare_file(path, "cold" if cache_state == "direct" else cache_state)
    per_job = size // threads // io_size * io_size
    _, job = harness.fio("--name=gdscpu", f"--filename={path}", "--rw=read", f"--bs={io_size}", "--ioengine=psync",
                         f"--numjobs={threads}", "--thread", f"--size={per_job}", f"--offset_increment={per_job}",
                         f"--direct={1 if cache_state == 'direct' else 0}",
                         f"--invalidate={0 if cache_state == 'warm' else 1}", timeout=300)
    return harness.fio_rate(job["read"]) or float("nan")


def python_read(path: str, io_size: int, cache_state: str) -> float:
    """bytes/s of the naive loader: one thread, buffered readinto of ``io_size`` chunks, from ``cache_state``."""
    prepare_file(path, cache_state)
    buf = bytearray(io_size)
    n = 0
    t = time.perf_counter_ns()
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(buf):
            n += got
    return n / ((time.perf_counter_ns() - t) / 1e9)


def iobench_read(path: str, io_size: int, threads: int, cache_state: str, cfg: GdsBenchConfig) -> tuple[float, float]:
    if cache_state == "direct":
        cfg = build(GdsBenchConfig, {"target": path, "paths": ["cpu"], "qd1_samples": 0, "verify": False,
                                     "odirect": True}, "gds")
        cache_state = "cold"
    cell = run_cell("cpu", [path], io_size, threads, cache_state, cfg, {}, make_reader)
    # whole run (first call included), as fio's runtime includes its first IO
    total_s = cell["first_io_s"] + (cell["steady_s"] if cell["calls"] > 1 else 0.0)
    return cell["bytes"] / total_s, cell["cpu_s_per_gb"] or 0.0


def main(argv=None) -> int:
    ap = harness.parser(__doc__, "", scratch_flag="--dir", raw=True)   # --out DIR: gds_cpu_vs_fio.{json,md}
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--io-sizes", default="128KiB,1MiB,8MiB")
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--cache", default="warm,cold,direct", help="warm, cold, direct (O_DIRECT in both tools)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if not shutil.which("fio"):
        print("fio is not installed (apt-get install fio)", file=sys.stderr)
        return 2
    size = parse_size(args.size)
    rows = []
    t_start = time.perf_counter()
    with harness.scratch("gds", args.dir or tempfile.gettempdir()) as work:   # its disk is measured
        path = str(work / "data.bin")
        create_file(path, size, seed=0)
        cfg = build(GdsBenchConfig, {"target": path, "paths": ["cpu"], "qd1_samples": 0, "verify": False}, "gds")
        for state, io, t in itertools.product(args.cache.split(","), [parse_size(s) for s in args.io_sizes.split(",")],
                                              [int(t) for t in args.threads.split(",")]):
            runs = harness.alternating(args.repeat, {"iobench": lambda: iobench_read(path, io, t, state, cfg),
                                                     "fio": lambda: fio_read(path, size, io, t, state)})
            ours, cpu = [b for b, _ in runs["iobench"]], [c for _, c in runs["iobench"]]
            # the naive loader at 1 thread only, after the pairs (it has no ratio of its own)
            py_runs = [python_read(path, io, state) for _ in range(args.repeat)] if t == 1 and state != "direct" else []
            row = {"cache": state, "io_size_bytes": io, "threads": t, "iobench_bytes_per_s": statistics.median(ours),
                   "fio_bytes_per_s": statistics.median(runs["fio"]), "python_readinto_bytes_per_s": harness.median(py_runs),
                   "iobench_cpu_s_per_gb": statistics.median(cpu),
                   "runs": {"iobench": ours, "fio": runs["fio"], "python_readinto": py_runs}}
            row["ratio"] = row["iobench_bytes_per_s"] / row["fio_bytes_per_s"]
            rows.append(row)
            py = f"  python {row['python_readinto_bytes_per_s'] / 2**30:6.2f} GiB/s" if py_runs else ""
            print(f"{state:6} io={format_bytes(io):>9} threads={t}: iobench {row['iobench_bytes_per_s'] / 2**30:6.2f} "
                  f"GiB/s  fio {row['fio_bytes_per_s'] / 2**30:6.2f} GiB/s{py}  ratio {row['ratio']:.2f}", flush=True)
        facts = file_facts(path)
    report = {"benchmark": "gds cpu path vs fio", "date": now_iso(), "host": host_info(), "fio": harness.fio_version(),
              "file": {"size_bytes": size, "fs_type": facts.get("fs_type"), "driver": facts.get("driver")},
              "repeat": args.repeat, "rows": rows, "wall_s": time.perf_counter() - t_start,
              "geomean_ratio": statistics.geometric_mean([r["ratio"] for r in rows]),
              "note": "machine shared with other work while measuring; ratios, not absolute numbers, are the result"}
    print(f"geometric mean ratio iobench/fio: {report['geomean_ratio']:.2f} ({report['wall_s']:.0f} s)")
    if args.out:
        harness.write_report(Path(args.out) / "gds_cpu_vs_fio", report, markdown(report), echo=False)
        print(f"wrote {Path(args.out) / 'gds_cpu_vs_fio.md'}")
    return 0


def markdown(r: dict) -> str:
    h = r["host"]
    gib = lambda x: f"{x / 2**30:.2f}" if x else "-"  # noqa: E731
    return "\n".join([
        "# GPU-read `cpu` path vs fio (same file, same run)", "",
        f"Command: `.venv/bin/python benchmarks/bench_gds_cpu_vs_fio.py --out reports/reference` ({r['date']}).",
        f"Machine: {h['cpu']}, {h['cpu_count']} CPUs, {format_bytes(h['memory_bytes'])} RAM, {h['os']}, "
        f"Python {h['python']}, {r['fio']}; file of {format_bytes(r['file']['size_bytes'])} on "
        f"{r['file']['fs_type']} ({r['file']['driver'] or 'no block device'}).",
        f"The machine was shared with other work while measuring: read the ratios, not the absolute rates. "
        f"Median of {r['repeat']} alternating runs per row.", "",
        "`python` is the naive loader (one thread, buffered `readinto`), measured at 1 thread only.", "",
        *harness.table(["cache", "io size", "threads", "iobench GiB/s", "fio GiB/s", "python GiB/s", "iobench / fio",
                        "iobench CPU-s/GB"],
                       [[x["cache"], format_bytes(x["io_size_bytes"]), x["threads"], gib(x["iobench_bytes_per_s"]),
                         gib(x["fio_bytes_per_s"]), gib(x["python_readinto_bytes_per_s"]), f"{x['ratio']:.2f}",
                         f"{x['iobench_cpu_s_per_gb']:.3f}"] for x in r["rows"]]), "",
        f"Geometric mean of the ratios: **{r['geomean_ratio']:.2f}**.", "",
        harness.notes("gds_cpu_vs_fio"), ""])


if __name__ == "__main__":
    sys.exit(main())
