"""Device check for `iobench gds` on a one-GPU machine: every path, cold and warm, on a 4 GiB file.

Writes everything under ``--out`` (the device tool's ``$OUT``) as it goes, so a run cut
short by its time limit still returns what it measured:

- ``gds_probe.json``            what ``iobench gds probe`` sees (facts + capability per path);
- ``pytest_gpu.txt``            ``pytest -m gpu tests/test_gds_gpu.py``;
- ``cufile_forced.json``        a compat-OFF KvikIO read forced in a subprocess (timeout), with
                                KvikIO's bytes by backend: what cuFile really does here;
- ``gds_bench_<path>.json``     ``iobench gds bench`` results per requested path;
- ``gds_device_check.json``     the summary (best GiB/s per path and cache state, timings).

Run through ``benchmarks/gds_device_check.sh`` (installs carried wheels first).  Without
a GPU it still runs (the cpu path, every other path reported unavailable) — that is how
it is tested on CPU-only machines: ``--size 64MiB --budget-s 60``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import harness   # benchmarks/ is the script's directory, so on sys.path

FORCED = r"""
import json, sys, time
import numpy as np
from iobench.gds.kvikio_paths import KvikioReader
from iobench.gds.bounce import device_lib
path, n = sys.argv[1], int(sys.argv[2])
out = {}
try:
    lib = device_lib()
    dst = lib.alloc(n)
    t = time.perf_counter()
    r = KvikioReader(path, compat=False, threads=8, task_size=4 << 20)
    out["open_s"] = time.perf_counter() - t
    t = time.perf_counter()
    got = r.read_into(dst, 0, n)
    out["read_s"] = time.perf_counter() - t
    out.update(bytes=got, effective_path=r.effective_path(), evidence=r.evidence())
    with open(path, "rb") as f:
        out["verified"] = bool(np.array_equal(lib.to_host(dst, got), np.frombuffer(f.read(got), np.uint8)))
    r.close()
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def pick_dir(explicit: str | None) -> tuple[str, dict]:
    """A directory on an NVMe-backed local file system with room, else the temp dir."""
    from iobench.gds.detect import file_facts

    if explicit:
        return explicit, file_facts(explicit)
    mounts = [ln.split(" - ")[0].split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
              if " - " in ln and ln.split(" - ")[1].split()[0] in ("ext4", "xfs")]
    for d in [m for m in mounts if os.access(m, os.W_OK)]:
        facts = file_facts(d)
        try:
            st = os.statvfs(d)
        except OSError:
            continue
        if facts.get("driver") == "nvme" and st.f_bavail * st.f_frsize > 10 * 2**30:
            return d, facts
    d = tempfile.gettempdir()
    return d, file_facts(d)


