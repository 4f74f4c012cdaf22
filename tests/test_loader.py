"""The prefetching loader: order, completeness, payload integrity, metrics, S3, faults, bad input."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import json
import socket
import time
from dataclasses import replace

import numpy as np
import pytest

from iobench.errors import ConfigError, EndpointError, StorageError
from iobench.generate import GenSpec, generate
from iobench.loader.core import LoadConfig, run_load
from iobench.loader.sampler import delivery_order, epoch_plan, sample_order


@pytest.fixture(scope="module")
def tokens_ds(tmp_path_factory):
    """raw tokens: 10 shards of 50 samples (seq 32) — shards deliberately not a multiple of the batch."""
    url = str(tmp_path_factory.mktemp("ds") / "tok")
    m = generate(GenSpec(format="raw", modality="tokens", num_samples=500, shard_size="50 samples", seq_len=32,
                         vocab_size=1000, fsync=False), url, progress=False)
    return url, m


def _recorder():
    seen: list[tuple[int, np.ndarray, np.ndarray]] = []

    def deliver(batch):
        seen.append((batch.epoch, batch.indices.copy(), np.array(batch.data, copy=True)))
        return batch
    return seen, deliver


def test_sampler_is_pure_and_complete():
    sizes, first = [50] * 10, list(range(0, 500, 50))
    a = sample_order(sizes, first, 16, seed=3, epoch=0, shuffle_buffer=120)
    assert sorted(a.tolist()) == list(range(500))
    assert np.array_equal(a, sample_order(sizes, first, 16, seed=3, epoch=0, shuffle_buffer=120))
    assert not np.array_equal(a, sample_order(sizes, first, 16, seed=3, epoch=1, shuffle_buffer=120))
    assert not np.array_equal(a, sample_order(sizes, first, 16, seed=4, epoch=0, shuffle_buffer=120))
    # ranks partition the epoch
    parts = [sample_order(sizes, first, 16, seed=3, epoch=0, rank=r, world=3, shuffle_buffer=120) for r in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(500))
    # blocks reach the shuffle buffer; batches never exceed the batch size
    plan = epoch_plan(sizes, 16, seed=3, epoch=0, shuffle_buffer=120)
    assert all(b.samples >= 120 for b in plan.blocks[:-1])
    assert all(0 < s <= 16 for b in plan.blocks for s in b.batch_sizes)
    # no shuffle: stored order
    flat = sample_order(sizes, first, 16, seed=3, epoch=0, shuffle=False)
    assert flat.tolist() == list(range(500))


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_every_start_method_delivers_the_epoch(tokens_ds, start_method):
    """Under forkserver a worker's parent is the fork server, not the loader: the parent-death
    guard once took that for a dead parent and every worker exited 1 before its first read."""
    url, _ = tokens_ds
    seen, deliver = _recorder()
    r = run_load(LoadConfig(dataset=url, workers=2, batch_size=25, epochs=1, start_method=start_method),
                 deliver=deliver)
    assert r.metrics["samples"] == 500
    assert sorted(np.concatenate([ids for _, ids, _ in seen]).tolist()) == list(range(500))


@pytest.mark.parametrize("access", ["map", "stream", "block"])
def test_every_sample_once_per_epoch_same_order_across_runs_and_worker_counts(tokens_ds, access):
    url, manifest = tokens_ds
    from iobench.formats import get_format
    from iobench.storage import open_backend

    cfg = LoadConfig(dataset=url, workers=1, prefetch=2, batch_size=16, epochs=2, shuffle_buffer=120, seed=5,
                     access=access)
    runs = {}
    for w in (1, 3, 3):
        seen, deliver = _recorder()
        r = run_load(replace(cfg, workers=w), deliver=deliver)
        runs.setdefault(w, []).append(seen)
        assert r.metrics["samples"] == 1000 and r.metrics["access"] == access
        for epoch in (0, 1):
            ids = np.concatenate([i for e, i, _ in seen if e == epoch])
            assert sorted(ids.tolist()) == list(range(500))      # exactly once per epoch
            expect = delivery_order(access, [s.samples for s in manifest.shards], 16, seed=5, epoch=epoch,
                                    workers=w, shuffle_buffer=120)
            assert np.array_equal(ids, expect)                   # the pure function's order
    ref = runs[1][0]
    # same W: the same order run after run; map and block do not depend on W at all (stream does, as in webdataset)
    for other in ([runs[3][1]] if access == "stream" else [runs[3][0], runs[3][1]]):
        first = runs[3][0] if access == "stream" else ref
        assert len(other) == len(first)
        for (e1, i1, d1), (e2, i2, d2) in zip(first, other):
            assert e1 == e2 and np.array_equal(i1, i2) and np.array_equal(d1, d2)
    # payloads are the samples the format reader yields for those indices
    b = open_backend(url)
    reader = get_format("raw").reader(manifest)
    truth = {}
    for sh in manifest.shards:
        for s in reader.iter_samples(b.cat(sh.path), sh):
            truth[s.index] = np.asarray(s.data)
    for _, ids, data in ref[:5]:
        for row, i in zip(data, ids):
            assert np.array_equal(row, truth[int(i)])


def test_metrics_schema_and_bytes_counted_at_backend(tokens_ds, tmp_path):
    url, manifest = tokens_ds
    r = run_load(LoadConfig(dataset=url, workers=2, prefetch=2, batch_size=25, epochs=1, compute="1ms",
                            cache="cold", monitor_interval_s=0.1, access="block"))
    m = r.metrics
    assert m["bytes_read"] == manifest.total_bytes          # each shard read exactly once, counted at the backend
    assert m["samples"] == 500 and m["steps"] == 20
    assert m["first_step_excluded"] is True
    assert 0 <= m[STALL_RATIO] <= 1 and m["accelerator_utilization"] == pytest.approx(1 - m[STALL_RATIO])
    for h in ("batch_wait_s", "batch_io_s", "compute_s", "step_s"):
        assert set(m[h]) == {"count", "min", "mean", "p50", "p90", "p99", "p999", "max"}
    assert m["batch_wait_s"]["count"] == 19
    assert m["read_latency_s"]["read"]["count"] == 10
    assert m["batch_bytes"] == 25 * 32 * 2
    assert len(m["series"]["wait_s"]) == 20 and len(m["series"]["queue_depth"]) == 20
    assert sum(w["samples"] for w in m["per_worker"]) == 500
    assert m["system"]["processes"] == 3 and m["system"]["peak_uss_bytes"] > 0
    env = r.environment
    assert env["cache"]["declared"] == "cold" and env["cache"]["measured_residency"] is not None
    assert env["storage"] == "real"
    json.dumps(m)


def test_system_monitor_stamps_samples_on_the_step_clock_with_the_device_bytes(tmp_path):
    # A window of steps is matched with what the device read in it (tests/test_throttle.py): the
    # samples' t_s must count from the step clock's start, which comes after the workers' start-up
    # and the monitor's own start, and each sample carries the run's device counter so far.
    from iobench.blockdev import DeviceCounter
    from iobench.loader.sysmon import SystemMonitor

    p = tmp_path / "f.bin"
    p.write_bytes(b"x" * 4096)
    dev = DeviceCounter(str(p))
    mon = SystemMonitor(0.05).start([], device=dev)
    time.sleep(0.2)                      # start-up: the step clock has not started
    origin = time.perf_counter_ns()
    time.sleep(0.1)
    s = mon.stop(origin)["series"]
    assert s[0]["t_s"] < 0, "samples from start-up come before the step clock's start"
    assert 0.1 <= s[-1]["t_s"] < 0.19, "the last sample is stamped on the step clock, not the monitor's"
    assert all(("device_read_bytes" in x) for x in s)
    if dev.dev is not None:
        b = [x["device_read_bytes"] for x in s]
        assert all(isinstance(v, int) and v >= 0 for v in b) and b == sorted(b)
    assert "device_read_bytes" not in SystemMonitor(0.05).start([]).stop()["series"][-1]


def test_cli_writes_results_with_recommendation(tokens_ds, tmp_path):
    from iobench.cli import main
    from iobench.results import read_results

    url, _ = tokens_ds
    out = tmp_path / "load.json"
    rc = main(["load", url, "-W", "1", "-Q", "1", "-B", "50", "--compute-ms", "5", "--emulate", "const:10ms",
               "--recommend", "--json", str(out)])
    assert rc == 0
    res = read_results(out)
    assert res["command"] == "load"
    assert res["environment"]["storage"] == "emulated"
    assert res["environment"]["emulation"]["latency_s"] == pytest.approx(0.01)
    rec = res["metrics"]["prefetch_recommendation"]
    assert rec["depth_min"] >= 2 and rec["depth_recommended"] == rec["depth_min"] + 2   # P99 I/O >= 10 ms, compute 5 ms
    assert rec["host_bytes_total"] == rec["depth_recommended"] * res["metrics"]["batch_bytes"]


@pytest.mark.parametrize("argv, field", [
    (["-Q", "0"], "prefetch"),
    (["--compute-ms", "-5"], "--compute-ms"),
    (["--emulate", "lognormal:p50=1s"], "--emulate"),
    (["--emulate", "warp"], "--emulate"),
    (["-B", "0"], "--batch-size"),
    (["--compute", "normal:mean=1s"], "--compute"),
    (["--access", "mapp"], "load.access"),
    (["--stall-ci", "0"], "--stall-ci"),
    (["--repeat", "0"], "--repeat"),
    (["--max-time", "-1"], "--max-time"),
    (["--max-time", "60"], "--max-time"),          # no unit, no number: 60 ms or 60 s?
    (["--retry-budget", "30"], "--retry-budget"),
    (["--stream-read-size", "lots"], "stream_read_size"),
])
def test_bad_input_exits_2_with_one_line(tokens_ds, capsys, argv, field):
    from iobench.cli import main

    url, _ = tokens_ds
    assert main(["load", url, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


def test_dataset_without_manifest_exits_2(tmp_path, capsys):
    from iobench.cli import main

    assert main(["load", str(tmp_path)]) == 2
    assert "manifest.json" in capsys.readouterr().err


def test_cache_cold_and_warm_measure_residency(tokens_ds):
    from iobench.io.pagecache import set_cache_state
    from iobench.storage import open_backend

    url, manifest = tokens_ds
    b = open_backend(url)
    rels = [s.path for s in manifest.shards]
    warm = set_cache_state(b, rels, "warm")
    assert warm["measured_residency"] == pytest.approx(1.0)
    cold = set_cache_state(b, rels, "cold")
    assert cold["measured_residency"] is not None and cold["measured_residency"] < 0.5
    with pytest.raises(ConfigError):
        set_cache_state(b, rels, "lukewarm")


def test_images_tar_with_decode(tmp_path):
    url = str(tmp_path / "img")
    generate(GenSpec(format="tar", modality="images", num_samples=12, shard_size="6 samples", image_width=32,
                     image_height=24, num_classes=10, fsync=False), url, progress=False)
    got = []

    def deliver(batch):
        got.append((batch.indices.copy(), [np.array(batch.sample(i)) for i in range(len(batch))], batch.labels))
        return batch

    r = run_load(LoadConfig(dataset=url, workers=2, batch_size=4, decode=True, shuffle_buffer=6), deliver=deliver)
    assert r.metrics["samples"] == 12
    assert sorted(int(i) for ids, _, _ in got for i in ids) == list(range(12))
    assert len(got) == 4                      # blocks of 6 samples: batches 4 + 2, twice
    for _, arrays, labels in got:
        assert all(a.ndim == 3 and a.shape[2] == 3 and a.dtype == np.uint8 for a in arrays)
        assert labels is not None and all(0 <= x < 10 for x in labels)
    # undecoded: the encoded JPEG bytes, ragged
    got.clear()
    run_load(LoadConfig(dataset=url, workers=1, batch_size=4, shuffle_buffer=6), deliver=deliver)
    assert all(bytes(a[:2]) == b"\xff\xd8" for _, arrays, _ in got for a in arrays)


def test_faults_are_retried_then_fail_with_the_shard(tokens_ds):
    url, manifest = tokens_ds
    r = run_load(LoadConfig(dataset=url, workers=1, batch_size=50, error_rate=0.3, retries=8, retry_budget_s=10))
    assert r.metrics["samples"] == 500
    t0 = time.perf_counter()
    with pytest.raises(StorageError) as e:
        run_load(LoadConfig(dataset=url, workers=1, batch_size=50, error_rate=1.0, retries=3, retry_budget_s=2))
    assert ".bin" in str(e.value) and "attempt" in str(e.value)
    assert time.perf_counter() - t0 < 20


@pytest.mark.parametrize("client", ["s3fs", "obstore"])
def test_s3_ranged_reads_count_every_byte(tokens_ds, s3_server, s3_prefix, client):
    if client == "obstore":
        pytest.importorskip("obstore", reason="the s3fast extra (obstore) is not installed")
    opts = {"key": s3_server.access_key, "secret": s3_server.secret_key}
    url = s3_prefix + f"/tok-{client}"
    m = generate(GenSpec(format="raw", modality="tokens", num_samples=200, shard_size="50 samples", seq_len=512,
                         vocab_size=1000, fsync=False), url, endpoint_url=s3_server.endpoint_url,
                 storage_options=opts, progress=False)
    seen, deliver = _recorder()
    cfg = LoadConfig(dataset=url, endpoint_url=s3_server.endpoint_url, workers=2, batch_size=20,
                     s3_block_size="16KiB", s3_concurrency=4, cache="cold", access="block", s3_client=client)
    r = run_load(cfg, storage_options=opts, deliver=deliver)
    assert r.environment["source"]["read_client"] == client
    assert r.metrics["bytes_read"] == m.total_bytes
    # the bytes themselves: every delivered row equals the shard's tokens read back through s3fs
    from iobench.formats import get_format
    from iobench.storage import open_backend

    b, rd = open_backend(url, endpoint_url=s3_server.endpoint_url, storage_options=opts), get_format("raw").reader(m)
    want = np.concatenate([rd.tokens(b.cat(sh.path), sh) for sh in m.shards])
    for _, ids, data in seen:
        assert np.array_equal(data, want[ids])
    per_shard = round(m.shards[0].bytes / 16384)   # equal GETs of about 16 KiB, no tiny tail (ranged_gets)
    assert r.metrics["read_calls"]["read"] == per_shard * len(m.shards)   # ranged GETs
    assert sorted(int(i) for _, ids, _ in seen for i in ids) == list(range(200))
    # map: one ranged GET per sample, the sample's record bytes and nothing else
    seen2, deliver2 = _recorder()
    r = run_load(replace(cfg, access="map"), storage_options=opts, deliver=deliver2)
    assert r.metrics["read_calls"]["read"] == 200 and r.metrics["requests"] == 200
    assert r.metrics["bytes_read"] == 200 * 512 * 2
    rows = {int(i): row for _, ids, data in seen for i, row in zip(ids, data)}
    assert all(np.array_equal(rows[int(i)], row) for _, ids, data in seen2 for i, row in zip(ids, data))
    assert sorted(int(i) for _, ids, _ in seen2 for i in ids) == list(range(200))
    assert r.environment["cache"]["measured_residency"] is None


def test_stopped_endpoint_fails_fast_with_a_clear_message():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(EndpointError) as e:
        run_load(LoadConfig(dataset="s3://iobench/nothing", endpoint_url=f"http://127.0.0.1:{port}"),
                 storage_options={"key": "k", "secret": "s"})
    assert "cannot reach" in str(e.value)
    assert time.perf_counter() - t0 < 30


def test_corrupt_shard_fails_with_the_shard_named(tmp_path):
    from iobench.errors import IntegrityError

    url = str(tmp_path / "bad")
    m = generate(GenSpec(format="raw", modality="tokens", num_samples=64, shard_size="32 samples", seq_len=16,
                         vocab_size=1000, fsync=False), url, progress=False)
    victim = tmp_path / "bad" / m.shards[1].path
    data = bytearray(victim.read_bytes())
    data[:8] = b"XXXXXXXX"
    victim.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as e:
        run_load(LoadConfig(dataset=url, workers=2, batch_size=8, shuffle=False, access="block"))
    assert m.shards[1].path in str(e.value)


def test_odirect_reads_the_same_bytes(tokens_ds):
    url, manifest = tokens_ds
    seen_a, deliver_a = _recorder()
    seen_b, deliver_b = _recorder()
    cfg = LoadConfig(dataset=url, workers=2, batch_size=16, shuffle_buffer=120, seed=1, access="block")
    try:
        a = run_load(replace(cfg, odirect=True), deliver=deliver_a)
    except ConfigError as e:  # tmpfs and some FUSE filesystems refuse O_DIRECT
        pytest.skip(str(e))
    run_load(cfg, deliver=deliver_b)
    assert a.metrics["bytes_read"] == manifest.total_bytes
    assert all(np.array_equal(x[2], y[2]) for x, y in zip(seen_a, seen_b)) and len(seen_a) == len(seen_b)


@pytest.mark.parametrize("pages, block_pages, requests", [(3, 1, 4), (3, 8, 1), (16, 4, 4), (17, 4, 4)])
def test_odirect_requests_are_whole_pages_and_a_short_tail_joins_the_last(tmp_path, monkeypatch, pages,
                                                                          block_pages, requests):
    """A shard a few bytes past a page multiple is read in ``requests`` O_DIRECT preads (the tail
    page rides with the last one, as ``ranged_gets`` cuts GETs), every byte as on disk."""
    import mmap
    import os

    from iobench.errors import IntegrityError
    from iobench.loader.source import backend_source
    from iobench.manifest import ShardEntry

    page = mmap.PAGESIZE
    data = np.random.default_rng(pages).integers(0, 256, pages * page + 64, dtype=np.uint8).tobytes()
    (tmp_path / "s.bin").write_bytes(data)
    shard = ShardEntry(path="s.bin", bytes=len(data), samples=1, checksum=None, first_sample=0)
    src = backend_source(str(tmp_path), odirect=True, block_size=block_pages * page)
    src.open()
    if not src.backend.base.supports_odirect:
        pytest.skip("no O_DIRECT on this file system")
    calls = []
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: calls.append((off, sum(len(b) for b in bufs)))
                        or real(fd, bufs, off))
    try:
        got = src.read_shards([shard])[0]
    except OSError as e:  # tmpfs and some FUSE filesystems refuse O_DIRECT
        pytest.skip(str(e))
    assert bytes(got) == data
    assert len(calls) == requests and all(off % page == 0 and n % page == 0 for off, n in calls)
    (tmp_path / "s.bin").write_bytes(data[:page + 10])   # truncated behind the manifest's back
    with pytest.raises(IntegrityError, match="short O_DIRECT read"):
        src.read_shards([shard])
    src.close()


def test_read_ahead_keeps_order_and_counts(tokens_ds):
    url, manifest = tokens_ds
    seen, deliver = _recorder()
    r = run_load(LoadConfig(dataset=url, workers=2, batch_size=16, shuffle_buffer=60, seed=2, read_ahead=2,
                            access="block"),
                 deliver=deliver)
    ids = np.concatenate([i for _, i, _ in seen])
    expect = sample_order([s.samples for s in manifest.shards], [s.first_sample for s in manifest.shards], 16,
                          seed=2, epoch=0, shuffle_buffer=60)
    assert np.array_equal(ids, expect)
    assert r.metrics["bytes_read"] == manifest.total_bytes


def test_analyze_separates_prep_and_fetch_stall(tokens_ds, tmp_path):
    from iobench.cli import main
    from iobench.results import read_results

    url, _ = tokens_ds
    out = tmp_path / "a.json"
    assert main(["load", url, "-W", "1", "-B", "50", "--shuffle-buffer", "0", "--compute-ms", "2",
                 "--emulate", "const:5ms", "--analyze", "--json", str(out)]) == 0
    a = read_results(out)["metrics"]["analysis"]
    assert set(a[STALL_RATIO]) == {"synthetic", "warm", "cold"}
    assert a["prep_stall_ratio"] >= 0 and a["fetch_stall_ratio"] >= 0
    # emulated 5 ms per shard read against 2 ms compute: fetching is what stalls
    assert a[STALL_RATIO]["cold"] > a[STALL_RATIO]["synthetic"]
    assert a["fetch_stall_ratio"] > a["prep_stall_ratio"]


def test_load_through_tiers(tokens_ds, tmp_path):
    """`iobench load --tiers FILE --staging ondemand`: shards come through the tiers' ShardSource."""
    from iobench.cli import main
    from iobench.results import read_results

    try:
        from iobench.tiers import loader_source  # noqa: F401
        from iobench.tiers.config import TiersConfig, TierSpec, write_tiers_file
    except ImportError:
        pytest.skip("iobench.tiers is not available")
    url, manifest = tokens_ds
    cfg = TiersConfig(tiers=(TierSpec(name="nvme", url=str(tmp_path / "nvme")),),
                      catalog=str(tmp_path / "catalog.sqlite"))
    tf = write_tiers_file(cfg, str(tmp_path / "tiers.yaml"))
    out = tmp_path / "t.json"
    assert main(["load", url, "-W", "2", "-B", "25", "--tiers", str(tf), "--staging", "ondemand", "--access", "stream",
                 "--json", str(out)]) == 0
    res = read_results(out)
    assert res["metrics"]["samples"] == manifest.total_samples
    assert res["environment"]["source"]["kind"] == "tiers"
    assert res["metrics"]["bytes_read"] == manifest.total_bytes


