"""The prepared device check runs end to end on a CPU-only machine (every GPU path reported unavailable)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_device_check_script_syntax():
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks/gds_device_check.sh")]).returncode == 0


def test_device_check_cpu_run(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks/gds_device_check.py"), "--out", str(out),
                          "--size", "8MiB", "--dir", str(tmp_path), "--io-sizes", "1MiB", "--threads", "1",
                          "--max-seconds", "1", "--budget-s", "60", "--skip-pytest"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "gds_device_check.json").read_text())
    assert summary["paths"]["cpu"]["all_verified"] is True
    assert summary["paths"]["cpu"]["warm"]["gib_per_s"] > 0
    assert (out / "gds_probe.json").exists() and (out / "gds_bench_cpu.json").exists()
    for name in ("bounce", "kvikio-compat", "cufile"):
        p = summary["paths"][name]
        assert p.get("available") is False and p["reason"] or p.get("all_verified") is True
    assert not list(tmp_path.glob("iobench-gds-check-*"))  # the 8 MiB file was removed