def main(argv=None) -> int:
    ap = harness.parser(__doc__, os.environ.get("OUT", "reports/gds-device-check"), scratch_flag="--dir", raw=True)
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--paths", default="cpu,bounce,kvikio-compat,cufile")
    ap.add_argument("--io-sizes", default="1MiB,16MiB")
    ap.add_argument("--threads", default="1,8")
    ap.add_argument("--max-seconds", type=float, default=3.0, help="steady loop per cell")
    ap.add_argument("--budget-s", type=float, default=270.0, help="stop starting new paths after this long")
    ap.add_argument("--skip-pytest", action="store_true")
    ap.set_defaults(dir=os.environ.get("GDS_DIR"))
    args = ap.parse_args(argv)

    from iobench.gds import detect
    from iobench.gds.bench import create_file
    from iobench.results import host_info, write_json
    from iobench.units import parse_size

    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": host_info(),
                     "args": vars(args), "timings_s": {}, "paths": {}, "notes": []}
    took = summary["timings_s"]

    def save() -> None:
        took["total"] = time.perf_counter() - t0
        write_json(out / "gds_device_check.json", summary)

    base, facts = pick_dir(args.dir)
    summary["file"] = {"dir": base, "size": args.size, **facts}
    work = Path(tempfile.mkdtemp(prefix="iobench-gds-check-", dir=base))
    target = str(work / "data.bin")
    try:
        with harness.stopwatch(took, "create"):
            create_file(target, parse_size(args.size), seed=0)
        with harness.stopwatch(took, "probe"):
            pr = detect.probe(target, timeout_s=30)
        summary["probe"] = pr.to_dict()["paths"]
        write_json(out / "gds_probe.json", pr.to_dict())
        save()

        if not args.skip_pytest:
            with harness.stopwatch(took, "pytest_gpu"):
                res = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "tests/test_gds_gpu.py",
                                      "-p", "no:cacheprovider"], capture_output=True, text=True, timeout=150)
            (out / "pytest_gpu.txt").write_text(res.stdout + res.stderr)
            summary["pytest_gpu"] = {"returncode": res.returncode,
                                     "tail": (res.stdout.strip().splitlines() or [""])[-1]}
            save()

        if pr.capabilities["kvikio-compat"].available:
            with harness.stopwatch(took, "cufile_forced"):
                try:
                    res = subprocess.run([sys.executable, "-c", FORCED, target, str(256 << 20)],
                                         capture_output=True, text=True, timeout=60)
                    forced = harness.last_json(res.stdout) if res.stdout.strip() else {
                        "error": res.stderr.strip()[-2000:]}
                except subprocess.TimeoutExpired:
                    forced = {"error": "compat-OFF KvikIO read did not finish within 60 s (killed)"}
                except ValueError:
                    forced = {"error": "unparseable output", "stdout": res.stdout[-2000:],
                              "stderr": res.stderr[-2000:]}
            write_json(out / "cufile_forced.json", forced)
            summary["cufile_forced"] = {k: forced.get(k) for k in ("effective_path", "verified", "error", "read_s")}
            save()

        for name in [p.strip() for p in args.paths.split(",") if p.strip()]:
            if time.perf_counter() - t0 > args.budget_s:
                summary["notes"].append(f"skipped {name}: time budget ({args.budget_s} s) spent")
                continue
            cap = pr.capabilities.get(name)
            if cap is not None and not cap.available:  # its fallback is measured under its own name
                summary["paths"][name] = {"available": False, "reason": cap.reason}
                save()
                continue
            summary["paths"][name] = bench_path(name, target, args, pr, out, took)
            save()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        save()
    print(json.dumps({k: summary[k] for k in ("paths", "timings_s", "notes")}, indent=1))
    return 0


def bench_path(name: str, target: str, args, pr, out: Path, took: dict) -> dict:
    """``iobench gds bench`` of one path, cold and warm; its best cell per cache state."""
    from iobench.config import build
    from iobench.gds import GdsFallbackWarning
    from iobench.gds.bench import GdsBenchConfig, run_bench
    from iobench.results import Results

    cfg = build(GdsBenchConfig, {"target": target, "paths": [name], "io_sizes": args.io_sizes, "threads": args.threads,
                                 "cache": ["cold", "warm"], "max_seconds": args.max_seconds, "qd1_samples": 100,
                                 "qd1_max_seconds": 1.0, "probe_timeout_s": 30}, "gds")
    results = Results(command="gds bench", config={"target": target, "path": name})
    with harness.stopwatch(took, f"bench_{name}"), warnings.catch_warnings():
        warnings.simplefilter("ignore", GdsFallbackWarning)
        try:
            run_bench(cfg, results=results, probe=pr, progress=lambda m: print(m, file=sys.stderr, flush=True))
        except Exception as e:  # noqa: BLE001 - one path failing must not lose the others
            results.warn(f"{name} failed: {type(e).__name__}: {e}")
    results.write(out / f"gds_bench_{name}.json")
    cells = results.metrics.get("cells", [])
    per = {"effective": results.environment.get("effective_gds_path", {}).get(name), "cells": len(cells),
           "all_verified": results.metrics.get("all_verified"), "warnings": results.warnings}
    for state in ("cold", "warm"):
        mine = [c for c in cells if c["cache"]["declared"] == state]
        if mine:
            b = max(mine, key=lambda c: c["throughput"]["bytes_per_s"])
            per[state] = {"gib_per_s": b["throughput"]["gib_per_s"], "io_size_bytes": b["io_size_bytes"],
                          "threads": b["threads"], "cpu_s_per_gb": b["cpu_s_per_gb"],
                          "path_effective": b["path_effective"], "resident_ratio": b["cache"]["resident_ratio"],
                          "qd1_p99_s": (b.get("latency_qd1_s") or {}).get("p99")}
    return per


if __name__ == "__main__":
    sys.exit(main())
