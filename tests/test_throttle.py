"""Real slow storage: the kernel throttles the dataset's disk (cgroup blkio / io.max), cold cache.

Ground truth for the loader's stall (issue 13, item 6b): with bandwidth the bottleneck,
stall = 1 − compute / (batch bytes / bandwidth), whatever the workers and depth.  Device
bytes come from the cgroup's own counter (iobench.blockdev), so read-ahead shows as
amplification.  Runs in make test where root and cgroups are present (briefly: 50 MiB/s
for a few seconds); skipped with the reason elsewhere.
"""

from __future__ import annotations

import os
import random

import pytest

from iobench.blockdev import DeviceCounter, device_of
from iobench.io.pagecache import drop_pages, file_residency
from iobench.generate import GenSpec, generate
from iobench.loader.core import LoadConfig, run_load
from iobench.planner.loader_sim import bandwidth_stall

MIB = 2**20
BW = 50 * MIB


def _file(path, nbytes: int) -> str:
    with open(path, "wb") as f:
        f.write(os.urandom(nbytes))
        os.fsync(f.fileno())
    drop_pages(str(path))
    return str(path)


def test_throttle_caps_a_cold_sequential_read_and_counts_its_bytes(tmp_path, read_throttle):
    p = _file(tmp_path / "seq.bin", 24 * MIB)
    assert file_residency(p) < 0.05
    with read_throttle(p, BW) as t:
        c = DeviceCounter(p)
        import time

        t0 = time.perf_counter()
        with open(p, "rb", buffering=0) as f:
            while f.read(MIB):
                pass
        dt = time.perf_counter() - t0
        r = c.stop(24 * MIB)
        path = t.path
    assert not os.path.exists(path), "the cgroup is removed on exit"
    assert r["scope"] == "cgroup"
    assert r["device_bytes_read"] >= 24 * MIB
    assert 0.95 <= r["read_amplification"] < 1.2
    # the throttle holds: 24 MiB at 50 MiB/s takes ~0.48 s (the first MiBs may pass before it bites)
    assert dt > 0.3


def test_small_random_reads_are_amplified_by_read_ahead(tmp_path, read_throttle):
    p = _file(tmp_path / "rand.bin", 32 * MIB)
    rng = random.Random(0)
    offsets = [rng.randrange(0, 32 * MIB - 4096) // 4096 * 4096 for _ in range(16)]
    with read_throttle(p, BW):
        c = DeviceCounter(p)
        fd = os.open(p, os.O_RDONLY)
        try:
            for off in offsets:
                assert len(os.pread(fd, 4096, off)) == 4096
        finally:
            os.close(fd)
        r = c.stop(16 * 4096)
    ra = device_of(p).read_ahead_kb()
    assert r["requested_bytes"] == 16 * 4096
    # each cold miss reads at least its page; read-ahead (read_ahead_kb) can make it much more
    assert r["device_bytes_read"] >= 16 * 4096
    assert r["read_amplification"] >= 1.0
    assert r["device"]["read_ahead_kb"] == ra


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    # 2 MiB batches (512 samples x 2048 uint16 tokens), one shard per batch; more shards than steps,
    # so no batch is served from pages an earlier epoch left in the cache
    url = str(tmp_path_factory.mktemp("thr") / "tok")
    generate(GenSpec(format="raw", modality="tokens", num_samples=512 * 68, shard_size="512 samples", seq_len=2048,
                     vocab_size=50000, fsync=True), url, progress=False)
    return url


def test_loader_stall_on_a_throttled_disk_matches_bandwidth(tokens, read_throttle):
    batch = 512 * 2048 * 2
    compute_s = 0.8 * batch / BW      # transfer 40 ms, compute 32 ms -> 20 % stall
    cfg = LoadConfig(dataset=tokens, workers=2, prefetch=2, batch_size=512, shuffle_buffer=0, steps=64,
                     compute=f"{compute_s * 1000:.3f}ms", cache="cold", monitor_interval_s=1.0)
    with read_throttle(tokens, BW):
        r = run_load(cfg)
    m = r.metrics
    assert r.environment["cache"]["measured_residency"] < 0.05
    dev = m["device_io"]
    assert dev["scope"] == "cgroup" and dev["device_bytes_read"] >= 0.95 * m["bytes_read"]
    assert dev["read_amplification"] < 1.1   # whole-shard reads: read-ahead reads nothing extra
    stall, busy = steady_stall(m["series"])
    # the consumer's own time per step (compute as it really slept, plus bookkeeping), not the nominal 32 ms
    want = bandwidth_stall(busy, batch, BW)
    assert abs(stall - want) <= 0.03, (stall, want, m["stall_ratio"], dev)


def steady_stall(series: dict) -> tuple[float, float]:
    """(stall, mean consumer time per step) over the steady state: the second half of the run, and not
    before the first step that waited.  Before that the consumer lives off the batches the workers read
    while it started, a head start that drains only as fast as storage falls short (~20 steps here)."""
    from iobench.planner.loader_sim import consumer_busy_s

    t, w = series["t_s"], series["wait_s"]
    n = len(t) - 1
    first = next((k for k in range(1, n) if w[k] > 0.001), n)
    k0 = max(first, n // 2) if first < n else n // 2   # never waited: the second half
    busy = consumer_busy_s(series)[k0:n]
    span = t[n] - t[k0]
    return sum(w[k0:n]) / span, sum(busy) / len(busy)
