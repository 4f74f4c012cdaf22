"""The measurement driver (iobench.driver): capacity counts every byte read (fills included),
the judgement names the cause a remedy must address, the host's ceiling is cached per shape."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import pytest

from iobench.driver import HostCeiling, Rates, capacity_bytes_per_s, judge, warmup

MIB = 2**20


def _worker(bytes_read, busy_s, io_s, fill_s=0.0, run_delay_s=0.0):
    return {"bytes_read": bytes_read, "busy_s": busy_s, "io_s": io_s, "fill_s": fill_s, "run_delay_s": run_delay_s}


def test_capacity_counts_the_fill_and_sums_workers():
    # a worker that spent 30 s filling its shuffle buffer and 0 s on its batches' reads: the
    # fill is storage's work too, so 300 MiB over 31 s, not over the batches' 1 s
    m = {"per_worker": [_worker(300 * MIB, 31.0, 1e-9, 30.0), _worker(300 * MIB, 31.0, 1e-9, 30.0)]}
    assert capacity_bytes_per_s(m) == pytest.approx(2 * 300 * MIB / 31.0)
    assert capacity_bytes_per_s({"per_worker": []}) is None


def test_warmup_names_a_fill_that_is_a_material_share():
    m = {"startup_s": 0.2, "time_to_first_batch_s": 25.0, "fill_io_s_total": 8 * 31.0, "wall_s_with_startup": 64.0}
    w = warmup(m, workers=8)
    assert w.fill_s_per_worker == pytest.approx(31.0) and w.material and w.share == pytest.approx(31.2 / 64)
    assert not warmup({"startup_s": 0.1, "time_to_first_batch_s": 0.1, "wall_s_with_startup": 60.0}, 2).material


def _ceiling(bps):
    return HostCeiling(bytes_per_s=bps, samples_per_s=0.0, cores=2, key="k", measured_at=0.0, cached=True)


# (stall, capacity, need, delivered, ceiling MiB/s, worker busy/io s, requests, KiB per request, emulation)
#   -> (bound, cause)
CASES = [
    ("keeps up", 0.0, 500, 100, 100, None, (10, 9), 100, 8192, {}, ("keeps up", "none")),
    ("host-bound, no stall", 0.0, 450, 100, 100, 500, (10, 9), 100, 8192, {}, ("host", "none")),
    ("host-bound stall", 0.3, 90, 120, 90, 100, (10, 9), 100, 8192, {}, ("host", "the host's read path")),
    ("bandwidth", 0.2, 50, 62, 50, 1000, (10, 9.5), 10, 8192, {}, ("storage", "storage bandwidth")),
    ("bandwidth, small reads fast", 0.2, 50, 62, 50, 1000, (10, 9.5), 4000, 128, {},
     ("storage", "storage bandwidth")),
    ("bandwidth emulated", 0.2, 50, 62, 50, 1000, (10, 9.5), 10, 8192,
     {"kind": "none", "bandwidth_bytes_per_s": 5e7}, ("storage", "storage bandwidth")),
    ("latency emulated", 0.5, 20, 62, 20, 1000, (10, 9.5), 10, 8192, {"kind": "const"},
     ("storage", "per-request latency")),
    ("latency measured", 0.5, 20, 62, 20, 1000, (10, 9.5), 1000, 128, {}, ("storage", "per-request latency")),
    ("cpu prep", 0.4, 30, 62, 30, 1000, (10, 2), 10, 8192, {}, ("host", "CPU preparation")),
    ("hand-over", 0.3, 500, 100, 70, 5000, (10, 9), 100, 8192, {}, ("host", "hand-over")),
    ("slow tail", 0.05, 500, 100, 480, 5000, (10, 9), 100, 8192, {}, ("storage", "slow tail")),
    ("contended", 0.4, 30, 62, 30, 1000, (10, 9.5, 4.0), 10, 8192, {}, ("host", "CPU contention")),
    ("contended, no stall", 0.0, 300, 62, 60, 1000, (10, 9.5, 4.0), 10, 8192, {}, ("keeps up", "none")),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_judge_names_the_cause(case):
    _, stall, cap, need, delivered, ceil, (busy, io, *delay), reqs, kib, emu, want = case
    r = Rates(capacity_bytes_per_s=cap * MIB, need_bytes_per_s=need * MIB, delivered_bytes_per_s=delivered * MIB,
              compute_s=0.05, bytes_read=reqs * kib * 1024)
    m = {STALL_RATIO: stall, "requests": reqs, "per_worker": [_worker(r.bytes_read, busy, io, 0.0, *delay)]}
    j = judge(m, {"emulation": emu or None}, r, _ceiling(ceil * MIB) if ceil else None, workers=1)
    assert (j.bound, j.cause) == want
    assert (j.advice == "") == (want[1] == "none")


def test_host_ceiling_is_cached_per_shape(tmp_path, monkeypatch):
    from dataclasses import replace

    from iobench.driver import host_ceiling
    from iobench.generate import GenSpec, generate
    from iobench.loader.core import LoadConfig

    monkeypatch.setenv("IOBENCH_CACHE_DIR", str(tmp_path / "cache"))
    ds = tmp_path / "ds"
    man = generate(GenSpec.from_mapping({"format": "raw", "modality": "tokens", "num_samples": 512, "seq_len": 2048,
                                         "shard_size": "128 samples"}), str(ds), progress=False)
    cfg = LoadConfig(dataset=str(ds), workers=1, batch_size=8)
    first = host_ceiling(cfg, man, time_s=0.5)
    assert first.bytes_per_s > 0 and not first.cached
    again = host_ceiling(cfg, man, time_s=0.5)
    assert again.cached and again.bytes_per_s == first.bytes_per_s
    from iobench.io.pagecache import drop_pages, file_residency

    for sh in man.shards:
        drop_pages(str(ds / sh.path))
    other = host_ceiling(replace(cfg, batch_size=16), man, time_s=0.5)    # another shape: measured
    assert not other.cached and other.key != first.key
    # calibrating read the first shards to copy them: a cold dataset stays cold for the load that follows
    assert all(file_residency(str(ds / sh.path)) <= 0.05 for sh in man.shards)


def _small(tmp_path, fmt="raw"):
    from iobench.generate import GenSpec, generate

    url = str(tmp_path / fmt)
    generate(GenSpec(format=fmt, modality="tokens", num_samples=256, shard_size="64 samples", seq_len=512,
                     vocab_size=1000, fsync=False), url, progress=False)
    return url


def test_every_door_records_residency_before_and_after_and_the_ceiling(tmp_path, monkeypatch):
    """`iobench load` and the suite's loads go through the driver as `check` does."""
    import json

    from iobench.cli import main
    from iobench.suite import SuiteContext
    from iobench.suite.load import suite_stage
    from iobench.suite.state import GeneratedDataset

    monkeypatch.setenv("IOBENCH_HOST_CEILING", "cached")
    url = _small(tmp_path)
    assert main(["load", url, "--steps", "8", "--cache", "cold", "--host-ceiling", "cached", "--no-progress",
                 "--json", str(tmp_path / "l.json")]) == 0
    doc = json.loads((tmp_path / "l.json").read_text())
    cache = doc["environment"]["cache"]
    assert cache["declared"] == "cold" and {"residency_found", "measured_residency", "residency_after"} <= set(cache)
    assert doc["environment"]["host_ceiling"]["bytes_per_s"] > 0
    assert doc["metrics"]["drive"]["judgement"]["bound"] in ("keeps up", "storage", "host")
    # each worker's wait for a CPU while runnable (schedstat): the host's contention, apart from storage
    assert all(w["run_delay_s"] is not None and w["run_delay_s"] >= 0 for w in doc["metrics"]["per_worker"])

    ctx = SuiteContext(out_dir=tmp_path / "out", work_dir=tmp_path / "work")
    ctx.state.datasets = [GeneratedDataset(name="raw-tokens", format="raw", modality="tokens", url=url,
                                           location="local")]
    out = suite_stage(ctx)
    entry = out["per_dataset"]["local/raw-tokens"]["cold"]
    assert entry["bound"] in ("keeps up", "storage", "host") and entry["host_ceiling_bytes_per_s"] > 0
    res = json.loads(ctx.results_files[0].read_text())
    assert "residency_after" in res["environment"]["cache"] and res["metrics"]["drive"]["passes"]