def test_endpoint_stopping_mid_run_fails_within_the_retry_budget(tmp_path):
    """Workers retry GETs with backoff, then fail with the URL, in bounded time."""
    import threading

    from iobench.s3server import S3Server

    server = S3Server(bucket="iobench", data_dir=str(tmp_path / "s3")).start()
    stopped = False
    try:
        opts = {"key": server.access_key, "secret": server.secret_key}
        url = "s3://iobench/stop/tok"
        generate(GenSpec(format="raw", modality="tokens", num_samples=400, shard_size="10 samples", seq_len=16,
                         vocab_size=1000, fsync=False), url, endpoint_url=server.endpoint_url,
                 storage_options=opts, progress=False)
        cfg = LoadConfig(dataset=url, endpoint_url=server.endpoint_url, workers=1, prefetch=1, batch_size=10,
                         shuffle_buffer=0, compute="50ms", retries=4, retry_budget_s=3)
        started = []

        def deliver(batch):  # stop the server once the run is really under way (not during its setup)
            if not started:
                started.append(threading.Thread(target=server.stop))
                started[0].start()
            return batch

        t0 = time.perf_counter()
        with pytest.raises(StorageError) as e:
            run_load(cfg, storage_options=opts, deliver=deliver)
        stopped = True
        assert "s3" in str(e.value).lower() or "iobench/stop" in str(e.value)
        assert time.perf_counter() - t0 < 40
    finally:
        if not stopped:
            server.stop()
