"""Real slow storage: the kernel throttles the dataset's disk (cgroup blkio / io.max), cold cache.

Ground truth for the loader's stall (issue 13, item 6b): with bandwidth the bottleneck,
stall = 1 − compute / (batch bytes / bandwidth), whatever the workers and depth.  Device
bytes come from the cgroup's own counter (iobench.blockdev), so read-ahead shows as
amplification.  Runs in make test where root and cgroups are present (briefly: 50 MiB/s
for a few seconds); skipped with the reason elsewhere.
"""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import os
import random

import pytest

from iobench.blockdev import DeviceCounter, device_of
from iobench.io.pagecache import drop_pages, file_residency
from iobench.generate import GenSpec, generate
from iobench.loader.core import LoadConfig, run_load
from iobench.planner.loader_sim import bandwidth_stall, predict_from_run

MIB = 2**20
BW = 50 * MIB
SLOW = 20 * MIB


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
def raw_tokens(tmp_path_factory):
    # 4 KiB samples (2048 uint16 tokens) in 2 MiB shards; 136 MiB, so random reads rarely meet pages
    # an earlier read brought in
    url = str(tmp_path_factory.mktemp("thr") / "raw")
    generate(GenSpec(format="raw", modality="tokens", num_samples=512 * 68, shard_size="512 samples", seq_len=2048,
                     vocab_size=50000, fsync=True), url, progress=False)
    return url


@pytest.fixture(scope="module")
def tar_tokens(tmp_path_factory):
    # 64 KiB samples: per-sample parsing stays small beside the transfer on a busy 2-core host
    url = str(tmp_path_factory.mktemp("thr") / "tar")
    generate(GenSpec(format="tar", modality="tokens", num_samples=32 * 48, shard_size="8MiB", seq_len=32768,
                     vocab_size=50000, fsync=True), url, progress=False)
    return url


def _throttled_run(url, read_throttle, bw=BW, **kw):
    cfg = LoadConfig(dataset=url, workers=2, prefetch=2, cache="cold", **({"monitor_interval_s": 1.0} | kw))
    with read_throttle(url, bw):
        r = run_load(cfg)
    assert r.environment["cache"]["measured_residency"] < 0.05
    dev = r.metrics["device_io"]
    assert dev["scope"] == "cgroup" and dev["device_bytes_read"] >= 0.95 * r.metrics["bytes_read"]
    return r


# The cap is a ceiling: other tenants reading the same disk can hold the group below it, and a
# starved CPU stretches batch preparation; neither is the loader's doing, so a miss is re-run (at
# most twice) and every attempt is shown when all miss.
ATTEMPTS = 3


def test_stream_stall_on_a_throttled_disk_matches_bandwidth(tar_tokens, read_throttle):
    # stream (the default for tar): each worker reads its shards in order, in ~64 KiB pieces; 2 MiB
    # batches, 100 ms each at 20 MiB/s (a cap low enough to bind on this shared disk); 60 ms compute
    tries = []
    for _ in range(ATTEMPTS):
        r = _throttled_run(tar_tokens, read_throttle, batch_size=32, steps=40, compute="60ms", shuffle_buffer=32,
                           bw=SLOW)
        m = r.metrics
        assert r.environment["loader"]["access"] == "stream"
        dev = m["device_io"]
        # shards read in order: read-ahead only runs past the last bytes the run asked for
        assert dev["read_amplification"] < 1.3
        stall, busy = steady_stall(m)
        # the consumer's own time per step (compute as it really slept, plus bookkeeping), not the nominal 60 ms
        want = bandwidth_stall(busy, m["batch_bytes"], SLOW)
        tries.append({"steady_stall": stall, "formula": want, "mlperf_stall": m["stall_ratio_first_step_excluded"],
                      "device_bytes": dev["device_bytes_read"], "system_bytes": dev["diskstats_bytes_read"],
                      "load_avg": os.getloadavg()[0]})
        if abs(stall - want) <= 0.03:
            return
    raise AssertionError(f"steady stall vs 1 - compute/(batch/bandwidth) beyond 3 pp in every attempt: {tries}")


