"""`iobench run`'s own measurement rules: the generate stage's repeats, the load stage's plan."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import os

import numpy as np
import pytest

from iobench.generate import GenSpec
from iobench.suite import generate as gen_stage


def test_generate_stage_times_rounds_and_removes_them(tmp_path):
    # a 0.1 s generation is no throughput: each round generates each dataset again into scratch
    # directories, round-robin, until it has ROUND_MIN_S seconds of timings, then removes the scratch
    # copies (and nothing else); the rate's interval is over the rounds, not the timings pooled
    specs = {f"local/{fmt}-tokens": GenSpec.from_mapping({"modality": "tokens", "num_samples": 64, "seq_len": 16,
                                                          "vocab_size": 1000, "shard_size": "32 samples",
                                                          "format": fmt, "seed": 0}) for fmt in ("raw", "tar")}
    (tmp_path / "keep.txt").write_text("not the suite's")
    timings = {k: (spec, str(tmp_path), None, None) for k, spec in specs.items()}
    seconds = gen_stage._timing_round(timings)
    assert set(seconds) == set(specs)
    for t in seconds.values():
        assert 1 <= len(t) <= gen_stage.ROUND_MAX
        assert len(t) == gen_stage.ROUND_MAX or sum(t) >= gen_stage.ROUND_MIN_S
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"] and (tmp_path / "keep.txt").read_text() == "not the suite's"
    # three rounds that each agree within themselves but differ between them (a busy host in round 1):
    # the interval spans the rounds, as many pooled timings of round 1 would not
    rounds = [[0.30, 0.31, 0.29], [0.10], [0.11, 0.10]]
    t = gen_stage._throughput(1000, 64, rounds)
    lo, hi = t["bytes_per_s_ci95"]
    assert t["repeats"] == 6 and t["rounds"] == 3 and lo < 1000 / 0.30 and hi > 1000 / 0.10
    geo = [float(np.exp(np.mean(np.log(r)))) for r in rounds]
    assert t["samples_per_s"] == pytest.approx(64 / np.exp(np.mean(np.log(geo))))


def test_generate_stage_spreads_its_rounds_over_the_run(tmp_path, monkeypatch):
    # within `iobench run` the generate stage times one round at its place and owes the rest
    # (SuiteContext.repeated); its datasets are ready for the later stages at once
    from iobench.suite import SuiteContext

    # one small dataset, one timing a round: the test stays short
    monkeypatch.setattr(gen_stage, "SUITE_FORMATS", ("raw",))
    monkeypatch.setattr(gen_stage, "SUITE_SPECS", {"tokens": {"modality": "tokens", "num_samples": 64, "seq_len": 16,
                                                              "vocab_size": 1000, "shard_size": "32 samples"}})
    monkeypatch.setattr(gen_stage, "ROUND_MIN_S", 0.001)
    ctx = SuiteContext(out_dir=tmp_path / "out", work_dir=tmp_path / "work", spread_over_run=True)
    (tmp_path / "out").mkdir()
    assert gen_stage.suite_stage(ctx) is None
    assert len(ctx.state.datasets) == 1 and [s.name for s in ctx.spread] == ["generate"]
    for p in range(1, 5):   # the load stage's points between its passes
        ctx.spread_point(p)
    assert len(ctx.spread[0].runs) == 1 + len(gen_stage.ROUND_POINTS)
    m = ctx.spread[0].done()
    assert m["verified"] == 1
    import json

    d = json.loads((tmp_path / "out" / "generate.json").read_text())["metrics"]["datasets"]
    thr = d["local/raw-tokens"]["throughput"]
    assert thr["rounds"] == gen_stage.ROUNDS and len(ctx.spread[0].at_s) == gen_stage.ROUNDS
    assert thr["bytes_per_s_ci95"][0] < thr["bytes_per_s"] < thr["bytes_per_s_ci95"][1]
    assert not (tmp_path / "work" / "datasets" / ".repeats").exists()


def test_merge_repeats_gives_every_rate_its_interval():
    # rates (the suffixes compare judges) become the repeats' mean with a Student t interval, also in
    # table rows; every other number stays the first repeat's
    from iobench.suite.intervals import merge_repeats

    runs = [{"seconds": s, "points": [{"bytes_per_s": b, "qd": 1}], "summary": {"seq_read_bytes_per_s": b}}
            for s, b in ((1.0, 100.0), (2.0, 110.0), (3.0, 90.0))]
    m = merge_repeats(runs)
    assert m["seconds"] == 1.0 and m["points"][0]["qd"] == 1
    assert m["points"][0]["bytes_per_s"] == 100.0 and m["summary"]["seq_read_bytes_per_s"] == 100.0
    lo, hi = m["points"][0]["bytes_per_s_ci95"]
    assert lo < 90.0 and hi > 110.0                       # t(2) = 4.30: three repeats give a wide interval
    assert m["summary"]["seq_read_bytes_per_s_ci95"] == [lo, hi]


def test_load_rates_get_the_batch_means_interval():
    import numpy as np

    from iobench.suite.intervals import add_load_rate_intervals

    rng = np.random.default_rng(0)
    steps = list(0.01 + rng.exponential(0.002, 400))
    m = {"series": {"step_s": [0.5] + steps}, "throughput": {"samples_per_s": 90.0, "steady_samples_per_s": 100.0,
                                                             "batches_per_s": 3.0},
         "per_worker": [{"bytes_per_s": 10.0}]}
    iv = add_load_rate_intervals(m)
    rel = iv["half_width"] / iv["value"]
    assert 0 < rel < 0.05 and iv["n"] == 400              # step 0 (start-up) left out
    assert m["throughput"]["steady_samples_per_s_ci95"] == [100.0 * (1 - rel), 100.0 * (1 + rel)]
    assert "per_worker" in m and m["per_worker"][0]["bytes_per_s_ci95"][0] < 10.0
    assert "batches_per_s_ci95" not in m["throughput"]    # not a rate compare judges
    assert add_load_rate_intervals({"series": {"step_s": [0.1] * 5}, "throughput": {}}) is None


def _pass(stall: float, sps: float, rng, n: int = 150) -> dict:
    return {STALL_RATIO: stall, "accelerator_utilization": 1 - stall, "steps": n, "samples": n * 32,
            "throughput": {"steady_samples_per_s": sps, "bytes_per_s": sps * 10},
            "per_worker": [{"samples_per_s": sps / 2}, {"samples_per_s": sps / 2}],
            "batch_service_s": {"p99": 0.0, "mean": 0.01}, "batch_wait_s": {"p99": 0.0},
            "intervals": {STALL_RATIO: {"low": stall - 0.01, "high": stall + 0.01, "half_width": 0.01}},
            "stability": {"stopped": "planned steps done"},
            "series": {"io_s": list(0.01 + rng.exponential(0.002, n)), "prep_s": [0.0] * n,
                       "wait_s": list(rng.exponential(0.001, n))}}


def test_merge_passes_interval_covers_the_spread_between_passes():
    # each pass alone has a ±1 pp stall interval; the passes disagree by far more (another server
    # instance, other work on the host): the merged interval is over the passes, P99s pool their batches
    from iobench.suite.intervals import merge_passes

    rng = np.random.default_rng(1)
    passes = [_pass(s, r, rng) for s, r in ((0.10, 5000.0), (0.20, 4000.0), (0.15, 4500.0))]
    rule = {"stall_ci_half_width": 0.02, "p99_ci_relative_half_width": 0.25}
    m = merge_passes(passes, rule, instances=[0, 1, 2])
    iv = m["intervals"][STALL_RATIO]
    assert m[STALL_RATIO] == pytest.approx(0.15) and m["accelerator_utilization"] == pytest.approx(0.85)
    assert iv["low"] < 0.10 and iv["high"] > 0.20 and iv["n"] == 3          # t(2) · sd / √3 ≈ 12 pp
    lo, hi = m["throughput"]["steady_samples_per_s_ci95"]
    assert m["throughput"]["steady_samples_per_s"] == pytest.approx(4500.0) and lo < 4000.0 and hi > 5000.0
    assert m["per_worker"][0]["samples_per_s_ci95"][0] < 2000.0
    assert "accelerator_utilization_ci95" not in m                          # AU is bounded by the stall's interval
    p99 = m["intervals"]["batch_service_p99_s"]
    assert p99["n"] == 3 * 149 and p99["high"] is not None
    assert m["batch_service_s"]["p99"] == pytest.approx(p99["value"], rel=2e-3)   # the pooled HDR summary
    assert m["steps"] == 450 and m["samples"] == 450 * 32
    assert not m["stable"] and "over 3 passes" in m["stability"]["not_stable_because"][0]
    assert [p["server_instance"] for p in m["passes"]] == [0, 1, 2]
    # a pass's own numbers have no interval: compare must not judge them one by one (pair 4 of
    # repeat.md failed 28 checks on passes[i].steady_samples_per_s while every merged rate agreed)
    from iobench.report.compare import HIGHER_IS_BETTER, LOWER_IS_BETTER

    assert not [k for p in m["passes"] for k in p if k.endswith(HIGHER_IS_BETTER + LOWER_IS_BETTER)]
    same = merge_passes([_pass(0.15, 4500.0, rng) for _ in range(3)], rule)
    assert same["intervals"][STALL_RATIO]["half_width"] == 0.0 and same["passes"][0]["server_instance"] is None


def test_repeated_stages_spread_their_repeats_over_the_run(tmp_path):
    # within `iobench run` a repeated stage measures once at its own place, once mid-load
    # (spread_point) and the rest when the runner merges; called alone, all repeats run at once
    from iobench.suite import SuiteContext
    from iobench.suite.intervals import REPEATS, merge_repeats

    calls = []

    def measure():
        calls.append(len(calls))
        return {"x_bytes_per_s": 100.0 + 10 * len(calls)}

    alone = SuiteContext(out_dir=tmp_path / "a", work_dir=tmp_path / "wa")
    m = alone.repeated("probe", measure, merge_repeats)
    assert len(calls) == REPEATS and m["x_bytes_per_s_ci95"][0] < m["x_bytes_per_s"] < m["x_bytes_per_s_ci95"][1]
    calls.clear()
    ctx = SuiteContext(out_dir=tmp_path / "b", work_dir=tmp_path / "wb", spread_over_run=True)
    assert ctx.repeated("probe", measure, merge_repeats) is None and len(calls) == 1
    ctx.spread_point(1)  # not one of the probe's points: no repeat
    assert len(calls) == 1
    ctx.spread_point(3)
    assert len(calls) == 2
    (s,) = ctx.spread
    merged = s.done()
    assert len(calls) == REPEATS and len(s.at_s) == REPEATS and s.at_s == sorted(s.at_s)
    assert merged["x_bytes_per_s"] == pytest.approx(np.mean([110.0, 120.0, 130.0]))
    ctx.spread_point(3)  # owes nothing more: no extra repeat
    assert len(calls) == REPEATS


def test_run_merges_a_spread_stage_into_run_json(tmp_path):
    import json

    from iobench.suite import run_suite
    from iobench.suite.intervals import REPEATS

    path = run_suite(tmp_path / "out", stages=["gds"], progress=False)
    gds = json.loads(path.read_text())["metrics"]["gds"]
    assert len(gds["repeats_at_s"]) == REPEATS and gds["stage_s"] > 0
    cpu = gds["cpu"]["warm"]
    assert cpu["bytes_per_s_ci95"][0] <= cpu["bytes_per_s"] <= cpu["bytes_per_s_ci95"][1]
    assert (tmp_path / "out" / "gds.json").exists()


def test_run_prints_the_verdict_before_its_summary_table(tmp_path, capsys):
    import json

    from iobench.suite import run_suite

    path = run_suite(tmp_path / "out", stages=["gds", "report"], progress=False)
    out = capsys.readouterr().out.splitlines()
    verdict = json.loads(path.read_text())["metrics"]["report"]["verdict"]
    assert verdict and out[0] == verdict
    assert any("iobench run — summary" in line for line in out[1:])
