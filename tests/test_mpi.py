"""Cluster runs under real MPI: `mpirun -n 3` (MPICH from the `mpi` extra, or a system MPI).

Each test launches the real CLI on three ranks and checks the world numbers against ground
truth computed another way: the manifest's byte and sample counts, the set of samples each
rank consumed, and histograms rebuilt from every rank's own encoding.
"""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from iobench.dist.aggregate import MergeSpec, merge, merge_hists, spread, straggler
from iobench.metrics import LatencyHistogram

HELPERS = Path(__file__).parent / "mpi_helpers"


def _have_mpi() -> bool:
    try:
        import mpi4py  # noqa: F401

        from iobench.dist.mpirun import find_mpirun

        find_mpirun()
        return True
    except Exception:
        return False


mpi = pytest.mark.skipif(not _have_mpi(), reason="no MPI: pip install 'iobench[mpi]'")


def ranks(n, argv, env=None, timeout=90, cwd=None):
    from iobench.dist.mpirun import run_ranks

    e = dict(os.environ, **(env or {}))
    e["PYTHONPATH"] = os.pathsep.join([str(HELPERS), e.get("PYTHONPATH", "")])
    return run_ranks(n, argv, env=e, timeout=timeout, cwd=cwd)


def iobench(*args):
    return [sys.executable, "-m", "iobench.cli", *args]


# ---------------------------------------------------------------- aggregation (no MPI needed)

def test_merged_histogram_is_the_histogram_of_every_ranks_samples():
    import numpy as np

    rng = np.random.default_rng(0)
    samples = [rng.lognormal(-4, 1 + r, 500 + 100 * r) for r in range(3)]   # ranks with different tails
    per_rank = []
    for r, xs in enumerate(samples):
        h = LatencyHistogram()
        for x in xs:
            h.record_s(x)
        per_rank.append({"wall_s": 1.0 + r, "bytes": 100 * (r + 1), "lat_hist": h.encode()})
    spec = MergeSpec(duration="wall_s", sums=("bytes",), hists={"lat_s": "lat_hist"},
                     rates={"throughput.bytes_per_s": "bytes"})
    out = merge(per_rank, spec, ["a", "a", "b"])
    truth = LatencyHistogram()
    for x in np.concatenate(samples):
        truth.record_s(x)
    assert out["lat_s"] == truth.summary()
    # the average of per-rank P99s is not the world P99 (the reason to merge)
    avg_p99 = sum(merge_hists([p["lat_hist"]]).summary()["p99"] for p in per_rank) / 3
    assert abs(avg_p99 - truth.summary()["p99"]) > 0.01 * truth.summary()["p99"]
    assert out["wall_s"] == 3.0 and out["bytes"] == 600
    assert out["throughput"]["bytes_per_s"] == pytest.approx(600 / 3.0)
    st = out["world"]["straggler"]
    assert st["slowest_rank"] == 2 and st["slowest_host"] == "b" and st["spread_s"] == pytest.approx(2.0)
    nodes = {n["host"]: n for n in out["world"]["per_node"]}
    assert nodes["a"]["ranks"] == [0, 1] and nodes["a"]["bytes"] == 300 and nodes["a"]["duration_s"] == 2.0
    assert spread([1.0, None, 3.0])["mean"] == 2.0
    assert straggler([2.0, 1.0])["slowest_rank"] == 0


# ---------------------------------------------------------------- load on 3 ranks

@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    from iobench.generate import GenSpec, generate

    url = str(tmp_path_factory.mktemp("mpi") / "tok")
    m = generate(GenSpec(format="raw", modality="tokens", num_samples=600, shard_size="40 samples", seq_len=32,
                         vocab_size=1000, fsync=False), url, progress=False)
    return url, m


