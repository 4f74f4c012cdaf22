"""Loader building blocks: HDR summaries, compute emulation, retries, slots, delivery, suite stage."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import random
import time

import pytest

from iobench.errors import ConfigError, StorageError
from iobench.loader.compute import Compute, parse_compute
from iobench.loader.messages import Done
from iobench.io.retry import RetryPolicy
from iobench.metrics import LatencyHistogram


def test_summary_survives_encode_decode():
    for seed in range(4):
        rng = random.Random(seed)
        h = LatencyHistogram()
        for _ in range(rng.randint(1, 2000)):
            h.record_s(rng.lognormvariate(-5, 2))
        assert LatencyHistogram.decode(h.encode()).summary() == h.summary()


def test_compute_models():
    assert parse_compute("200ms").nominal_s == pytest.approx(0.2)
    n = Compute(parse_compute("normal:mean=20ms,std=5ms", seed=1))
    draws = [n.duration(i) for i in range(2000)]
    assert sum(draws) / len(draws) == pytest.approx(0.02, rel=0.05)
    ln = parse_compute("lognormal:p50=10ms,p99=40ms")
    assert ln.kind == "lognormal" and ln.nominal_s == pytest.approx(0.01)
    t0 = time.perf_counter()
    assert Compute(parse_compute("30ms", mode="spin"))(None, 0) >= 0.03
    assert time.perf_counter() - t0 >= 0.03
    for bad in ("-1ms", "normal:mean=1ms", "lognormal:p50=2s,p99=1s", "file:/nonexistent/steps.txt", "soon"):
        with pytest.raises(ConfigError):
            parse_compute(bad)
    with pytest.raises(ConfigError):
        parse_compute("1ms", mode="callback")


def test_compute_from_file_and_callback(tmp_path):
    f = tmp_path / "steps.txt"
    f.write_text("# measured\n0.01\n20ms\n")
    c = Compute(parse_compute(f"file:{f}"))
    assert [c.duration(i) for i in range(3)] == pytest.approx([0.01, 0.02, 0.01])
    import sys
    import types

    seen = []
    mod = types.ModuleType("iobench_test_step")
    mod.step = lambda batch, step: seen.append((batch, step))
    sys.modules["iobench_test_step"] = mod
    try:
        cb = Compute(parse_compute("0ms", mode="callback", callback="iobench_test_step:step"))
        cb("batch", 7)
    finally:
        del sys.modules["iobench_test_step"]
    assert seen == [("batch", 7)]
    with pytest.raises(ConfigError):
        Compute(parse_compute("0ms", mode="callback", callback="no_such_module_xyz:step"))


def test_retry_policy_backs_off_then_names_the_request():
    calls = []

    def flaky():
        calls.append(time.perf_counter())
        if len(calls) < 3:
            raise ConnectionError("reset")
        return b"ok"

    assert RetryPolicy(attempts=5, base_delay_s=0.01).call(flaky, lambda: "GET x", random.Random(0)) == b"ok"
    assert len(calls) == 3
    t0 = time.perf_counter()
    with pytest.raises(StorageError) as e:
        RetryPolicy(attempts=50, base_delay_s=0.05, budget_s=0.5).call(
            lambda: (_ for _ in ()).throw(TimeoutError("slow")), lambda: "GET s3://b/k bytes 0-10", random.Random(0))
    assert "GET s3://b/k" in str(e.value) and "TimeoutError" in str(e.value)
    assert time.perf_counter() - t0 < 2
    with pytest.raises(FileNotFoundError):  # not retried
        RetryPolicy().call(lambda: (_ for _ in ()).throw(FileNotFoundError("x")), lambda: "GET", random.Random(0))


def test_slot_pool_orders_batches():
    import multiprocessing as mp

    from iobench.loader.slots import SlotPool

    ctx = mp.get_context("fork")
    pool = SlotPool(ctx, 2, 16)
    stop = ctx.Event()
    try:
        assert pool.acquire(0, stop) == 0 and pool.acquire(1, stop) == 1
        stop.set()
        assert pool.acquire(2, stop) is None        # slot 0 still holds batch 0
        stop.clear()
        pool.release(0)
        assert pool.acquire(2, stop) == 0
    finally:
        pool.close()


def _wait_for_slot(pool, k, stop, out) -> None:
    out.put("started")
    out.put(pool.acquire(k, stop, wid=0))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_wake_pipes_reach_workers_not_forked_from_the_consumer(method):
    """A spawned or forkserver worker sleeps on its wake pipe and wakes on the consumer's release.

    The pipes were once bare fd numbers, valid only in a forked child; the fds held open here push
    the pool's pipes to numbers a fresh child does not have, so that bug fails this test at once.
    """
    import multiprocessing as mp
    import os

    from iobench.loader.slots import SlotPool

    ctx = mp.get_context(method)
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(64)]
    pool = SlotPool(ctx, 2, 16, workers=1)
    stop, out = ctx.Event(), ctx.Queue()
    p = ctx.Process(target=_wait_for_slot, args=(pool, 2, stop, out), daemon=True)
    try:
        p.start()
        assert out.get(timeout=60) == "started"      # (a spawned child takes a while to import)
        time.sleep(0.3)                              # the worker is asleep: slot 0 still holds batch 0
        assert out.empty()
        pool.release(0, next_worker=0)
        assert out.get(timeout=30) == 0
        p.join(10)
        assert p.exitcode == 0
    finally:
        stop.set()
        p.join(5)
        pool.close()
        for fd in held:
            os.close(fd)


def test_receiver_polls_sent_counter_then_falls_back_to_the_pipe():
    import multiprocessing as mp
    import threading

    from iobench.loader.receiver import Receiver

    ctx = mp.get_context("fork")
    r, w = ctx.Pipe(duplex=False)
    sent = ctx.Array("q", 1, lock=False)
    rx = Receiver([r], [], sent=sent, spin_s=0.05)
    try:
        def meta(k):
            return ("batch", {"k": k, "worker": 0, "io_s": 0.001})

        w.send(meta(0))
        sent[0] += 1                      # counter moved: read while polling
        assert rx.wait_batch(0)["k"] == 0 and rx.got == [1]
        w.send(meta(1))                   # counter not moved (e.g. a late store): the blocking read still gets it
        assert rx.wait_batch(1)["k"] == 1 and rx.got == [2]
        t = threading.Timer(0.1, lambda: (w.send(meta(2)), sent.__setitem__(0, sent[0] + 2)))
        t.start()                         # arrives after the poll gave up: the pipe wait takes over
        t0 = time.perf_counter()
        assert rx.wait_batch(2)["k"] == 2
        assert time.perf_counter() - t0 < 2
        t.join()
    finally:
        r.close()
        w.close()


def test_emitter_array_fast_path_delivers_the_rows_and_ids_of_the_order():
    """The block path's fixed-row batches (gathered straight into the slot, ids sliced from the block's
    delivery order) carry the same bytes, ids and sizes as the general collate path, in the slot and,
    for a batch larger than a slot, pickled inline (the one path for rows in an array: _collate takes samples)."""
    import multiprocessing as mp
    from types import SimpleNamespace

    import numpy as np

    from iobench.loader.receiver import Sender
    from iobench.loader.slots import SlotPool, batch_from_meta
    from iobench.loader.worker import _BlockData, _Emitter

    ctx = mp.get_context("fork")
    rows = np.arange(40, dtype=np.uint16).reshape(10, 4)      # 8 bytes a row
    ids = np.arange(100, 110)
    order = np.array([7, 2, 9, 0, 5, 1])
    for slot_bytes, inline in ((64, False), (16, True)):
        pool = SlotPool(ctx, 3, slot_bytes, workers=1)
        r, w = ctx.Pipe(duplex=False)
        job = SimpleNamespace(synthetic=False, wid=0, lag=0, round_need=None, manifest=SimpleNamespace(total_bytes=80, total_samples=10))
        stats = {"busy_s": 0.0, "slot_wait_s": 0.0, "batches": 0, "samples": 0, "payload_bytes": 0}
        emit = _Emitter(job, pool, Sender(w, pool.sent, 0), ctx.Event(), stats)
        try:
            bd = _BlockData(rows, None, ids)
            wire = np.ascontiguousarray(ids[order], dtype="<i8")
            for k, (a, b) in enumerate(((0, 3), (3, 6))):
                emit(k, 0, bd, order[a:b], 0.0, 0.0, ids=wire[a:b])
                msg = r.recv()
                assert msg[0] == "batch"
                meta = msg[1]
                assert (meta["inline"] is not None) == inline
                assert meta["nbytes"] == 24 and meta["shape"] == (3, 4) and meta["n"] == 3
                got = batch_from_meta(meta, pool)
                assert got.data.tolist() == rows[order[a:b]].tolist()
                assert got.indices.tolist() == ids[order[a:b]].tolist()
                del got
                pool.release(k)
            assert stats["payload_bytes"] == 48 and stats["samples"] == 6
        finally:
            emit._views.clear()
            r.close()
            w.close()
            pool.close()


def test_delivery_registry():
    from iobench.loader.delivery import get_delivery, register_delivery

    assert get_delivery("cpu")("b") == "b"
    register_delivery("test-dev", lambda b: ("moved", b))
    assert get_delivery("test-dev")("b") == ("moved", "b")
    with pytest.raises(ConfigError):
        get_delivery("tpu")


def test_suite_stage_loads_each_dataset(tmp_path):
    from iobench.generate import GenSpec, generate
    from iobench.suite.load import PASSES, suite_stage
    from iobench.suite import SuiteContext
    from iobench.suite.state import GeneratedDataset

    ctx = SuiteContext(out_dir=tmp_path / "out", work_dir=tmp_path / "work")
    ds = []
    for fmt in ("raw", "tar"):
        url = str(tmp_path / fmt)
        generate(GenSpec(format=fmt, modality="tokens", num_samples=128, shard_size="64 samples", seq_len=32,
                         vocab_size=1000, fsync=False), url, progress=False)
        ds.append(GeneratedDataset(name=f"{fmt}-tokens", format=fmt, modality="tokens", url=url, location="local"))
    ctx.state.datasets = ds
    out = suite_stage(ctx)
    assert out["datasets"] == 2
    # the embedded (quick) run measures local loads cold only: warm = cold on its few-MiB datasets
    assert len(ctx.results_files) == 2 and all(p.exists() for p in ctx.results_files)
    assert all("skipped" in e["warm"] for e in out["per_dataset"].values())
    assert [r[0] for r in ctx.rows] == ["load", "load"]
    assert out["per_dataset"]["local/raw-tokens"]["prefetch"]["depth_recommended"] >= 3
    # every load measured in PASSES passes (no S3 server here to restart between them)
    assert out["passes"] == PASSES and out["server_instances"] is None
    assert all(e["cold"]["passes"] == PASSES for e in out["per_dataset"].values())


def test_merge_ranks_takes_max_durations_sums_bytes_merges_histograms():
    from iobench.loader.ranks import merge_ranks

    def rank(stall, wall, n, waits):
        h = LatencyHistogram()
        for w in waits:
            h.record_s(w)
        return {STALL_RATIO: stall, "wall_s": wall, "samples": n, "bytes_read": n * 10, "steps": 5,
                "batch_bytes": 100.0, "batch_wait_hist": h.encode()}

    m = merge_ranks([rank(0.1, 2.0, 100, [0.01] * 10), rank(0.3, 4.0, 100, [0.5] * 10)])
    assert m[STALL_RATIO] == 0.3 and m["wall_s"] == 4.0 and m["samples"] == 200
    assert m["throughput"]["bytes_per_s"] == pytest.approx(2000 / 4.0)
    assert m["batch_wait_s"]["count"] == 20
    assert m["batch_wait_s"]["p50"] == pytest.approx(0.01, rel=0.01) and m["batch_wait_s"]["max"] == pytest.approx(0.5, rel=0.01)


def test_sender_holds_batches_for_one_message_and_flushes_before_anything_else():
    import multiprocessing as mp

    from iobench.loader.receiver import Receiver, Sender

    ctx = mp.get_context("fork")
    r, w = ctx.Pipe(duplex=False)
    sent = ctx.Array("q", 1, lock=False)
    tx = Sender(w, sent, 0, max_held=3)
    rx = Receiver([r], [], sent=sent)
    try:
        def meta(k):
            return {"k": k, "worker": 0}

        tx.batch(meta(0), hold=True)
        tx.batch(meta(1), hold=True)
        assert not r.poll(0) and sent[0] == 0          # held: nothing written, nothing counted
        tx.batch(meta(2), hold=False)                  # the last of a run: all three in one message
        assert sent[0] == 3
        assert r.poll(0)
        assert rx.wait_batch(0)["k"] == 0 and rx.got == [3] and rx.ready() == 2
        assert not r.poll(0)                           # one message carried them all
        for k in range(3, 7):                          # max_held bounds a run: 3 held, then out
            tx.batch(meta(k), hold=True)
        assert sent[0] == 6
        tx.send(Done(0, {}))                           # any other message: held batches go first, in order
        assert sent[0] == 7
        assert [rx.wait_batch(k)["k"] for k in range(1, 7)] == list(range(1, 7))
        rx.wait_done(1, 5)
        assert 0 in rx.done
    finally:
        r.close()
        w.close()


def test_slot_wait_flushes_held_batches_first():
    import multiprocessing as mp

    from iobench.loader.slots import SlotPool

    ctx = mp.get_context("fork")
    pool = SlotPool(ctx, 1, 64, workers=1)
    calls = []
    pool.before_wait = lambda: calls.append(1)
    stop = ctx.Event()
    try:
        assert pool.acquire(0, stop) == 0 and calls == []   # free slot: no flush, no wait
        stop.set()
        assert pool.acquire(1, stop) is None and calls == [1]   # would sleep: flushed once first
    finally:
        pool.close()


def test_worker_polls_for_its_slot_before_it_sleeps(monkeypatch):
    """With a core to spare (spin_s), a worker waiting for a slot polls the release counters and
    never sleeps on its wake pipe when the slot comes free within the poll: the consumer's
    release then wakes no sleeping process (the wake-up cost the consumer 20-40 us a step)."""
    import multiprocessing as mp
    import threading

    from iobench.loader import slots as slots_mod
    from iobench.loader.slots import SlotPool

    ctx = mp.get_context("fork")
    pool = SlotPool(ctx, 1, 64, workers=1, spin_s=30.0)
    stop = ctx.Event()

    def no_sleep(*a, **k):
        raise AssertionError("the worker slept on its wake pipe")

    monkeypatch.setattr(slots_mod.select, "select", no_sleep)
    try:
        assert pool.acquire(0, stop) == 0
        t = threading.Timer(0.05, lambda: pool.released.__setitem__(0, 1))   # a release with no wake byte
        t.start()
        assert pool.acquire(1, stop) == 0
        t.join()
        stop.set()
        assert pool.acquire(2, stop) is None    # a stop ends the poll
    finally:
        pool.close()


def test_worker_holds_a_batch_only_while_the_consumer_has_two_in_hand():
    import multiprocessing as mp
    from types import SimpleNamespace

    import numpy as np

    from iobench.loader.receiver import Sender
    from iobench.loader.slots import SlotPool
    from iobench.loader.worker import _BlockData, _Emitter

    ctx = mp.get_context("fork")
    pool = SlotPool(ctx, 8, 64, workers=1)
    r, w = ctx.Pipe(duplex=False)
    job = SimpleNamespace(synthetic=True, wid=0, lag=0, round_need=None, manifest=SimpleNamespace(total_bytes=8, total_samples=8))
    stats = {"busy_s": 0.0, "slot_wait_s": 0.0, "batches": 0, "samples": 0, "payload_bytes": 0}
    emit = _Emitter(job, pool, Sender(w, pool.sent, 0), ctx.Event(), stats)
    ids = np.arange(2)
    try:
        def one(k):
            emit(k, 0, _BlockData(None, None, ids), np.arange(2), 0.0, 0.0, more=True)

        one(0)
        assert pool.sent[0] == 1          # the consumer has nothing in hand: sent at once, though more follow
        one(1)
        assert pool.sent[0] == 2          # it has one (its step's): still sent at once
        one(2)
        assert pool.sent[0] == 2          # it has two: this one may wait for the next
        pool.release(0)                   # the consumer is down to one in hand
        one(3)
        assert pool.sent[0] == 4          # held and new go out together
        assert pool.queued() == 3
    finally:
        r.close()
        w.close()
        pool.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_failing_compute_fn_names_itself_and_the_step(tmp_path_factory, workers):
    """A callback step that raises ends the load with an IobenchError naming the function, the step
    and the error (its traceback chained), with workers and without."""
    import sys
    import types

    from loader_helpers import quiet_cfg, tokens_dataset

    from iobench.errors import IobenchError
    from iobench.loader.core import run_load

    def step(batch, k):
        if k == 2:
            raise ValueError("boom")

    mod = types.ModuleType("iobench_failing_step")
    mod.step = step
    sys.modules["iobench_failing_step"] = mod
    url = tokens_dataset(tmp_path_factory, "failing", 64, 16)
    try:
        with pytest.raises(IobenchError, match=r"--compute-fn iobench_failing_step:step failed at step 2: "
                                               r"ValueError: boom") as e:
            run_load(quiet_cfg(url, 4, workers=workers, compute_mode="callback", compute_fn="iobench_failing_step:step"))
    finally:
        del sys.modules["iobench_failing_step"]
    assert isinstance(e.value.__cause__, ValueError)


def test_the_open_file_limit_refuses_too_many_workers_or_too_deep_a_prefetch(monkeypatch, tmp_path):
    """Before any process starts: a worker count the fd limit cannot carry names --workers (with the most
    that fit), a prefetch depth it cannot carry names --prefetch; a load that fits passes."""
    import resource

    from iobench.loader.core import LoadConfig

    monkeypatch.setattr(resource, "getrlimit", lambda _which: (100, 100))
    LoadConfig(dataset=str(tmp_path), workers=2, prefetch=2)   # 64 + 2 x 8 + 5 slots = 85 descriptors
    with pytest.raises(ConfigError, match=r"20 batches in flight per worker need ~121 open files") as e:
        LoadConfig(dataset=str(tmp_path), workers=2, prefetch=20)
    assert e.value.field == "--prefetch"
    with pytest.raises(ConfigError, match=r"10 workers need ~165 open files, the limit is 100") as e:
        LoadConfig(dataset=str(tmp_path), workers=10, prefetch=2)
    assert e.value.field == "--workers" and "use at most 3 workers" in str(e.value.fix)
