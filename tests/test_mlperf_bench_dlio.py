"""benchmarks/bench_dlio.py's references: the steady-state bandwidth truth and the one-epoch model
that says how far a short epoch departs from it (why the unet3d shape has 84 steps per epoch)."""

from __future__ import annotations

import pytest

from bench_helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_dlio")


def test_epoch_model_by_hand(bench):
    # 1 accelerator, 1 worker, batch 1 of 1 MB at 1 MB/s: batches land at 1, 2, 3 s; steps of 0.5 s start
    # there and the last ends at 3.5 s.  AU over steps 2..3: 1.0 s of compute from 2.0 to 3.5 s.
    m = bench.epoch_model(1e6, 1e6, 1, 0.5, 1, 1, 3)
    assert m["samples_per_s"] == pytest.approx(3 / 3.5)
    assert m["au"] == pytest.approx(1.0 / 1.5)
    assert bench.truth(1e6, 1e6, 1, 0.5, 1) == {"samples_per_s": 1.0, "au": 0.5}


def test_epoch_model_groups_of_workers(bench):
    # 2 workers: the first two batches land together at 2 s, so step 2 does not wait (the excluded first
    # step's wait carried it): starts 2, 2.5, 4; end 4.5; AU 1.0 / (4.5 - 2.5)
    m = bench.epoch_model(1e6, 1e6, 1, 0.5, 1, 2, 3)
    assert m["au"] == pytest.approx(0.5)
    assert m["samples_per_s"] == pytest.approx(3 / 4.5)


def test_long_epochs_reach_the_steady_state_truth(bench):
    t = bench.truth(1e8, 4.15e6, 7, 0.323, 2)
    m = bench.epoch_model(1e8, 4.15e6, 7, 0.323, 2, 4, 20000)
    assert m["samples_per_s"] == pytest.approx(t["samples_per_s"], rel=1e-3)
    assert m["au"] == pytest.approx(t["au"], abs=1e-3)


def test_unet3d_shape_is_long_enough_for_the_target(bench):
    # the target is 5% / 3 pp of the truth: the shape's own epoch must sit well inside it, which
    # 20 steps (292 files on 2 accelerators) did not
    _, _, files, per_file, n, _, _ = bench.SHAPES["unet3d"]
    steps = files * per_file // (7 * n)
    assert files % n == 0                       # DLIO 2.0.0's get_global_map_index needs an even split
    t = bench.truth(1e8, 4.15e6, 7, 0.323, n)
    for s, inside in ((20, False), (steps, True)):
        m = bench.epoch_model(1e8, 4.15e6, 7, 0.323, n, 4, s)
        close = abs(m["samples_per_s"] / t["samples_per_s"] - 1) < 0.03 and abs(m["au"] - t["au"]) < 0.015
        assert close is inside, (s, m, t)
