"""Instrumented / emulated / faulty backend wrappers and the emulation-spec parser."""

from __future__ import annotations

import random
import time

import pytest

from iobench.errors import ConfigError
from iobench.storage import Backend, open_backend
from iobench.wrappers import (PROFILES, EmulatedBackend, FaultyBackend, InjectedFault, InjectedTimeout,
                              InstrumentedBackend, parse_emulation)


@pytest.fixture
def mem():
    b = open_backend(f"memory://wrappers-{time.perf_counter_ns()}")
    b.write_bytes("a.bin", b"x" * 100_000)
    yield b
    b.rm("", recursive=True)


def test_parse_specs():
    assert parse_emulation("const:250ms").latency_s == pytest.approx(0.25)
    ln = parse_emulation("lognormal:p50=20ms,p99=500ms")
    assert (ln.p50_s, ln.p99_s) == pytest.approx((0.02, 0.5))
    s = parse_emulation("pfs+spike:p=0.02,extra=300ms+bw:1GiB/s")
    assert s.kind == "lognormal" and s.spike_p == 0.02 and s.spike_s == pytest.approx(0.3)
    assert s.bandwidth_bytes_per_s == 1024**3
    assert not parse_emulation("none").active
    assert set(PROFILES) == {"nvme", "pfs", "object"}
    # the tier table's ordering: nvme faster than pfs faster than object store
    assert PROFILES["nvme"].p50_s < PROFILES["pfs"].p50_s < PROFILES["object"].p50_s


@pytest.mark.parametrize("bad", ["foo", "const:", "const:-1s", "lognormal:p50=1s", "lognormal:p50=2s,p99=1s",
                                 "spike:p=2,extra=1s", "bw:abc", "normal:mean=1s", "const:1s+"])
def test_bad_specs_are_config_errors(bad):
    with pytest.raises(ConfigError) as e:
        parse_emulation(bad)
    assert "--emulate" in str(e.value)


def test_lognormal_quantiles_match_spec():
    spec = parse_emulation("lognormal:p50=20ms,p99=500ms")
    rng = random.Random(1)
    draws = sorted(spec.sample_latency(rng) for _ in range(20000))
    assert draws[10000] == pytest.approx(0.02, rel=0.1)
    assert draws[19800] == pytest.approx(0.5, rel=0.2)


def test_spikes_add_extra_latency():
    spec = parse_emulation("const:1ms+spike:p=0.25,extra=1s")
    rng = random.Random(0)
    draws = [spec.sample_latency(rng) for _ in range(4000)]
    frac = sum(d > 0.5 for d in draws) / len(draws)
    assert 0.2 < frac < 0.3


def test_instrumented_counts_real_bytes_and_ops(mem):
    inst = InstrumentedBackend(mem)
    assert isinstance(inst, Backend)
    assert len(inst.cat("a.bin")) == 100_000
    assert len(inst.cat("a.bin", 10, 110)) == 100
    with inst.open("a.bin") as f:
        f.read(1000)
        f.read(50)
    assert inst.size("a.bin") == 100_000
    inst.write_bytes("b.bin", b"y" * 123)
    st = inst.stats()
    assert st["bytes_read"] == 100_000 + 100 + 1000 + 50
    assert st["bytes_written"] == 123
    assert st["calls"] == {"open": 1, "read": 4, "ttfb": 1, "metadata": 1, "write": 1}
    assert st["latency_s"]["read"]["count"] == 4
    enc = inst.stats(encode=True)["hist"]["read"]
    from iobench.metrics import LatencyHistogram
    assert LatencyHistogram.decode(enc).count == 4


def test_emulated_adds_latency_and_caps_bandwidth(mem):
    emu = InstrumentedBackend(EmulatedBackend(mem, "const:30ms+bw:2MB", seed=1))
    t0 = time.perf_counter()
    emu.cat("a.bin")  # 30 ms + 100 kB at 2 MB/s = 80 ms
    dt = time.perf_counter() - t0
    assert dt >= 0.078
    assert "emulated" in emu.describe()
    child = emu.child("sub")
    assert isinstance(child, InstrumentedBackend) and isinstance(child.inner, EmulatedBackend)


def test_faulty_injects_seeded_errors(mem):
    def run(seed):
        f = FaultyBackend(mem, error_rate=0.3, timeout_rate=0.1, seed=seed, timeout_s=0.001)
        out = []
        for _ in range(200):
            try:
                f.cat("a.bin")
                out.append("ok")
            except InjectedFault:
                out.append("err")
            except InjectedTimeout:
                out.append("timeout")
        return out

    a, b = run(7), run(7)
    assert a == b
    assert 30 < a.count("err") < 90 and 5 < a.count("timeout") < 40
    with pytest.raises(ConfigError):
        FaultyBackend(mem, error_rate=1.5)


