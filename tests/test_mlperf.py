"""MLPerf Storage workloads on the loader: simulated accelerators, AU, rules, --find-max."""

from __future__ import annotations

import json
import math

import pytest

from iobench.cli import main
from iobench.mlperf.findmax import find_max, headline
from iobench.mlperf.rules import compliance, datasize
from iobench.mlperf.run import MlperfConfig, run_mlperf, step_au


@pytest.fixture(scope="module")
def unet3d(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlperf") / "unet3d"
    assert main(["gen", "--workload", "unet3d", "--scale", "0.0001", "--num-samples", "28", "--out", str(out),
                 "--no-progress"]) == 0
    return str(out)


def test_datasize_is_five_times_client_memory(capsys):
    assert main(["mlperf", "datasize", "--workload", "unet3d", "--accelerators", "4",
                 "--client-memory", "512GiB"]) == 0
    out = capsys.readouterr().out
    # 5 x 512 GiB / 146,600,628 B = 18750.1 -> 18751 files, rounded up to a multiple of 4 accelerators
    assert math.ceil(5 * 512 * 2**30 / 146_600_628) == 18751
    assert out.startswith("18752 files")
    ds = datasize(512 * 2**30, 2, 8, 1251, 114_660)
    assert ds.bytes >= 5 * 2 * 512 * 2**30 and ds.files % 16 == 0
    assert (ds.files - 16) * 1251 * 114_660 < 5 * 2 * 512 * 2**30


def test_compliance_rules():
    assert compliance(5 * 2**30, 2**30, 1, False).compliant
    c = compliance(2**30, 2**30, 1, True)
    assert not c.compliant and "cold" in " ".join(c.notes)
    assert not compliance(10 * 2**30, 2**30, 1, False, scale=0.5).compliant


def test_step_au_and_interval():
    a = step_au([1.0] * 50, [0.9] * 50)
    assert a["au"] == pytest.approx(0.9) and a["au_ci95"] == pytest.approx([0.9, 0.9])
    b = step_au([1.0, 2.0] * 25, [0.9] * 50)
    assert b["au"] == pytest.approx(45 / 75)
    assert b["au_ci95"][0] < b["au"] < b["au_ci95"][1]


def test_accelerators_share_the_dataset_and_pass(unet3d):
    r = run_mlperf(MlperfConfig(dataset=unet3d, accelerators=2, compute_s=0.15, epochs=2, runs=2, cache="as-is",
                                workers=2))
    assert len(r["per_rank"]) == 2 and {p["rank"] for p in r["per_rank"]} == {0, 1}
    # each accelerator reads its own half: together, every sample once per epoch
    assert sum(p["samples"] for p in r["per_rank"]) == 28 * 2
    assert r["first_step_excluded"] and r["runs"] == 2 and len(r["per_run"]) == 2
    assert r["au_min"] == min(r["au_per_accelerator"])
    assert r["passed"] == (r["au_min"] >= 0.9)
    for p in r["per_rank"]:
        assert 0 <= p["au"] <= 1
        assert p["au_ci95"] is None or p["au_ci95"][0] <= p["au"] <= p["au_ci95"][1]   # None: too few steps
    assert not r["rule_compliant"]          # scaled down, and far under 5x memory


def test_slow_storage_fails_and_is_diagnosed_fetch_bound(unet3d):
    # 300 ms per read, 7 files a batch over 2 workers: >= 1.05 s of reading per 100 ms step, so in
    # the long run AU <= 0.1 / 1.05 < 10% (a bound, not a timing; batches read before the clock
    # starts lift a short run a little); without I/O the same accelerator only sleeps, so it clears
    # a 30% pass mark even on a loaded host -> the diagnosis is "fetch-bound".
    cfg = MlperfConfig(dataset=unet3d, accelerators=1, compute_s=0.1, epochs=1, runs=1, cache="as-is", workers=2,
                       emulate="const:300ms", min_steps=10, au_threshold=0.3)
    out = find_max(cfg, max_accelerators=2)
    assert out["max_accelerators_per_node"] == 0
    assert out["next_step"]["au_min"] < 0.2
    assert out["next_step"]["bound"] == "fetch-bound"
    assert out["headline"].startswith("this storage cannot keep even 1 simulated H100")


def test_headline_wording():
    h = headline("unet3d", "h100", 0.9, 12, {"accelerators": 13, "au_min": 0.87, "bound": "fetch-bound"}, False, 64)
    assert h == ("this storage keeps 12 simulated H100s per node at AU >= 90% on unet3d; "
                 "the 13th stalls at 87%: fetch-bound")


def test_cli_run_writes_mlperf_vocabulary(unet3d, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["mlperf", "run", unet3d, "--accelerators", "2", "--compute-s", "0.15", "--epochs", "1", "--runs", "1",
               "--cache", "as-is", "--workers", "1", "--json", str(out)])
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(("PASS", "FAIL")) and "[not rule-compliant]" in line
    data = json.loads(out.read_text())
    m = data["metrics"]["mlperf"]
    assert m["accelerators"] == 2 and len(m["per_rank"]) == 2 and "MB_per_s" in m and "AU_percent_min" in m
    assert data["metrics"]["accelerator_utilization"] == pytest.approx(m["AU_percent_min"] / 100)
    assert rc == (0 if m["AU_meets_expectation"] else 1)


@pytest.mark.parametrize("argv,field", [
    (["--workload", "resnet50", "--accelerator", "b200"], "--accelerator"),
    (["--workload", "unet3dd"], "--workload"),
    (["--accelerators", "0"], "--accelerators"),
    (["--emulate", "bogus:1"], "emulate"),
])
def test_bad_input_is_one_line_exit_2(unet3d, capsys, argv, field):
    assert main(["mlperf", "run", unet3d, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


def test_llama3_checkpoint_write_and_read(tmp_path):
    from iobench.mlperf.checkpoint import CkptWorkload, run_ckpt_workload

    out = run_ckpt_workload(CkptWorkload(model="llama3-8b", out=str(tmp_path / "ck"), scale=0.0001),
                            json_path=str(tmp_path / "ck.json"))
    on_disk = sum(p.stat().st_size for p in (tmp_path / "ck").rglob("*") if p.is_file() and "manifest" not in p.name
                  and not p.name.endswith(".json"))
    assert out["checkpoint_bytes"] <= on_disk < out["checkpoint_bytes"] * 1.1
    assert out["read"]["verified"] and out["read"]["bytes"] >= out["checkpoint_bytes"]
    assert out["write"]["GB_per_s"] == pytest.approx(out["checkpoint_bytes"] / out["write"]["seconds_per_checkpoint_mean"]
                                                     / 1e9)
    assert json.loads((tmp_path / "ck.json").read_text())["metrics"]["mlperf"]["model"] == "llama3-8b"


def _mpirun():
    import shutil
    import sys
    from pathlib import Path

    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else shutil.which("mpirun")


@pytest.mark.skipif(_mpirun() is None, reason="no MPI: pip install 'iobench[mpi]'")
def test_mpi_nodes_each_run_their_accelerators(unet3d, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "mpi.json"
    proc = subprocess.run([_mpirun(), "-n", "2", sys.executable, "-m", "iobench.cli", "mlperf", "run", unet3d,
                           "--accelerators", "2", "--compute-s", "0.05", "--epochs", "1", "--runs", "1",
                           "--cache", "as-is", "--workers", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode in (0, 1), proc.stderr
    d = json.loads(out.read_text())
    m = d["metrics"]["mlperf"]
    assert (m["nodes"], m["accelerators"]) == (2, 4)
    assert sorted(p["rank"] for p in d["per_rank"]) == [0, 1, 2, 3]
    assert all(p["steps"] >= 3 for p in d["per_rank"])       # lengthened: each share is one batch


def test_report_shows_the_answer(tmp_path):
    from iobench.mlperf.report import results_for
    from iobench.report.build import build_report

    fm = {"workload": "unet3d", "accelerator": "h100", "au_threshold": 0.9, "max_accelerators_per_node": 3,
          "search_limit": 8, "limit_reached": False, "at_max": None, "probes": [], "result_at_max": None,
          "next_step": {"accelerators": 4, "au_min": 0.87, "bound": "fetch-bound"},
          "headline": headline("unet3d", "h100", 0.9, 3, {"accelerators": 4, "au_min": 0.87, "bound": "fetch-bound"},
                               False, 8)}
    path = tmp_path / "fm.json"
    results_for(MlperfConfig(dataset=str(tmp_path)), fm, find_max=True).write(path)
    rep = build_report([str(path)], tmp_path / "rep")
    md = rep.markdown.read_text()
    assert "this storage keeps 3 simulated H100s per node at AU >= 90% on unet3d; the 4th stalls at 87%" in md
    assert "simulated accelerators sustained per node" in md


def test_find_max_never_claims_more_than_a_kernel_throttled_disk_can_feed(tmp_path, read_throttle):
    """Ground truth from the kernel: reads capped at B bytes/s can feed at most B / (0.9 d) accelerators
    at AU >= 90%, d = one accelerator's bytes per step / compute.  find-max must stay within that bound,
    and what it says was delivered must fit under the cap."""
    out = tmp_path / "u"
    assert main(["gen", "--workload", "unet3d", "--scale", "0.001", "--num-samples", "112", "--out", str(out),
                 "--no-progress"]) == 0
    from iobench.manifest import read_manifest
    from iobench.storage import open_backend

    m = read_manifest(open_backend(str(out)))
    cap, compute = 12_000_000, 0.1
    demand = 7 * m.total_bytes / m.total_samples / compute           # ~10 MB/s per accelerator
    bound = int(cap // (0.9 * demand))                                 # 1
    with read_throttle(str(out), cap):
        fm = find_max(MlperfConfig(dataset=str(out), compute_s=compute, epochs=1, runs=1, cache="cold", workers=2,
                                   min_steps=12), max_accelerators=3)
    assert fm["max_accelerators_per_node"] <= bound
    for p in fm["probes"]:
        assert p["throughput_bytes_per_s"] <= cap * 1.1
    assert fm["next_step"] is not None and fm["next_step"]["accelerators"] <= bound + 1
