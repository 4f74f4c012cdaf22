"""benchmarks/bench_dlio.py's references: the steady-state bandwidth truth and the one-epoch model of an
ideal PyTorch-style loader that says how far a short epoch departs from it (why the unet3d shape has 84
steps per epoch)."""

from __future__ import annotations

import pytest

from bench_helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_dlio")


def test_epoch_model_by_hand(bench):
    # 1 accelerator, 1 worker, 2 batches out, batch 1 of 1 MB at 1 MB/s: batches land at 1, 2, 3 s (batch 2
    # sent when batch 0 is taken at 1 s); steps of 0.5 s start there and the last ends at 3.5 s.  The AU
    # window opens at the first step's end (1.5 s: DLIO's block time less the first step's proc), so the
    # second step's wait is inside it: 1.0 s of compute over 2.0 s.
    m = bench.epoch_model(1e6, 1e6, 1, 0.5, 1, 1, 3, prefetch=2)
    assert m["samples_per_s"] == pytest.approx(3 / 3.5)
    assert m["au"] == pytest.approx(1.0 / 2.0)
    assert bench.truth(1e6, 1e6, 1, 0.5, 1) == {"samples_per_s": 1.0, "au": 0.5}


def test_epoch_model_sends_the_next_index_when_a_batch_is_taken(bench):
    # 2 workers, one batch out each: the first two batches share the disk and land at 2 s; batch 2 is sent
    # when batch 0 is taken (2 s) and has the disk to itself, landing at 3 s as step 1 ends: steps 2, 2.5,
    # 3; end 3.5; the measured steps never wait.  (The lock-step model this replaced read a fourth batch
    # that the epoch does not have, landed batch 2 at 4 s, and gave AU 0.5 over an end of 4.5 s.)
    m = bench.epoch_model(1e6, 1e6, 1, 0.5, 1, 2, 3)
    assert m["au"] == pytest.approx(1.0)
    assert m["samples_per_s"] == pytest.approx(3 / 3.5)


def test_an_ideal_loader_keeps_the_disk_busy_to_the_epochs_last_byte(bench):
    # The model read as a ceiling on AU; an ideal loader's disk never idles while the epoch has bytes left,
    # so the last byte lands at bytes / cap and only the last step or two run after it.  The lock-step
    # model computed its last group of 4 steps after the last byte (1.29 s, here 0.76 s more than this),
    # its AU 0.8 pp under what iobench's loader measured (55.0-55.3% at the unet3d shape, 100 MB/s).
    n, steps, batch, size, step = 2, 84, 7, 4.3068e6, 0.323
    plan = [[batch * size] * steps for _ in range(n)]
    opened, end, last = bench._epoch_timeline(1e8, plan, step, 4, 4)
    assert last == pytest.approx(n * steps * batch * size / 1e8, rel=1e-9)
    assert step <= end - last <= 2 * step
    m = bench.epoch_model(1e8, size, batch, step, n, 4, steps)
    assert opened[0] == pytest.approx(opened[1])       # equal batches: the two first batches land together
    assert m["au"] == pytest.approx((steps - 1) * step / (end - opened[0]))
    assert 0.550 < m["au"] < 0.556


def test_sample_sizes_that_vary_are_modelled_from_each_size(bench):
    sizes = [4e6] * 1176
    fixed = bench.epoch_model(1e8, 4e6, 7, 0.323, 2, 4, 84)
    assert bench.epoch_model(1e8, 4e6, 7, 0.323, 2, 4, 84, sizes=sizes) == pytest.approx(fixed)
    # the same mean, sizes 2 and 6 MB: batches of unequal size land unevenly; the model stays near the
    # fixed-size one and every shuffle is the same epoch for a given seed
    mixed = [2e6, 6e6] * 588
    a = bench.epoch_model(1e8, 4e6, 7, 0.323, 2, 4, 84, sizes=mixed)
    assert a == bench.epoch_model(1e8, 4e6, 7, 0.323, 2, 4, 84, sizes=mixed)
    assert a["au"] == pytest.approx(fixed["au"], abs=0.01)


