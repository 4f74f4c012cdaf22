"""Storage probe on local directories: safety, engines, cache state, metadata, small files, CLI."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from iobench.config import build
from iobench.errors import ConfigError
from iobench.io import pagecache
from iobench.probe import fio_engine, py_engine
from iobench.probe.file_probe import FileProbeConfig, run_file_probe
from iobench.probe.jobs import Job
from iobench.probe.metadata import MetadataConfig, run_metadata_probe
from iobench.probe.safety import WORK_PREFIX, ProbeArea

TINY_FILE = {"rw": ["read", "randread", "write"], "bs": ["4KiB", "64KiB"], "qd": [1, 4], "io": ["buffered"],
             "runtime": "0.05s", "file_size": "2MiB"}
needs_fio = pytest.mark.skipif(not fio_engine.available(), reason="fio is not installed")


def _all_files(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


# -- safety ----------------------------------------------------------------------------------

def test_refuses_non_empty_target_without_force(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not empty.*--force"):
        ProbeArea.open(str(tmp_path), 1 << 20)
    assert _all_files(tmp_path) == ["precious.txt"]


def test_force_writes_only_in_own_folder_and_removes_only_its_files(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    area = ProbeArea.open(str(tmp_path), 16 << 20, force=True)
    assert os.path.dirname(area.work.root) == str(tmp_path)
    assert os.path.basename(area.work.root).startswith(WORK_PREFIX)
    cfg = build(MetadataConfig, {"files": 40, "workers": 2, "dirs": 3})
    run_metadata_probe(area, cfg)
    # a file the probe did not create appears in its folder meanwhile: it must survive
    stranger = os.path.join(area.work.root, "md", "someone-elses.txt")
    with open(stranger, "w") as f:
        f.write("not the probe's")
    area.close()
    assert sorted(_all_files(tmp_path)) == sorted(["precious.txt", os.path.relpath(stranger, tmp_path)])
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_created_target_is_removed_and_size_cap_enforced(tmp_path):
    target = tmp_path / "new"
    area = ProbeArea.open(str(target), 1 << 20)
    area.reserve(512 << 10)
    with pytest.raises(ConfigError) as e:
        area.reserve(1 << 20)
    assert e.value.field == "--size"
    with pytest.raises(ConfigError, match="--size"):
        run_file_probe(area, build(FileProbeConfig, {**TINY_FILE, "bs": ["1MiB"]}))
    area.close()
    assert not target.exists()
    assert _all_files(tmp_path) == []


def test_file_probe_footprint_is_capped(tmp_path):
    area = ProbeArea.open(str(tmp_path / "p"), 1 << 20)
    try:
        out = run_file_probe(area, build(FileProbeConfig, {**TINY_FILE, "rw": ["read"], "engine": "python"}))
    finally:
        area.close()
    assert out["environment"]["test_file_bytes"] <= 1 << 20
    assert not (tmp_path / "p").exists()


# -- engines ---------------------------------------------------------------------------------

@pytest.fixture
def data_file(tmp_path):
    p = tmp_path / "data.bin"
    p.write_bytes(np.random.default_rng(1).bytes(4 << 20))
    return str(p)


@pytest.mark.parametrize("rw", ["read", "randread", "write", "randwrite"])
def test_python_engine_counts_real_bytes(data_file, rw):
    job = Job(path=data_file, file_size=4 << 20, rw=rw, bs=4096, qd=3, direct=False, runtime_s=0.05, qd_model="threads")
    r = py_engine.run(job)
    assert r.engine == "python"
    assert r.ios > 0 and r.bytes == r.ios * 4096
    assert r.seconds > 0 and r.iops > 0
    s = r.latency_summary
    assert s["count"] == r.ios and 0 < s["min"] <= s["p50"] <= s["p99"] <= s["max"]
    assert os.path.getsize(data_file) == 4 << 20  # writes stay inside the file


@needs_fio
@pytest.mark.parametrize("qd_model", ["async", "threads"])
def test_fio_engine_parses_json_and_keeps_job_file(data_file, qd_model):
    job = Job(path=data_file, file_size=4 << 20, rw="randread", bs=4096, qd=2, direct=False, runtime_s=0.05,
              qd_model=qd_model)
    r = fio_engine.run(job)
    assert r.engine == "fio" and r.engine_detail.startswith("fio-")
    assert r.bytes == r.ios * 4096 and r.ios > 0
    assert f"filename={data_file}" in r.job_file and "rw=randread" in r.job_file
    assert ("ioengine=libaio" in r.job_file) == (qd_model == "async")
    s = r.latency_summary
    assert s["count"] == r.ios and s["min"] <= s["p50"] <= s["p99"] <= s["max"]
    assert r.latency_cdf[0][1] == 0.0 and r.latency_cdf[-1][1] == 1.0


@needs_fio
def test_fio_batch_matches_jobs(data_file):
    jobs = [Job(path=data_file, file_size=4 << 20, rw=rw, bs=bs, qd=1, direct=False, runtime_s=0.05)
            for rw, bs in (("read", 65536), ("randwrite", 4096))]
    rs = fio_engine.run_many(jobs)
    assert [r.bytes % j.bs for j, r in zip(jobs, rs)] == [0, 0]
    assert "rw=read" in rs[0].job_file and "rw=randwrite" in rs[1].job_file and "end_fsync=1" in rs[1].job_file


def test_page_cache_state_is_verified(data_file):
    assert pagecache.set_file_state(data_file, "warm") > 0.95
    assert pagecache.set_file_state(data_file, "cold") < 0.05


# -- the file sweep --------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["python", pytest.param("fio", marks=needs_fio)])
def test_file_probe_sweep(tmp_path, engine):
    # fio starts a process per cache-prepared point: keep its sweep short
    rw = ["read", "randread", "write"] if engine == "python" else ["randread", "write"]
    cfg = build(FileProbeConfig, {**TINY_FILE, "rw": rw, "engine": engine, "cache": ["cold", "warm"]})
    area = ProbeArea.open(str(tmp_path / "p"), 8 << 20)
    try:
        out = run_file_probe(area, cfg)
    finally:
        area.close()
    points = out["metrics"]["points"]
    # reads: patterns x 2 caches x 2 sizes x 2 depths; writes: 2 sizes x 2 depths
    assert len(points) == (len(rw) - 1) * 2 * 2 * 2 + 2 * 2
    for p in points:
        assert p["engine"] == engine and p["bytes"] > 0 and p["bytes"] % p["bs"] == 0
        assert p["latency_s"]["count"] > 0
    cold = [p for p in points if p["cache"] == "cold"]
    warm = [p for p in points if p["cache"] == "warm"]
    assert all(p["residency_before"] < 0.05 for p in cold)
    assert all(p["residency_before"] > 0.95 for p in warm)
    if engine == "fio":
        assert out["environment"]["fio"].startswith("fio-")
        assert all("job_file" in p for p in points)
    else:
        assert any("Python engine" in w for w in out["warnings"])
    summary = out["metrics"]["summary"]
    assert summary["seq_write_bytes_per_s"] > 0 and summary["rand_read_iops_qd1"] > 0
    assert (summary["seq_read_bytes_per_s"] or 0) > 0 or "read" not in rw
    assert summary["rand_read_bs"] == 4096 and summary["p99_read_latency_s"] > 0
    plots = out["metrics"]["plots"]
    assert {"bandwidth_vs_request_size", "iops_vs_queue_depth", "latency_cdf"} <= set(plots)
    series = plots["bandwidth_vs_request_size"]["series"]
    assert series and all(len(s["points"]) == 2 for s in series)


def test_odirect_points_run_or_are_reported(tmp_path, monkeypatch):
    cfg = build(FileProbeConfig, {**TINY_FILE, "io": ["direct", "buffered"], "rw": ["randread"], "qd": [1],
                                  "engine": "python"})
    ok, _ = pagecache.odirect_supported(str(tmp_path))
    area = ProbeArea.open(str(tmp_path / "a"), 8 << 20)
    try:
        out = run_file_probe(area, cfg)
    finally:
        area.close()
    modes = {p["io"] for p in out["metrics"]["points"]}
    assert modes == ({"direct", "buffered"} if ok else {"buffered"})
    # a filesystem that rejects O_DIRECT (tmpfs on older kernels): points skipped, reason reported
    monkeypatch.setattr(pagecache, "odirect_supported", lambda d: (False, "open(O_DIRECT) failed: Invalid argument"))
    area = ProbeArea.open(str(tmp_path / "b"), 8 << 20)
    try:
        out = run_file_probe(area, cfg)
    finally:
        area.close()
    assert {p["io"] for p in out["metrics"]["points"]} == {"buffered"}
    assert out["environment"]["odirect"]["supported"] is False
    assert any("O_DIRECT is not supported" in w for w in out["warnings"])


def test_bad_file_config_is_one_clear_error():
    with pytest.raises(ConfigError, match="probe.rw"):
        build(FileProbeConfig, {"rw": ["readd"]}, "probe")
    with pytest.raises(ConfigError, match="4096"):
        build(FileProbeConfig, {"bs": ["1000"], "io": ["direct"]}, "probe")
    with pytest.raises(ConfigError, match="probe.qd"):
        build(FileProbeConfig, {"qd": [0]}, "probe")


# -- metadata --------------------------------------------------------------------------------

def test_metadata_probe_local(tmp_path):
    area = ProbeArea.open(str(tmp_path / "m"), 16 << 20)
    try:
        out = run_metadata_probe(area, build(MetadataConfig, {"files": 120, "workers": 3, "dirs": 4}))
        assert _all_files(area.work.root) == []   # unlink phase removed every file
    finally:
        area.close()
    m = out["metrics"]
    assert list(m["phases"]) == ["create", "stat", "open_read", "unlink"]
    for ph in m["phases"].values():
        assert ph["ops"] == 120 and ph["ops_per_s"] > 0 and ph["latency_s"]["p99"] > 0
    assert m["ops_per_s"] > 0
    assert not (tmp_path / "m").exists()


# -- small files -----------------------------------------------------------------------------

def test_smallfiles_probe_local(tmp_path):
    from iobench.probe.smallfiles import SmallFilesConfig, run_smallfiles_probe

    cfg = build(SmallFilesConfig, {"samples": 60, "modality": "images", "image_width": 64, "image_height": 48,
                                   "shard_size": "64KiB", "workers": 2})
    area = ProbeArea.open(str(tmp_path / "s"), 64 << 20)
    try:
        out = run_smallfiles_probe(area, cfg)
    finally:
        area.close()
    m = out["metrics"]
    assert set(m["formats"]) == {"files", "tar", "raw"}
    assert m["formats"]["files"]["opens"] == 60
    for f in m["formats"].values():
        assert f["samples"] == 60 and f["samples_per_s"] > 0 and f["bytes"] == f["dataset_bytes"]
        assert f["residency_before"] < 0.05
    assert m["formats"]["raw"]["opens"] < 60 and m["opens_ratio"] > 1
    assert m["penalty"] > 0
    assert not (tmp_path / "s").exists()


def test_smallfiles_threads_reader(tmp_path):
    from iobench.probe.smallfiles import SmallFilesConfig, run_smallfiles_probe

    cfg = build(SmallFilesConfig, {"samples": 40, "modality": "tokens", "seq_len": 128, "shard_size": "10 samples",
                                   "shard_formats": ["raw"], "workers": 2, "reader": "threads"})
    with ProbeArea.open(str(tmp_path / "s"), 16 << 20) as area:
        out = run_smallfiles_probe(area, cfg)
    m = out["metrics"]
    assert m["formats"]["files"]["opens"] == 40 and m["formats"]["raw"]["opens"] == 4
    assert all(f["samples"] == 40 and f["open_read_latency_s"]["count"] == f["opens"] for f in m["formats"].values())
    assert "thread" in out["environment"]["reader"]
    assert not (tmp_path / "s").exists()


# -- the CLI ---------------------------------------------------------------------------------

def test_cli_probe_file_writes_results(tmp_path, capsys):
    from iobench.cli import main

    out = tmp_path / "probe.json"
    rc = main(["probe", "file", str(tmp_path / "t"), "--engine", "python", "--rw", "read,randread", "--bs", "4KiB",
               "--qd", "1", "--io", "buffered", "--runtime", "0.05s", "--file-size", "1MiB", "--size", "2MiB",
               "--tier", "scratch", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["command"] == "probe" and data["schema_version"] == 1
    assert set(data["metrics"]["tiers"]["scratch"]) == {"file"}
    assert data["metrics"]["summary"]["scratch"]["rand_read_iops_qd1"] > 0
    assert data["metrics"]["headline"]["tier"] == "scratch"
    assert data["environment"]["tiers"]["scratch"]["file"]["engine"] == "python"
    assert data["config"]["tiers"]["scratch"]["probes"]["file"]["engine"] == "python"
    assert not (tmp_path / "t").exists()


def test_cli_bad_input_exits_2(tmp_path, capsys):
    from iobench.cli import main

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(["probe", "metadata", str(tmp_path / "full")]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["probe", "file", str(tmp_path / "e"), "--qd", "zero"]) == 2
    assert main(["probe", "file", str(tmp_path / "e"), "--size", "-1"]) == 2
    assert main(["probe", "file", "s3://bucket/x"]) == 2
    assert main(["probe", "metadata", str(tmp_path / "e"), "--set", "nosuch.key=1"]) == 2
    assert capsys.readouterr().err.count("\n") == 4
    assert (tmp_path / "full" / "x").read_text() == "x"


def test_suite_stage_local(tmp_path):
    from iobench.suite.probe import suite_stage
    from iobench.suite import SuiteContext

    ctx = SuiteContext(out_dir=tmp_path / "out", work_dir=tmp_path / "work")
    (tmp_path / "out").mkdir()
    (ctx.local_dir("nvme") / "other-stage-data.bin").write_bytes(b"x")
    metrics = suite_stage(ctx)
    assert "nvme" in metrics["summary"]
    assert (tmp_path / "out" / "probe.json") in ctx.results_files
    assert any(r[0] == "probe" and "nvme" in r[1] for r in ctx.rows)
    assert _all_files(tmp_path / "work") == ["nvme/other-stage-data.bin"]