@pytest.mark.parametrize("fmt,access,workers,buffer,samples,batch,steps,want,note", [
    ("raw", "map", 2, 1000, 4096, 32, 0, 128, False),         # map: one pass, no buffer
    ("tar", "auto", 1, 1000, 6144, 32, 0, 160, False),        # stream: the buffer's drain left out
    ("tar", "auto", 2, 1000, 6144, 32, 0, 129, False),        # one buffer per worker
    ("tar", "auto", 1, 1000, 1024, 32, 0, 32, True),          # the buffer holds most of it: a whole pass, said
    ("tar", "auto", 1, 0, 1024, 32, 0, 32, False),            # no shuffle buffer
    ("tar", "auto", 1, 100, 6144, 32, 20, 20, False),         # fewer steps asked: those
    ("parquet", "map", 1, 1000, 6144, 32, 0, 192, False),     # map access: no buffer
])
def test_a_cold_run_reads_one_pass_without_the_buffers_drain(fmt, access, workers, buffer, samples, batch, steps,
                                                             want, note):
    from iobench.driver import _cold_steps
    from iobench.loader.core import LoadConfig
    from iobench.manifest import Manifest, ShardEntry

    per = samples // 4
    man = Manifest(format=fmt, modality="tokens", compression="none", seed=0, spec={},
                   shards=tuple(ShardEntry(path=f"s{i}", bytes=per * 1024, samples=per, checksum="none:",
                                           offsets=tuple(range(0, (per + 1) * 1024, 1024)), first_sample=i * per)
                                for i in range(4)))
    cfg = LoadConfig(dataset="x", workers=workers, batch_size=batch, shuffle_buffer=buffer, access=access,
                     steps=steps)
    got, why = _cold_steps(cfg, man)
    assert got == want and (why is not None) == note