def test_map_on_a_throttled_disk_read_ahead_and_model(raw_tokens, read_throttle):
    # map (the default for raw): one 4 KiB pread per sample in random order.  Each cold miss makes the
    # kernel read ahead, so the device reads more than the bytes asked for, and the throttle meters
    # those.  Two workers with one read each in flight keep the throttle's queue from running dry, so
    # the device reads at the cap through the steady window (the loader is not what limits it), and
    # the discrete-event model replaying the run's own per-batch storage times (real, throttled) must
    # match the loader's stall.  The torch DataLoader on the same bytes and throttle is the peer check
    # (benchmarks/bench_fidelity.py).
    #
    # Why the device's rate, and not the stall against 1 - compute / (batch bytes x amplification / cap):
    # over a window of steps that formula is the stall itself once the device runs at the cap, so all
    # it can check is the kernel's throttle, which overshoots (53 MiB/s over a second at a 50 MiB/s cap
    # on this VM's kernel; a CI machine's stall sat 4 pp under the formula), and the run's mean
    # amplification is not the window's (2.57 over the late half where the run's was 2.38).  The
    # device counter, sampled by the system monitor on the step clock, gives the window's own bytes.
    tries = []
    for _ in range(ATTEMPTS):
        r = _throttled_run(raw_tokens, read_throttle, batch_size=128, steps=96, compute="8ms",
                           monitor_interval_s=0.1)
        m = r.metrics
        assert r.environment["loader"]["access"] == "map"
        dev = m["device_io"]
        amp = dev["read_amplification"]
        assert dev["requested_bytes"] == m["bytes_read"] and amp >= 1.0
        stall, busy = steady_stall(m, late=True)
        k0, k1 = late_half(m)
        t0, t1 = window_span(m, k0, k1)
        nbytes = window_device_bytes(m, t0, t1)
        rate = nbytes / (t1 - t0) / BW
        pred = predict_from_run(m, "map", 2, 2)
        tries.append({"late_device_rate_over_cap": rate, "late_stall": stall,
                      "cap_formula": bandwidth_stall(busy, nbytes / (k1 - k0), BW),
                      "late_amplification": nbytes / (k1 - k0) / m["batch_bytes"], STALL_RATIO: m[STALL_RATIO],
                      "model": pred.stall_ratio, "amplification": amp, "load_avg": os.getloadavg()[0]})
        # an attempt counts when both hold; like the other checks here, a shared disk gets ATTEMPTS tries
        # (a starved CPU leaves the workers' reads unissued and the device idle)
        if 0.85 <= rate <= 1.2 and abs(m[STALL_RATIO] - pred.stall_ratio) <= 0.03:
            return
    raise AssertionError(f"the throttled device did not read at its cap (0.85-1.2 x) over the late steady window, "
                         f"or the stall is beyond 3 pp of the model's replay, in every attempt: {tries}")


def late_half(m: dict) -> tuple[int, int]:
    k0, k1 = m["steady_window"]["from_step"], m["steady_window"]["to_step"]
    return (k0 + k1) // 2, k1


def window_span(m: dict, k0: int, k1: int) -> tuple[float, float]:
    """Steps ``[k0, k1)`` on the step clock: from step k0's start to the end of step k1 - 1."""
    s = m["series"]
    return s["t_s"][k0], s["t_s"][k1 - 1] + s["step_s"][k1 - 1]


def window_device_bytes(m: dict, t0: float, t1: float) -> float:
    """Device bytes read from ``t0`` to ``t1`` (s on the step clock), interpolated between the system
    monitor's samples of the run's device counter."""
    import numpy as np

    samples = [x for x in m["system"]["series"] if x.get("device_read_bytes") is not None]
    t, b = [x["t_s"] for x in samples], [x["device_read_bytes"] for x in samples]
    assert len(samples) >= 4 and t[0] <= t0 and t1 <= t[-1], "the monitor sampled the window"
    return float(np.interp(t1, t, b) - np.interp(t0, t, b))


def steady_stall(m: dict, late: bool = False) -> tuple[float, float]:
    """(the loader's steady-state stall, mean consumer time per step over its steady window): the window
    leaves out the drain of the workers' head start (iobench.loader.stability.steady_window).
    ``late``: over the second half of that window only."""
    from iobench.loader.stability import window_stall
    from iobench.planner.loader_sim import consumer_busy_s

    k0, k1 = late_half(m) if late else (m["steady_window"]["from_step"], m["steady_window"]["to_step"])
    s = m["series"]
    busy = consumer_busy_s(s)[k0:k1]
    steps = [w + b for w, b in zip(s["wait_s"], consumer_busy_s(s))]
    stall = window_stall(s["wait_s"], steps, (k0, k1)) if late else m[STALL_RATIO]
    return stall, sum(busy) / len(busy)
