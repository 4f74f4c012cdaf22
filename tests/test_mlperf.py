"""MLPerf Storage workloads on the loader: simulated accelerators, AU, rules, --find-max."""

from __future__ import annotations

import json

import pytest

from iobench.cli import main
from iobench.mlperf.findmax import find_max, headline
from iobench.mlperf.rules import datasize
from iobench.mlperf.run import MlperfConfig, run_mlperf, step_au


@pytest.fixture(scope="module")
def unet3d(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlperf") / "unet3d"
    assert main(["gen", "--workload", "unet3d", "--scale", "0.0001", "--num-samples", "28", "--out", str(out),
                 "--no-progress"]) == 0
    return str(out)


@pytest.mark.parametrize("memory,accelerators,want", [
    ("64GiB", 8, 28000),     # 500 steps x batch 7 x 8 decides (5 x 64 GiB // 146,600,628 B = 2343)
    ("512GiB", 8, 28000),    # 5 x 512 GiB // 146,600,628 B = 18750 < 28000
    ("512GiB", 4, 18750),    # memory decides: 500 x 7 x 4 = 14000 < 18750
])
def test_datasize_is_mlperfs_calculate_training_data_size(capsys, memory, accelerators, want):
    assert main(["mlperf", "datasize", "--workload", "unet3d", "--accelerators", str(accelerators),
                 "--client-memory", memory]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{want} files") and "calculate_training_data_size" in out


def test_datasize_both_rules_over_nodes():
    # resnet50: 1251 samples per file, batch 400; 2 nodes of 8 accelerators
    ds = datasize(64 * 2**30, 2, 8, 1251, 114660.07, 400)
    assert ds.files_by_memory == int(5 * 2 * 64 * 2**30 // (1251 * 114660.07))
    assert ds.files_by_steps == 500 * 16 * 400 // 1251
    assert ds.files == max(ds.files_by_memory, ds.files_by_steps)
    assert ds.bound_by == ("memory" if ds.files_by_memory > ds.files_by_steps else "steps")


def test_workload_table_matches_mlperf_configs():
    from iobench.mlperf.workloads import TABLE

    u, r, c = TABLE["unet3d"], TABLE["resnet50"], TABLE["cosmoflow"]
    assert (u.batch_size, u.read_threads, u.compute_s, u.au_threshold) == (7, 4, {"a100": 0.636, "h100": 0.323}, 0.9)
    assert u.checkpoint.after_epoch == 5 and u.checkpoint.model_bytes == 499153191
    assert (r.batch_size, r.read_threads, r.compute_s) == (400, 8, {"a100": 0.435, "h100": 0.224})
    assert r.loader_shuffle() == (False, 0)          # resnet50: no file or sample shuffle
    assert (c.batch_size, c.compute_s, c.au_threshold) == (1, {"a100": 0.00551, "h100": 0.0035}, 0.7)
    assert c.loader_shuffle() == (True, 2)           # cosmoflow: shuffle_size 2
    for w in TABLE.values():
        assert w.drop_last and w.epochs == 5 and "b200" not in w.compute_s
        for key in ("batch_size", "read_threads", "au_threshold", "epochs", "compute_s", "shuffle", "drop_last"):
            assert "configs/dlio/workload/" in w.source(key) or "dlio_benchmark" in w.source(key), key


def test_compliance_block():
    from iobench.mlperf.rules import Compliance, rule

    ok = Compliance((rule("a", "x", "x", True, "s §1"), rule("b", "y", "y", True, "s §2")))
    assert ok.compliant and ok.verdict == "rule-compliant"
    bad = Compliance((rule("runs", "5", "1", False, "s §3"), rule("b", "y", "y", True, "s §2")))
    assert not bad.compliant and bad.verdict == "not rule-compliant: runs"
    assert [r["source"] for r in bad.as_dict()["rules"]] == ["s §3", "s §2"]


def test_steps_per_epoch_drops_the_remainder():
    from iobench.mlperf.run import steps_per_epoch

    assert steps_per_epoch(16 * 1251, 1, 400) == 50        # DLIO's 50 where iobench once ran 56
    assert steps_per_epoch(294, 4, 7) == 10


def test_step_au_and_interval():
    a = step_au([1.0] * 50, [0.9] * 50)
    assert a["au"] == pytest.approx(0.9) and a["au_ci95"] == pytest.approx([0.9, 0.9])
    b = step_au([1.0, 2.0] * 25, [0.9] * 50)
    assert b["au"] == pytest.approx(45 / 75)
    assert b["au_ci95"][0] < b["au"] < b["au_ci95"][1]


def test_accelerators_share_the_dataset_and_pass(unet3d, tmp_path):
    r = run_mlperf(MlperfConfig(dataset=unet3d, accelerators=2, compute_s=0.1, epochs=2, runs=2, cache="as-is",
                                workers=2, checkpoint_folder=str(tmp_path / "ck"), checkpoint_scale=0.0001))
    assert len(r["per_rank"]) == 2 and {p["rank"] for p in r["per_rank"]} == {0, 1}
    # 28 samples, batch 7, 2 accelerators: floor(28 / 7 / 2) = 2 steps per epoch, every rank
    assert r["steps_per_epoch"] == 2 and all(p["steps"] == 2 for p in r["per_rank"])  # 1 measured per epoch
    assert sum(p["samples"] for p in r["per_rank"]) == 2 * 2 * 7 * 2
    assert r["warmup_run"] and r["runs"] == 2 and len(r["per_run"]) == 2 and len(set(r["seeds"])) == 2
    # the pass metric: mean over ranks and epochs, then over runs
    for run in r["per_run"]:
        assert run["au"] == pytest.approx(sum(run["au_per_epoch"]) / 2)
        assert run["au_per_epoch"][0] == pytest.approx(sum(p["au_per_epoch"][0] for p in run["per_rank"]) / 2)
    assert r["au"] == pytest.approx(sum(r["au_per_run"]) / 2)
    assert r["passed"] == all(a >= 0.9 for a in r["au_per_run"])
    assert r["au_min"] <= r["au"]
    for p in r["per_rank"]:
        assert 0 <= p["au"] <= 1
    assert r["checkpoint"] is None                     # 2 epochs: unet3d checkpoints after epoch 5
    c = r["compliance"]
    assert not c["compliant"] and not r["rule_compliant"]
    broken = {x["rule"] for x in c["rules"] if not x["ok"]}
    assert {"dataset size", "dataset content", "step time", "epochs", "runs", "checkpoint"} <= broken
    assert "warm-up run" not in broken and "seeds" not in broken
    assert all(x["source"] for x in c["rules"])
    assert r["rule_verdict"].startswith("not rule-compliant: ")
    assert not list((tmp_path / "ck").glob("*.ckpt"))


def test_unet3d_checkpoint_after_epoch_5(unet3d, tmp_path):
    r = run_mlperf(MlperfConfig(dataset=unet3d, accelerators=1, compute_s=0.01, runs=1, warmup=False,
                                cache="as-is", workers=1, checkpoint_folder=str(tmp_path / "ck"),
                                checkpoint_scale=0.001))
    assert r["epochs"] == 5 and r["checkpoint"]["after_epoch"] == 5
    assert r["checkpoint"]["bytes"] == int(499153191 * 0.001) and r["checkpoint"]["written"] == 1
    rule = next(x for x in r["compliance"]["rules"] if x["rule"] == "checkpoint")
    assert not rule["ok"]                              # scaled: not MLPerf's 499,153,191 B
    assert not list((tmp_path / "ck").glob("*.ckpt"))  # what it wrote, it removed


def test_mib_per_s_is_dlios_record_length_count(unet3d):
    r = run_mlperf(MlperfConfig(dataset=unet3d, accelerators=1, compute_s=0.01, epochs=1, runs=1, warmup=False,
                                cache="as-is", workers=1, checkpoint=False))
    assert r["MiB_per_s_dlio"] == pytest.approx(r["samples_per_s"] * 146600628 * 0.0001 / 2**20)
    assert r["MB_per_s_read"] == pytest.approx(r["throughput_bytes_per_s"] / 1e6)


def test_slow_storage_fails_and_is_diagnosed_fetch_bound(unet3d):
    # 300 ms per read, 7 files a batch over 2 workers: >= 1.05 s of reading per 100 ms step, so in
    # the long run AU <= 0.1 / 1.05 < 10% (a bound, not a timing; batches read before the clock
    # starts lift a short run a little); without I/O the same accelerator only sleeps, so it clears
    # a 30% pass mark even on a loaded host -> the diagnosis is "fetch-bound".
    cfg = MlperfConfig(dataset=unet3d, accelerators=1, compute_s=0.1, epochs=1, runs=1, cache="as-is", workers=2,
                       emulate="const:300ms", min_steps=10, au_threshold=0.3)
    out = find_max(cfg, max_accelerators=2)
    assert out["max_accelerators_per_node"] == 0
    assert out["next_step"]["au"] < 0.2
    assert out["next_step"]["bound"] == "storage-bound"
    # the host's read ceiling stands beside it: 300 ms a read delivers far under it
    ceiling = out["next_step"]["host_ceiling"]
    assert ceiling["bytes_per_s"] > out["next_step"]["delivered_bytes_per_s"]
    assert out["headline"].startswith("this storage cannot keep even 1 simulated H100")


def test_headline_wording():
    h = headline("unet3d", "h100", 0.9, 12, {"accelerators": 13, "au": 0.87, "bound": "storage-bound"}, False, 64)
    assert h == ("this storage keeps 12 simulated H100s per node at AU >= 90% on unet3d; "
                 "the 13th stalls at 87%: storage-bound")


def test_cli_run_writes_mlperf_vocabulary(unet3d, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["mlperf", "run", unet3d, "--accelerators", "2", "--compute-s", "0.15", "--epochs", "1", "--runs", "1",
               "--cache", "as-is", "--workers", "1", "--json", str(out)])
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(("PASS", "FAIL")) and "not rule-compliant: " in line and "runs" in line
    data = json.loads(out.read_text())
    m = data["metrics"]["mlperf"]
    assert m["accelerators"] == 2 and len(m["per_rank"]) == 2 and "MB_per_s_read" in m and "MiB_per_s_dlio" in m
    assert data["metrics"]["accelerator_utilization"] == pytest.approx(m["AU_percent"] / 100)
    assert m["compliance"]["rules"] and not m["rule_compliant"]
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


def test_llama3_checkpoint_write_then_read_max_and_min_over_ranks(tmp_path):
    from iobench.checkpointing.state import preset, rank_bytes
    from iobench.mlperf.checkpoint import CkptWorkload, run_ckpt_workload

    w = CkptWorkload(model="llama3-70b", out=str(tmp_path / "ck"), scale=0.00002, checkpoints=3, interval_s=0.05,
                     runs=2)
    out = run_ckpt_workload(w, json_path=str(tmp_path / "ck.json"))
    sizes = rank_bytes(preset("llama3-70b", scale=0.00002))
    assert out["processes"] == 8 and out["ranks_in_model"] == 64               # subset mode: 8 of 8x1x8
    assert out["bytes_written_per_checkpoint"] == sum(sizes[:8])
    for run in out["per_run"]:
        for phase in ("write", "read"):
            ph = run[phase]
            assert len(ph["duration_s_per_checkpoint"]) == 3
            # the slowest rank took the duration, so the minimum per-rank rate is at most its bytes / duration
            # (an aggregate -- all ranks' bytes over it -- would be about 8x that)
            for d, thr in zip(ph["duration_s_per_checkpoint"], ph["throughput_min_rank_GB_per_s_per_checkpoint"]):
                assert thr * 1e9 <= max(sizes[:8]) / d * 1.0001
    assert out["write"]["duration_s"] == pytest.approx(
        sum(r["write"]["duration_s_mean"] for r in out["per_run"]) / 2)
    assert not (tmp_path / "ck").exists()                                        # what it wrote, it removed
    c = out["compliance"]
    assert not c["compliant"] and out["rule_verdict"].startswith("not rule-compliant: ")
    broken = {x["rule"] for x in c["rules"] if not x["ok"]}
    assert broken == {"checkpoint size", "checkpoints", "interval", "runs"}
    assert json.loads((tmp_path / "ck.json").read_text())["metrics"]["mlperf"]["model"] == "llama3-70b"


def test_ckpt_duration_is_max_and_throughput_min_over_ranks():
    from iobench.mlperf.checkpoint import _summarize

    s = _summarize([[1.0, 2.0], [4.0, 1.0]], [100, 200])
    assert s["duration_s_per_checkpoint"] == [4.0, 2.0]
    assert [x * 1e9 for x in s["throughput_min_rank_GB_per_s_per_checkpoint"]] == pytest.approx([50.0, 50.0])


@pytest.mark.parametrize("argv,field", [
    (["--model", "llama3-9b"], "--model"),
    (["--processes", "9"], "--processes"),
    (["--interval-s", "-1"], "--interval-s"),
])
def test_ckpt_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, field):
    assert main(["mlperf", "ckpt", "--out", str(tmp_path / "c"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err
    assert not (tmp_path / "c").exists()


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
                           "--min-steps", "3", "--cache", "as-is", "--workers", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode in (0, 1), proc.stderr
    d = json.loads(out.read_text())
    m = d["metrics"]["mlperf"]
    assert (m["nodes"], m["accelerators"]) == (2, 4)
    assert sorted(p["rank"] for p in d["per_rank"]) == [0, 1, 2, 3]
    assert all(p["steps"] == 2 for p in d["per_rank"])       # lengthened to 3 per epoch: 2 measured


def test_report_shows_the_answer(tmp_path):
    from iobench.mlperf.report import results_for
    from iobench.report.build import build_report

    fm = {"workload": "unet3d", "accelerator": "h100", "au_threshold": 0.9, "max_accelerators_per_node": 3,
          "search_limit": 8, "limit_reached": False, "at_max": None, "probes": [], "result_at_max": None,
          "next_step": {"accelerators": 4, "au": 0.87, "bound": "storage-bound"},
          "headline": headline("unet3d", "h100", 0.9, 3, {"accelerators": 4, "au": 0.87, "bound": "storage-bound"},
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
    # 16 steps per epoch at 3 accelerators: a short epoch's first step (excluded, as MLPerf does) hides the
    # read-ahead of the steps after it, and 8-step epochs read AU 83-88% at 2 accelerators for a truth of 60%
    assert main(["gen", "--workload", "unet3d", "--scale", "0.001", "--num-samples", "336", "--out", str(out),
                 "--no-progress"]) == 0
    from iobench.manifest import read_manifest
    from iobench.storage import open_backend

    m = read_manifest(open_backend(str(out)))
    cap, compute = 12_000_000, 0.1
    demand = 7 * m.total_bytes / m.total_samples / compute           # ~10 MB/s per accelerator
    bound = int(cap // (0.9 * demand))                                 # 1
    with read_throttle(str(out), cap):
        fm = find_max(MlperfConfig(dataset=str(out), compute_s=compute, epochs=1, runs=1, cache="cold", workers=2),
                      max_accelerators=3)
    assert fm["max_accelerators_per_node"] <= bound
    for p in fm["probes"]:
        assert p["throughput_bytes_per_s"] <= cap * 1.1
    assert fm["next_step"] is not None and fm["next_step"]["accelerators"] <= bound + 1
    assert fm["next_step"]["storage_ceiling"]["bytes_per_s"] <= cap * 1.1


def test_min_steps_on_a_cold_cache_adds_cold_passes_never_cached_repeats(tmp_path, read_throttle):
    """--min-steps on a cold run: repeating an epoch's samples inside it read them from the page cache the
    first pass filled (2 accelerators on a 12 MB/s disk delivered 1.04-1.06x the cap at 12 steps for 8).
    Each epoch becomes cold passes instead; what a run says was delivered fits under the kernel's cap."""
    out = tmp_path / "u"
    assert main(["gen", "--workload", "unet3d", "--scale", "0.001", "--num-samples", "112", "--out", str(out),
                 "--no-progress"]) == 0
    cap = 12_000_000
    with read_throttle(str(out), cap):
        r = run_mlperf(MlperfConfig(dataset=str(out), accelerators=2, compute_s=0.1, epochs=1, runs=1,
                                    warmup=False, cache="cold", workers=2, min_steps=24))
    assert r["steps_per_epoch"] == 8 and r["epochs"] == 3          # 112 / (2 x 7) = 8 steps; 24 / 8 passes
    assert any("3 cold passes per epoch" in w for w in r["warnings"])
    assert r["throughput_bytes_per_s"] <= cap * 1.1
    assert r["au"] < 0.9                                              # truth: 12 MB/s for 20 MB/s of demand


def test_tfrecord_batch_is_cut_across_read_threads(tmp_path):
    """A tf.data-style workload (stream, batch divisible by read threads): each MLPerf step takes one
    piece from every reader, every step is a full batch, and the epoch has floor(samples / batch) steps."""
    from iobench.mlperf.run import loader_group
    from iobench.mlperf.workloads import TABLE

    assert loader_group(TABLE["resnet50"], 8) == 8 and loader_group(TABLE["cosmoflow"], 4) == 1
    assert loader_group(TABLE["unet3d"], 4) == 1
    wl = tmp_path / "tfs.yaml"
    wl.write_text("gen: {format: tfrecord, modality: records, num_samples: 100, shard_size: 10 samples,\n"
                  "      record_bytes: 2000, record_bytes_stdev: 0, checksum: xxh64, seed: 0}\n"
                  "mlperf: {access: stream, batch_size: 8, read_threads: 2, au_threshold: 0.5, epochs: 2,\n"
                  "         compute_s: {h100: 0.02}, file_shuffle: false, sample_shuffle: false}\n")
    data = tmp_path / "d"
    assert main(["gen", "--workload", str(wl), "--out", str(data), "--no-progress"]) == 0
    r = run_mlperf(MlperfConfig(dataset=str(data), workload=str(wl), runs=1, warmup=False, cache="as-is"))
    assert r["steps_per_epoch"] == 100 // 8                       # 12: the 4 left over are dropped
    p = r["per_rank"][0]
    assert p["samples"] == 2 * 12 * 8                               # full batches only
    assert p["steps"] == 2 * (12 - 1)                               # MLPerf steps measured, first of each epoch out
    assert len(p["au_per_epoch"]) == 2
    w = next(x for x in r["compliance"]["rules"] if x["rule"] == "workload values")
    assert not w["ok"] and not r["rule_compliant"]                  # a user's YAML is an open experiment


@pytest.mark.parametrize("no_io, near, contention, share, want", [
    (True, False, None, None, "storage-bound"),
    (True, False, 0.10, None, "storage-bound"),
    (True, False, 0.40, None, "host-bound"),     # the read path waited for a CPU: the no-I/O run does not read
    (False, False, 0.0, None, "host-bound"),     # fails without I/O too
    (True, True, 0.0, None, "host-bound"),       # storage delivered near this host's read ceiling
    # delivered what the storage itself reads: storage-bound, however short of CPU the host also was
    (True, False, 0.34, 0.91, "storage-bound"),  # a 350 MB/s throttled disk at 319 MB/s, load 6-7
    (True, True, 0.40, 0.90, "storage-bound"),
    (True, False, 0.75, 0.49, "host-bound"),     # unthrottled: the disk reads 794 MB/s, the loaders took 392
    (False, False, 0.0, 0.95, "host-bound"),     # not even without I/O: the host is short first
])
def test_a_failing_count_is_labelled_by_the_host_and_storage_evidence(no_io, near, contention, share, want):
    from iobench.mlperf.findmax import label_stop

    assert label_stop(no_io, near, contention, share) == want


def test_the_storage_ceiling_reads_the_dataset_cold_and_under_the_kernel_cap(tmp_path, read_throttle):
    """The storage's own ceiling (large parallel reads of the dataset's files): never above what the
    kernel lets through, and the pages it touched dropped again (the next run reads cold)."""
    from iobench.io.pagecache import residency
    from iobench.manifest import read_manifest
    from iobench.mlperf.findmax import storage_ceiling
    from iobench.storage import open_backend

    out = tmp_path / "u"
    assert main(["gen", "--workload", "unet3d", "--scale", "0.001", "--num-samples", "224", "--out", str(out),
                 "--no-progress"]) == 0
    cap = 12_000_000     # 33 MB of files: 2 s of reads are mostly past the throttle's first slice
    with read_throttle(str(out), cap):
        c = storage_ceiling(MlperfConfig(dataset=str(out)), threads=4, time_s=2.0)
    assert c is not None and c["bytes"] > 0 and c["threads"] == 4
    assert c["bytes_per_s"] <= cap * 1.1
    b = open_backend(str(out))
    assert residency(b, [s.path for s in read_manifest(b).shards]) < 0.05
