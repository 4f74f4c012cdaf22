"""Intervals, run-until-stable, the workers + depth advice, and the honest headline."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import numpy as np
import pytest

from iobench.generate import GenSpec, generate
from iobench.loader.analysis import recommend
from iobench.loader.core import LoadConfig, run_load
from iobench.loader.stability import (mean_interval, quantile_interval, rate_interval, stall_interval, steady_window,
                                      window_stall)
from iobench.planner.loader_sim import bandwidth_stall, schedule_for, simulate
from iobench.planner.pipeline import loader_plan, prefetch_depth


def test_p99_interval_needs_enough_values_and_covers_the_truth():
    rng = np.random.default_rng(1)
    few = quantile_interval(rng.lognormal(0, 1, 100))
    assert few["high"] is None and "at least 382" in few["note"]
    truth = float(np.exp(2.3263478740408408))        # lognormal(0, 1) P99
    covered = 0
    for seed in range(40):
        q = quantile_interval(np.random.default_rng(seed).lognormal(0, 1, 2000))
        covered += q["low"] <= truth <= q["high"]
    assert covered >= 34                               # ~95% coverage


def test_mean_and_rate_intervals_of_repeats():
    # Student t over independent repeats: covers the true mean ~95% of the time; a rate's interval is
    # the time interval inverted (so not symmetric), and one repeat has none
    covered = 0
    for seed in range(60):
        covered += (lambda m: m["low"] <= 0.2 <= m["high"])(
            mean_interval(np.random.default_rng(seed).normal(0.2, 0.03, 6)))
    assert covered >= 51
    times = [0.5, 0.4, 0.6, 0.5, 0.5]
    r = rate_interval(100.0, times)
    lt = mean_interval(np.log(times))
    assert r["value"] == pytest.approx(100.0 / np.exp(np.mean(np.log(times)))) and r["n"] == 5
    assert r["low"] == pytest.approx(100.0 / np.exp(lt["high"])) and r["high"] == pytest.approx(100.0 / np.exp(lt["low"]))
    assert r["low"] < r["value"] < r["high"]
    skewed = rate_interval(100.0, [0.4, 0.01, 0.011, 0.012])   # a slow first repeat: still a finite interval
    assert 0 < skewed["low"] < skewed["value"] < skewed["high"] < float("inf")
    assert rate_interval(100.0, [0.5])["low"] is None and mean_interval([0.5])["note"] == "one repeat: no interval"


def test_stall_interval_batch_means():
    rng = np.random.default_rng(0)
    w = rng.random(400) * 0.1
    s = w + 0.2
    iv = stall_interval(w, s)
    assert iv["groups"] == 20 and iv["low"] < iv["value"] < iv["high"]
    assert iv["value"] == pytest.approx(w.sum() / s.sum())
    assert stall_interval(w[:8], s[:8])["half_width"] is None


def test_steady_window_leaves_out_the_head_start_drain():
    # Storage-bound (one batch per 100 ms from 2 workers sharing the bandwidth), compute 60 ms: the truth is
    # 1 - 60/100 = 40%.  The workers started 1 s before the clock and hold W·Q = 8 batches of head start:
    # counting every step but the first (MLPerf) reads ~10 pp low on 40 steps; the steady window does not.
    n, c = 40, 0.060
    r = simulate(schedule_for("map", n, 2, 4), [0.200] * n, [c] * n, start_s=[-1.0, -1.0])
    truth = bandwidth_stall(c, 100, 1000)   # batch 100 B at 1000 B/s = 100 ms
    waits = list(r.wait_s)
    steps = [w + c for w in waits]
    k0, k1, _ = steady_window(waits)
    assert k0 > 5 and k1 >= n - 3
    assert abs(window_stall(waits, steps, (k0, k1)) - truth) < 0.01
    assert truth - r.stall_ratio > 0.05                      # the MLPerf count: the drain dilutes it
    assert simulate(schedule_for("map", n, 2, 4), [0.200] * n, [c] * n, start_s=[-1.0, -1.0],
                    window=(k0, k1)).stall_ratio == pytest.approx(truth, abs=0.01)
    # compute-bound, waits only at start-up: every step but the first, as MLPerf counts
    assert steady_window([0.5, 0.01, 0.0, 0.02] + [0.0] * 36)[:2] == (1, 40)


def test_loader_plan_formulas():
    # the domain models' example: P99 600 ms, compute 200 ms -> depth 3 for one producer
    assert prefetch_depth(0.6, 0.2).depth_min == 3
    p = loader_plan(0.1, 0.6, 0.2, batch_bytes=1e6)
    assert (p.workers, p.prefetch_factor, p.depth_total, p.host_bytes) == (1, 3, 3, 4e6)
    # const 200 ms per batch, 20 ms steps: ten producers at least, then W divides the depth
    p = loader_plan(0.2, 0.2, 0.02)
    assert p.workers_min == 10 and p.workers == 13 and p.prefetch_factor == 1 and p.stall_floor == 0
    capped = loader_plan(0.2, 0.2, 0.02, max_workers=4)
    assert capped.stall_floor == pytest.approx(1 - 4 * 0.02 / 0.2)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("st") / "tok")
    generate(GenSpec(format="raw", modality="tokens", num_samples=2048, shard_size="512 samples", seq_len=16,
                     vocab_size=1000, fsync=False), url, progress=False)
    return url


def test_until_stable_stops_with_its_intervals(ds):
    r = run_load(LoadConfig(dataset=ds, workers=1, batch_size=8, compute="1ms", until_stable=True, min_steps=20,
                            max_time_s=1.5, stall_ci=0.5, p99_ci=10.0, monitor_interval_s=1.0))
    m = r.metrics
    assert m["stopped_early"] in ("stable", "time cap 1.5 s")
    # the stall interval is over the steady window (every step but the first, or less where waits mark
    # the head start's drain: steady_window)
    win = m["steady_window"]
    assert m["intervals"][STALL_RATIO]["n"] == win["to_step"] - win["from_step"] <= m["steps"] - 1
    assert m["stability"]["until_stable"] is True
    if m["stopped_early"] == "stable":
        assert m["stable"] and m["steps"] >= 382       # a P99 interval needs that many batches
    else:
        assert not m["stable"] and any("not stable" in w for w in r.warnings)


def test_short_run_says_it_is_not_stable_and_warns_about_zero_compute(ds):
    r = run_load(LoadConfig(dataset=ds, workers=1, batch_size=8, steps=12, monitor_interval_s=1.0))
    assert r.metrics["stable"] is False
    assert any(w.startswith("not stable after 12 steps") for w in r.warnings)
    assert any("zero-time step" in w for w in r.warnings)
    rec = recommend(r.metrics, 0.0)
    assert rec["depth_min"] is None and "give --compute-ms" in rec["note"]


def test_warnings_for_idle_workers_and_barely_sampled_emulation(ds):
    r = run_load(LoadConfig(dataset=ds, access="stream", workers=8, batch_size=8, steps=6, compute="1ms",
                            emulate="const:1ms", monitor_interval_s=1.0))
    text = " | ".join(r.warnings)
    assert "4 shard(s) for 8 workers" in text and "emulated storage saw only" in text


def test_recommend_uses_service_times_and_divides_depth_over_workers(ds):
    r = run_load(LoadConfig(dataset=ds, workers=1, prefetch=1, batch_size=8, steps=20, compute="10ms",
                            emulate="const:5ms", monitor_interval_s=1.0))
    rec = recommend(r.metrics, 0.01, max_workers=64)
    s = r.metrics["batch_service_s"]
    assert rec["p99_batch_service_s"] == s["p99"]
    lp = loader_plan(s["mean"], s["p99"], 0.01, r.metrics["batch_bytes"])
    assert (rec["workers_recommended"], rec["prefetch_factor_recommended"]) == (lp.workers, lp.prefetch_factor)
    assert rec["workers_recommended"] >= 4            # 8 x 5 ms = 40 ms per batch against 10 ms steps


def test_headline_says_warmup_and_stability():
    from iobench.commands.load import headline, repeat_spread

    m = {STALL_RATIO: 0.1, "accelerator_utilization": 0.9, "wall_clock_utilization": 0.5, "steps": 12,
         "throughput": {"samples_per_s": 10.0, "bytes_per_s": 100.0, "steady_samples_per_s": 10.0},
         "batch_service_s": {"p99": 0.2}, "batch_io_s": {"p99": 0.1}, "access": "map", "stable": False,
         "warmup_s": 4.2, "warmup_fraction": 0.57,
         "intervals": {STALL_RATIO: {"half_width": None}, "batch_service_p99_s": {"high": None}}}
    line = headline(m)
    assert "50.0% wall-clock" in line and "NOT stable" in line and "warm-up 4.20 s is 57%" in line
    assert "too few batches" in line and "no interval" in line
    sp = repeat_spread([m, m | {"throughput": {**m["throughput"], "steady_samples_per_s": 10.4}}])
    assert sp["n"] == 2 and sp["within_5_percent"] and sp["steady_samples_per_s"]["relative_spread"] > 0
    # one repeat policy: the mean with its Student t 95% interval, as the suite's merge_repeats gives
    from iobench.loader.stability import mean_interval

    iv = mean_interval([10.0, 10.4])
    assert sp["steady_samples_per_s"]["mean"] == iv["value"]
    assert sp["steady_samples_per_s"]["ci95"] == [iv["low"], iv["high"]] and sp[STALL_RATIO]["ci95"] == [0.1, 0.1]


def test_compare_passes_runs_whose_stall_intervals_overlap():
    from iobench.report.compare import compare, regressions

    a = {"metrics": {STALL_RATIO: 0.10, "intervals": {STALL_RATIO: {"low": 0.05, "high": 0.15}}}}
    b = {"metrics": {STALL_RATIO: 0.19, "intervals": {STALL_RATIO: {"low": 0.14, "high": 0.24}}}}
    c = {"metrics": {STALL_RATIO: 0.40, "intervals": {STALL_RATIO: {"low": 0.35, "high": 0.45}}}}
    assert all(x["ok"] for x in regressions(compare(a, b), 0.05))          # within noise: no failing check
    assert [x["ok"] for x in regressions(compare(a, c), 0.05) if x["path"] == STALL_RATIO] == [False]


def test_world_intervals_from_every_rank_series():
    from iobench.loader.ranks import world_intervals

    rng = np.random.default_rng(3)

    def rank(stall, n=60):
        w = list(np.clip(rng.normal(stall * 0.1, 0.004, n), 0.002, None))
        return {"series": {"wait_s": w, "step_s": [x + 0.1 * (1 - stall) for x in w], "io_s": [0.05] * n,
                           "prep_s": [0.001] * n}}

    ranks = [rank(0.10), rank(0.30), rank(0.12)]
    out = world_intervals(ranks)
    st = out["intervals"][STALL_RATIO]
    by = st["by_rank"]
    assert st["worst_rank"] == 1 and st["value"] == by[1]["value"]
    assert st["low"] == max(b["low"] for b in by) and st["high"] == max(b["high"] for b in by)
    assert st["low"] <= st["value"] <= st["high"]
    assert out["intervals"]["batch_service_p99_s"]["n"] == 3 * 59     # every rank's batches, step 0 out