def test_long_epochs_reach_the_steady_state_truth(bench):
    t = bench.truth(1e8, 4.15e6, 7, 0.323, 2)
    m = bench.epoch_model(1e8, 4.15e6, 7, 0.323, 2, 4, 20000)
    assert m["samples_per_s"] == pytest.approx(t["samples_per_s"], rel=1e-3)
    assert m["au"] == pytest.approx(t["au"], abs=1e-3)


def test_unet3d_shape_is_long_enough_for_the_target(bench):
    # the target is 5% / 3 pp of the truth: an ideal loader's own short epoch must sit inside it
    # with room to spare, which 20 steps (292 files on 2 accelerators: +9 pp) did not; 84 steps: +1.8 pp
    _, _, files, per_file, n, _, _ = bench.SHAPES["unet3d"]
    steps = files * per_file // (7 * n)
    assert files % n == 0                       # DLIO 2.0.0's get_global_map_index needs an even split
    t = bench.truth(1e8, 4.15e6, 7, 0.323, n)
    for s, inside in ((20, False), (steps, True)):
        m = bench.epoch_model(1e8, 4.15e6, 7, 0.323, n, 4, s)
        close = abs(m["samples_per_s"] / t["samples_per_s"] - 1) < 0.03 and abs(m["au"] - t["au"]) < 0.02
        assert close is inside, (s, m, t)


def test_round_ranges(bench):
    raw = [{"shape": "unet3d", "mode": "throttled",
            "per_round": {"iobench": [{"samples_per_s": 22.9, "au": 0.550}, {"samples_per_s": 23.0, "au": 0.553},
                                      {"error": "exit 1"}],
                          "dlio": []}}]
    assert bench._round_ranges(raw) == {("unet3d", "throttled", "iobench"): ("22.9-23.0", "55.0-55.3%")}


def test_each_accelerators_window_opens_at_its_own_first_compute(bench):
    # 1 MB/s, 2 accelerators of 1 worker (1 batch out), steps of 1 s.  Accelerator 0's first batch (0.5 MB)
    # lands at 1 s, accelerator 1's (1 MB) at 2 s; the barrier releases step 0 at 3 s, so accelerator 0
    # waits 1 s at it inside its window (DLIO: the block's time less the first step's proc): windows from
    # 2 and 3 s to the end at 4.5 s (accelerator 1's second batch lands at 3.5 s).
    m = bench.epoch_model(1e6, 0, 1, 1.0, 2, 1, 2, plans=[[[0.5e6, 1e6], [1e6, 1e6]]])
    assert m["au"] == pytest.approx((1 / 2.5 + 1 / 1.5) / 2)
    assert m["samples_per_s"] == pytest.approx(4 / 4.5)


def test_iobench_plans_are_the_shuffles_mlperf_run_reads(bench):
    from iobench.loader.sampler import map_epoch
    from iobench.mlperf.run import epoch_seed

    # sizes that name their sample (2**i bytes): each batch's bytes say which samples it holds
    sizes = [float(2 ** i) for i in range(28)]
    plans = bench.iobench_plans(sizes, 2, 7, 2, 2)
    for e, plan in enumerate(plans):
        for r in range(2):
            ids = map_epoch(28, 7, epoch_seed(0, 0, e), 0, r, 2, True, True).ids
            assert plan[r] == [sum(2.0 ** int(i) for i in ids[k * 7:(k + 1) * 7]) for k in range(2)]
    assert plans[0] != plans[1]                 # a new shuffle every epoch
    assert epoch_seed(0, 0, 1) == epoch_seed(0, 0, 0) + 1 and epoch_seed(0, 1, 0) != epoch_seed(0, 0, 0)