@pytest.mark.parametrize("where", ["memory", "local"])
def test_cat_into_lands_in_the_callers_buffer_through_every_wrapper(mem, tmp_path, where):
    import numpy as np

    data = bytes(range(256)) * 400
    base = mem if where == "memory" else open_backend(str(tmp_path))
    base.write_bytes("c.bin", data, fsync=False)
    inst = InstrumentedBackend(FaultyBackend(EmulatedBackend(base, "const:1ms", seed=1), seed=1))
    out = np.zeros(1000, dtype=np.uint8)
    assert inst.cat_into("c.bin", 5000, 6000, out) == 1000
    assert out.tobytes() == data[5000:6000]
    # past the end: a short count, never bytes from elsewhere
    tail = np.zeros(1000, dtype=np.uint8)
    assert inst.cat_into("c.bin", len(data) - 10, len(data) + 990, tail) == 10
    assert tail[:10].tobytes() == data[-10:]
    st = inst.stats()
    assert st["bytes_read"] == 1010 and st["calls"]["read"] == 2
    assert inst.read_client == ("memory" if where == "memory" else "file")
    # cat_buffer: the bytes as some buffer, counted like any read
    assert bytes(memoryview(inst.cat_buffer("c.bin", 100, 300))) == data[100:300]
    st = inst.stats()
    assert st["bytes_read"] == 1210 and st["calls"]["read"] == 3


def test_unknown_s3_client_is_a_config_error():
    from iobench.loader.core import LoadConfig

    with pytest.raises(ConfigError) as e:
        LoadConfig(dataset="x", s3_client="boto")
    assert e.value.field == "load.s3_client"


@pytest.mark.parametrize("spec,workers,each,scope", [
    ("bw:100MB", 4, 25e6, "tier aggregate, shared by 4 worker(s)"),
    ("bw:100MB/s", 1, 100e6, "tier aggregate, shared by 1 worker(s)"),
    ("bw:100MB/s,per=worker", 4, 100e6, "per worker"),
    ("const:5ms+bw:1GB,per=worker", 2, 1e9, "per worker"),
    ("pfs", 8, 4e9 / 8, "tier aggregate, shared by 8 worker(s)"),
])
def test_bandwidth_is_the_tiers_aggregate_unless_named_per_worker(spec, workers, each, scope):
    s = parse_emulation(spec).for_workers(workers)
    assert s.bandwidth_bytes_per_s == pytest.approx(each)
    assert s.describe()["bandwidth_scope"] == scope
    assert s.describe()["bandwidth_bytes_per_s"] == pytest.approx(each if scope == "per worker" else each * workers)
    assert s.for_workers(workers) == s          # splitting twice is splitting once


def test_bandwidth_scope_typo_is_refused():
    with pytest.raises(ConfigError):
        parse_emulation("bw:100MB,per=wroker")


@pytest.mark.parametrize("late_s", [0.0, 0.0003, 0.002, 0.019])
def test_paced_requests_do_not_add_up_late_wake_ups(late_s):
    # 100 requests of 10 kB at 10 MB/s (1 ms each), each starting when the previous one's sleep woke,
    # `late_s` after its scheduled end: the transfer ends at 100 ms, not 100 x (1 ms + late_s)
    from iobench.io.ratelimit import RateLimiter

    lim = RateLimiter(10e6)
    t = 1000.0
    for i in range(100):
        end = lim.schedule(10_000, t, credit_s=late_s if i else 0.0)
        t = end + late_s
    assert end == pytest.approx(1000.0 + 0.1, abs=1e-9)


@pytest.mark.parametrize("away_s", [0.0, 0.0005, 0.003])
def test_a_streamed_transfer_keeps_moving_while_its_caller_is_away(away_s):
    # 100 pieces of 10 kB at 10 MB/s (1 ms each) of one stream, the caller away `away_s` after each
    # (parsing it): with a receive buffer the transfer never paused and ends at 100 ms; without one
    # it ends at 100 x (1 ms + away_s)
    from iobench.io.ratelimit import RateLimiter

    for carry_s, want in ((0.05, 0.1), (0.0, 0.1 + 99 * away_s)):
        lim = RateLimiter(10e6)
        t = 1000.0
        for i in range(100):
            end = lim.schedule(10_000, t, carry_s=carry_s if i else 0.0)
            t = end + away_s
        assert end == pytest.approx(1000.0 + want, abs=1e-9)


def test_a_streamed_transfer_buffers_no_more_than_its_carry():
    from iobench.io.ratelimit import RateLimiter

    lim = RateLimiter(10e6)
    assert lim.schedule(10_000, 5.0) == pytest.approx(5.001)
    # away 1 s with a 2 ms buffer: 2 ms of the next piece arrived meanwhile, not a second's worth
    assert lim.schedule(30_000, 6.001, carry_s=0.002) == pytest.approx(6.001 - 0.002 + 0.003)
    # a concurrent request still queues behind the pipe
    assert lim.schedule(10_000, 6.0, carry_s=0.002) == pytest.approx(6.002 + 0.001)


def test_paced_requests_after_an_idle_gap_start_afresh_and_queue_when_concurrent():
    from iobench.io.ratelimit import RateLimiter

    lim = RateLimiter(10e6)
    assert lim.schedule(10_000, 5.0) == pytest.approx(5.001)
    assert lim.schedule(10_000, 6.0) == pytest.approx(6.001)          # idle for a second: starts afresh
    assert lim.schedule(10_000, 7.0, credit_s=5.0) == pytest.approx(7.0 - 0.02 + 0.001)   # credit capped
    assert lim.schedule(10_000, 6.98) == pytest.approx(6.981 + 0.001)  # concurrent: one pipe, queued