@mpi
def test_load_on_3_ranks_reads_every_sample_exactly_once_and_sums_to_the_dataset(tokens, tmp_path):
    url, manifest = tokens
    rec = tmp_path / "rec"
    rec.mkdir()
    out = tmp_path / "load.json"
    p = ranks(3, iobench("load", url, "--workers", "1", "--batch-size", "10", "--compute-mode", "callback",
                         "--compute-fn", "h15_record:record", "--json", str(out)),
              env={"IOBENCH_TEST_RECORD_DIR": str(rec)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("results:") == 1          # rank 0 alone prints and writes
    doc = json.loads(out.read_text())
    m = doc["metrics"]
    # ground truth: the manifest's samples, and the bytes one process moves for the same work
    from iobench.loader.core import LoadConfig, run_load

    single = run_load(LoadConfig(dataset=url, workers=1, batch_size=10)).metrics
    assert m["samples"] == manifest.total_samples == single["samples"]
    assert m["bytes_read"] == single["bytes_read"] and 0 < m["bytes_read"] <= manifest.total_bytes
    # exactly once: the ranks' sample sets are disjoint and cover the dataset
    seen = [[int(line.split()[0]) for line in (rec / f"rank-{r}.txt").read_text().splitlines()] for r in range(3)]
    assert all(seen)
    flat = [i for s in seen for i in s]
    assert len(flat) == len(set(flat)) == manifest.total_samples
    assert [len(s) for s in seen] == [r["samples"] for r in doc["per_rank"]]
    # world = f(per rank)
    pr = doc["per_rank"]
    assert [r["rank"] for r in pr] == [0, 1, 2] and doc["world"]["size"] == 3
    assert doc["world"]["ranks_per_node"] and sum(doc["world"]["ranks_per_node"].values()) == 3
    assert m["wall_s"] == max(r["wall_s"] for r in pr)
    assert m["throughput"]["bytes_per_s"] == pytest.approx(m["bytes_read"] / m["wall_s"])
    assert m[STALL_RATIO] == max(r[STALL_RATIO] for r in pr)
    sp = m["world"]["spread"][STALL_RATIO]
    assert sp["min"] == min(r[STALL_RATIO] for r in pr) and sp["max"] == m[STALL_RATIO]
    assert m["batch_wait_s"] == merge_hists([r["batch_wait_hist"] for r in pr]).summary()
    assert m["batch_wait_s"]["count"] == sum(r["batch_wait_s"]["count"] for r in pr)
    assert m["world"]["straggler"]["slowest_rank"] in (0, 1, 2)
    # the world's intervals come from every rank's per-batch series, not rank 0's
    iv = m["intervals"]
    assert iv[STALL_RATIO]["value"] == pytest.approx(m[STALL_RATIO])
    assert iv[STALL_RATIO]["worst_rank"] == max(range(3), key=lambda r: pr[r][STALL_RATIO])
    assert len(iv[STALL_RATIO]["by_rank"]) == 3
    assert iv["batch_service_p99_s"]["n"] == sum(r["steps"] - 1 for r in pr)
    assert all("series" not in r for r in pr)


# ---------------------------------------------------------------- bad launches: exit 2, one line, no hang

@mpi
def test_ranks_disagreeing_on_config_exit_2_on_every_rank(tokens):
    url, _ = tokens
    from iobench.dist.mpirun import mpirun_argv, mpirun_env

    base = mpirun_argv(2, iobench("load", url, "--workers", "1", "--seed", "1"))
    argv = base + [":", "-n", "1", *iobench("load", url, "--workers", "1", "--seed", "2")]
    p = subprocess.run(argv, env=mpirun_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "disagree" in ln]
    assert len(lines) == 3 and "'seed'" in lines[0] and "rank 2" in lines[0]
    assert "Traceback" not in p.stderr


@mpi
def test_a_rank_that_cannot_see_the_dataset_stops_every_rank(tokens, tmp_path):
    url, _ = tokens
    from iobench.dist.mpirun import mpirun_argv, mpirun_env

    here = Path(url).parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rel = Path(url).name          # the same relative path, resolved in another directory on rank 2
    argv = mpirun_argv(2, ["-wdir", str(here), *iobench("load", rel, "--workers", "1")])
    argv += [":", "-n", "1", "-wdir", str(elsewhere), *iobench("load", rel, "--workers", "1")]
    if "mpich" not in str(argv) and "-wdir" not in subprocess.run([argv[0], "--help"], capture_output=True,
                                                                   text=True).stdout + "mpich":
        pytest.skip("this mpirun has no per-segment -wdir")
    p = subprocess.run(argv, env=mpirun_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "load inputs" in ln]
    assert len(lines) == 3 and "rank 2" in lines[0], p.stderr


@mpi
def test_mpi4py_missing_under_mpirun_is_one_line_per_rank(tokens):
    url, _ = tokens
    p = ranks(3, iobench("load", url), env={"PYTHONPATH": str(HELPERS / "no_mpi4py")})
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 3 and all("mpi4py" in ln and "iobench[mpi]" in ln for ln in lines), p.stderr


@mpi
def test_a_rank_that_never_arrives_ends_the_job_at_the_deadline(tokens):
    url, _ = tokens
    from iobench.dist.mpirun import mpirun_argv, mpirun_env

    argv = mpirun_argv(2, iobench("load", url, "--workers", "1"))
    argv += [":", "-n", "1", sys.executable, "-c", "from mpi4py import MPI; import time; time.sleep(60)"]
    env = mpirun_env(dict(os.environ, IOBENCH_COLLECTIVE_TIMEOUT_S="2"))
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=50)
    assert p.returncode != 0
    assert "never arrived" in p.stderr and "IOBENCH_COLLECTIVE_TIMEOUT_S" in p.stderr


# ---------------------------------------------------------------- gen and stage on 3 ranks

@mpi
def test_gen_on_3_ranks_is_byte_identical_to_one_process_and_published_once(tmp_path):
    from iobench.generate import GenSpec, generate
    from iobench.manifest import read_manifest
    from iobench.storage import open_backend

    spec = ["--format", "tfrecord", "--modality", "tokens", "--num-samples", "900", "--shard-size", "50 samples",
            "--seq-len", "16", "--no-progress"]
    out = tmp_path / "g3"
    p = ranks(3, iobench("gen", *spec, "--out", str(out), "--json", str(tmp_path / "g.json")))
    assert p.returncode == 0, p.stderr
    one = generate(GenSpec(format="tfrecord", modality="tokens", num_samples=900, shard_size="50 samples",
                           seq_len=16), str(tmp_path / "g1"), progress=False)
    three = read_manifest(open_backend(str(out)))
    assert [(s.path, s.bytes, s.checksum) for s in three.shards] == [(s.path, s.bytes, s.checksum) for s in one.shards]
    doc = json.loads((tmp_path / "g.json").read_text())
    pr = doc["per_rank"]
    assert [r["shards"] for r in pr] == [6, 6, 6] and sum(r["bytes"] for r in pr) == three.total_bytes
    assert sorted(r["first_sample"] for r in pr) == [0, 300, 600]       # disjoint contiguous ranges
    assert doc["metrics"]["world"]["duration_s"] == max(r["write_s"] for r in pr)


@mpi
def test_stage_on_3_ranks_stages_each_shard_once(tokens, tmp_path):
    url, manifest = tokens
    from iobench.tiers.config import TierSpec, TiersConfig, write_tiers_file

    tiers = write_tiers_file(TiersConfig(tiers=(TierSpec(name="nvme", url=str(tmp_path / "nvme")),)),
                             str(tmp_path / "tiers.yaml"))
    out = tmp_path / "st.json"
    p = ranks(3, iobench("stage", url, "--tiers", tiers, "--epochs", "1", "--json", str(out)))
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    m = doc["metrics"]
    assert m["staging"]["staged_shards"] == len(manifest.shards)
    assert m["staging"]["bytes"] == manifest.total_bytes
    assert m["epochs"][0]["bytes"] == manifest.total_bytes
    assert sum(r["rank_shards"] for r in doc["per_rank"]) == len(manifest.shards)


# ---------------------------------------------------------------- checkpoints across ranks

CKPT = ["--params", "3e6", "--dp", "3", "--zero", "3", "--count", "2", "--mode", "sync"]


def _manifest(root, step):
    return json.loads((Path(root) / f"step-{step:012d}" / "manifest.json").read_text())


@mpi
def test_commit_waits_for_the_slowest_rank(tmp_path):
    dur = tmp_path / "durable"
    out = tmp_path / "ck.json"
    # rank 2's files become durable ~2 s after the others' (it pauses before writing them); the
    # thresholds leave 1 s for the others' own writes on a loaded machine
    p = ranks(3, iobench("ckpt", *CKPT, "--durable", str(dur), "--json", str(out)),
              env={"IOBENCH_CKPT_DELAY_AT": "before_shard_write:2.0@2"})
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    ck = doc["metrics"]["checkpoint"]
    assert ck["saves"] == {"committed": 2, "total": 2}
    for c in ck["commits"]:
        durable_at = c["durable_at_by_rank"]
        assert durable_at[2] - min(durable_at[:2]) >= 1.0      # the straggler
        assert c["committed_at"] >= max(durable_at)             # the commit came after it
    for step in (1, 2):
        m = _manifest(dur, step)
        assert sorted(f["rank"] for f in m["files"]) == [0, 1, 2]
        assert m["extra"]["world"]["size"] == 3
    # MLPerf timing: each save as long as its slowest rank
    assert ck["commit_latency_s"]["min"] >= 2.0
    for row in ck["per_save"]:
        assert row["local_write_s"] == max(row["local_write_s_by_rank"]) >= 2.0
    assert ck["bytes_per_save"] == sum(r["checkpoint"]["state"]["bytes_per_save"] for r in doc["per_rank"])
    assert ck["world"]["straggler"]["slowest_rank"] == 2


@mpi
def test_a_killed_rank_blocks_the_commit_and_restore_returns_the_previous_step(tmp_path):
    from iobench.checkpointing import commit_point as cp
    from iobench.storage import open_backend

    dur = tmp_path / "durable"
    # rank 1 is SIGKILLed after writing its step-2 files, before reporting them
    p = ranks(3, iobench("ckpt", *CKPT, "--durable", str(dur)),
              env={"IOBENCH_CKPT_CRASH_AT": "before_rank_report:2@1"})
    assert p.returncode != 0
    b = open_backend(str(dur))
    assert cp.committed_steps(b) == [1]
    assert (dur / "step-000000000002").exists() and not (dur / "step-000000000002" / "manifest.json").exists()
    # restore on 2 processes, resharded 3 -> 2: each reads only the files that hold its boxes
    out = tmp_path / "rs.json"
    p = ranks(2, iobench("ckpt", "restore", "--durable", str(dur), "--ranks", "2", "--json", str(out)))
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    ck = doc["metrics"]["checkpoint"]
    assert ck["step"] == 1 and ck["verified"] and ck["resharded"]
    pr = [r["checkpoint"] for r in doc["per_rank"]]
    assert [r["target_ranks"] for r in pr] == [[0], [1]]
    m = _manifest(dur, 1)
    size = {f["rank"]: f["bytes"] for f in m["files"]}
    for r in pr:
        assert r["restore_bytes"] == sum(size[s] for s in r["files_read"])
        assert len(r["files_read"]) < 3           # nobody read the whole checkpoint
    assert ck["restore_bytes"] == sum(r["restore_bytes"] for r in pr)
    assert ck["restore_s"] == max(r["restore_s"] for r in pr)


# ---------------------------------------------------------------- aggregate probes (IOR / mdtest style)

@mpi
def test_file_probe_n_to_n_and_n_to_1_on_3_ranks(tmp_path):
    target = tmp_path / "pfs"
    out = tmp_path / "pf.json"
    p = ranks(3, iobench("probe", "file", str(target), "--bs", "256KiB", "--file-size", "2MiB", "--json", str(out)))
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    agg = doc["metrics"]["aggregate"]["file"]
    per = [r["aggregate"]["file"] for r in doc["per_rank"]]
    assert agg["bytes_per_rank"] == 2 * 2**20
    for layout in ("n-n", "n-1"):
        for phase in ("write", "read"):
            a = agg[layout][phase]
            ranks_ = [x[layout][phase] for x in per]
            assert a["bytes"] == 3 * 2 * 2**20 == sum(r["bytes"] for r in ranks_)   # every byte read back
            assert a["ops"] == 3 * 8
            assert a["seconds"] == max(r["seconds"] for r in ranks_)
            assert a["bytes_per_s"] == pytest.approx(a["bytes"] / a["seconds"])
            assert a["latency_s"]["count"] == a["ops"]
    assert not target.exists()   # every rank removed what it made; rank 0 the folders and the target it made


@mpi
def test_metadata_probe_unique_and_shared_dirs_on_3_ranks(tmp_path):
    target = tmp_path / "md"
    out = tmp_path / "pm.json"
    p = ranks(3, iobench("probe", "metadata", str(target), "--files", "300", "--file-size", "1KiB",
                         "--json", str(out)))
    assert p.returncode == 0, p.stderr
    agg = json.loads(out.read_text())["metrics"]["aggregate"]["metadata"]
    for mode in ("unique", "shared"):
        for phase in ("create", "stat", "delete"):
            assert agg[mode][phase]["ops"] == 300
            assert agg[mode][phase]["ops_per_s"] == pytest.approx(300 / agg[mode][phase]["seconds"])
    assert agg["unique"]["create"]["bytes"] == 300 * 1024
    assert not target.exists()


@mpi
def test_s3_probe_put_get_from_3_ranks(s3_env, s3_prefix, tmp_path):
    out = tmp_path / "ps.json"
    p = ranks(3, iobench("probe", "s3", s3_prefix, "--sizes", "64KiB", "--concurrency", "2", "--size", "3MiB",
                         "--json", str(out)))
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    agg = doc["metrics"]["aggregate"]["s3"]
    n = agg["objects_per_rank"]
    assert agg["put"]["ops"] == agg["get"]["ops"] == 3 * n
    assert agg["put"]["bytes"] == agg["get"]["bytes"] == 3 * n * 64 * 1024
    import s3fs

    fs = s3fs.S3FileSystem(**s3_env.storage_options())
    found = fs.find(s3_prefix.removeprefix("s3://"), detail=True)
    assert not [k for k, v in found.items() if v.get("type") != "directory"]   # SeaweedFS lists empty folders


@mpi
def test_run_suite_on_3_ranks_needs_a_shared_work_dir_and_writes_one_run_json(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    p = ranks(3, iobench("run", "--config", str(cfg), "--out", str(tmp_path / "out")))   # no such file
    assert p.returncode == 2
    cfg.write_text("planner:\n  accelerators: 8\n")
    p = ranks(3, iobench("run", "--config", str(cfg), "--out", str(tmp_path / "out")))
    assert p.returncode == 2 and len([ln for ln in p.stderr.splitlines() if "work_dir" in ln]) == 3, p.stderr
    shared = tmp_path / "shared"
    shared.mkdir()
    cfg.write_text(f"work_dir: {shared}\n")
    p = ranks(3, iobench("run", "--config", str(cfg), "--stages", "generate,load", "--out", str(tmp_path / "out")))
    assert p.returncode == 0, p.stderr
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["world"]["size"] == 3 and set(run["metrics"]) >= {"generate", "load"}
    load = json.loads((tmp_path / "out" / "load-cold.json").read_text())
    assert len(load["per_rank"]) == 3 and load["metrics"]["bytes_read"] == run["metrics"]["load"]["bytes_read"]
    assert list(shared.iterdir()) == []           # the run's folder is removed; nothing else touched


@mpi
def test_smallfiles_probe_on_3_ranks_reads_every_sample_of_every_format(tmp_path):
    target = tmp_path / "sf"
    out = tmp_path / "sf.json"
    p = ranks(3, iobench("probe", "smallfiles", str(target), "--samples", "90", "--modality", "tokens",
                         "--formats", "raw", "--workers", "1", "--json", str(out)))
    assert p.returncode == 0, p.stderr
    agg = json.loads(out.read_text())["metrics"]["aggregate"]["smallfiles"]
    assert agg["formats"]["files"]["samples"] == agg["formats"]["raw"]["samples"] == 90
    assert agg["formats"]["files"]["opens"] == 90 and agg["formats"]["raw"]["opens"] < 90
    f = agg["formats"]["files"]
    assert f["samples_per_s"] == pytest.approx(90 / f["seconds"])
    assert not target.exists()
