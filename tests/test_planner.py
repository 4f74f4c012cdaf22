"""The planner's models: properties of the formulas, and `iobench plan` end to end."""

from __future__ import annotations

import json
import math

import pytest

from iobench.cli import main
from iobench.errors import ConfigError
from iobench.planner import checkpoint as ck
from iobench.planner import pipeline as pl
from iobench.planner.models import MODELS, plan
from iobench.results import Results
from results_helpers import load_metrics


def test_optimal_interval_minimises_the_overhead():
    c, lam, r = 16.4, 1 / 28440, 120.0
    tau = ck.optimal_interval(c, lam)
    best = ck.checkpoint_overhead(c, lam, r, tau).total
    for t in (tau * 0.8, tau * 0.95, tau * 1.05, tau * 1.25):
        assert ck.checkpoint_overhead(c, lam, r, t).total > best
    # The Poisson model also charges failures during the save, so it checkpoints a little more often.
    assert 0.95 * tau < ck.poisson_optimal_interval(c, lam) < tau


def test_commit_timeline_queues_commits_behind_a_slow_store():
    t = ck.commit_timeline(100.0, 10.0, [10, 12, 14], copy_s=0.0, fail_s=35)
    assert t.commits_s == (20.0, 30.0, 40.0)      # serial commits: each waits for the previous one
    assert t.recoverable_snapshot_s == 12 and t.redo_s == 23
    none = ck.commit_timeline(100.0, 10.0, [10], copy_s=1.0, fail_s=15)
    assert none.recoverable_snapshot_s is None and none.redo_s == 15


def test_prefetch_depth_and_stall():
    assert pl.prefetch_depth(0.4, 0.2).depth_min == 2
    assert pl.prefetch_depth(0.05, 0.2).depth_min == 1
    s = pl.data_stall(0.2, 0.1, pipelined=True)
    assert s.stall_ratio == 0 and s.step_s == 0.2


def test_zero_stages_shrink_the_rank_state():
    n, d = 8e9, 8
    sizes = [ck.zero_rank_bytes(n, d, s) for s in range(4)]
    assert sizes == sorted(sizes, reverse=True) and sizes[3] == pytest.approx(16 * n / d)


def test_every_model_runs_with_its_defaults_and_required_inputs():
    required = {"size": "1GB", "rate": "1GB/s", "duration": "10s", "int": 4, "float": 2.0, "ratio": 0.5,
                "points": [{"op": "get", "object_size": 2**20, "concurrency": c, "bytes_per_s": 1e8 * c} for c in (1, 4)]}
    for m in MODELS.values():
        sets = {p.name: required[p.kind] for p in m.params if p.default is not None and p.default.__class__ is object}
        if m.name == "interval":
            sets["job_mtbf"] = "8h"
        if m.name == "checkpoint-size":
            sets["params"] = 1e9
        if m.name == "async-commit":
            sets["fail_at"] = "35s"
        out = plan(m.name, sets)
        assert out["recommendation"], m.name
        json.dumps(out, allow_nan=False)


def test_checkpoint_size_uses_the_checkpoint_presets():
    out = plan("checkpoint-size", {"preset": "qwen3-8b"})["outputs"]
    assert out["checkpoint_bytes"] == 114_670_295_040


def test_unknown_input_names_the_nearest():
    with pytest.raises(ConfigError, match="did you mean 'cost'"):
        plan("interval", {"cots": 1})


def test_cli_plan_list_and_bad_input(capsys):
    assert main(["plan", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in MODELS)
    assert main(["plan", "interval", "--set", "cots=1"]) == 2
    assert "did you mean 'cost'" in capsys.readouterr().err
    assert main(["plan", "intreval"]) == 2
    assert "did you mean 'interval'" in capsys.readouterr().err
    assert main(["plan", "interval", "--set", "cost=fast"]) == 2


def test_cli_plan_prefetch_from_load_results(tmp_path, capsys):
    load = Results(command="load", metrics=load_metrics(batch_io_s={"count": 10, "min": 0.1, "mean": 0.2, "p50": 0.2,
                                                                    "p90": 0.3, "p99": 0.45, "p999": 0.5, "max": 0.5},
                                                        batch_bytes=4_000_000))
    src = load.write(tmp_path / "load.json")
    out = tmp_path / "plan.json"
    assert main(["plan", "prefetch", "--from", str(src), "--compute-ms", "200", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    p = data["metrics"]["plan"]
    assert data["command"] == "plan" and p["model"] == "prefetch"
    assert p["inputs"]["p99_io_time"] == 0.45 and p["inputs_from"]["p99_io_time"] == "results:metrics.batch_io_s.p99"
    assert p["outputs"]["depth_min"] == 3 and p["outputs"]["host_bytes_per_consumer"] == 5 * 4_000_000
    assert "prefetch depth 5" in capsys.readouterr().out


def test_cli_interval_from_checkpoint_results(tmp_path):
    ckpt = Results(command="ckpt", metrics={"checkpoint": {"blocking_s": {"count": 3, "mean": 16.38, "min": 16,
                                                                          "p50": 16.4, "p90": 16.5, "p99": 16.6,
                                                                          "p999": 16.6, "max": 16.6}}})
    src = ckpt.write(tmp_path / "ckpt.json")
    out = tmp_path / "plan.json"
    assert main(["plan", "interval", "--from", str(src), "--set", "job_mtbf=7.9h", "--json", str(out)]) == 0
    p = json.loads(out.read_text())["metrics"]["plan"]
    assert p["inputs"]["cost"] == 16.38
    assert p["outputs"]["optimal_interval_s"] == pytest.approx(math.sqrt(2 * 16.38 * 7.9 * 3600))


def test_cli_plan_from_a_run_json_searches_its_stage_files(tmp_path):
    load = Results(command="load", metrics=load_metrics(batch_io_s={"count": 3, "min": 0.1, "mean": 0.2, "p50": 0.2,
                                                                    "p90": 0.3, "p99": 0.61, "p999": 0.7, "max": 0.7}))
    stage = load.write(tmp_path / "load" / "cold.json")
    run = Results(command="run", environment={"results_files": [str(stage)]}, metrics={"load": {"stage_s": 1.0}})
    out = tmp_path / "plan.json"
    assert main(["plan", "prefetch", "--from", str(run.write(tmp_path / "run.json")), "--compute-ms", "200",
                 "--json", str(out)]) == 0
    p = json.loads(out.read_text())["metrics"]["plan"]
    assert p["inputs"]["p99_io_time"] == 0.61 and p["outputs"]["depth_min"] == 4


def test_retention_counts_completed_intervals_only():
    from iobench.planner.checkpoint import retention

    # 2611.93 intervals: 2611 checkpoints were written (a partial interval writes none)
    r = retention(run_s=2611.93 * 600, interval_s=600, ckpt_bytes=1e9, keep_last=3, archive_every=100)
    assert r.checkpoints == 2611 and r.archived == 26 and r.total_written_bytes == 2611e9
    assert retention(run_s=1200.0, interval_s=600, ckpt_bytes=1.0, keep_last=3).checkpoints == 2   # exact: both
    assert retention(run_s=599.0, interval_s=600, ckpt_bytes=1.0, keep_last=3).footprint_bytes == 0


@pytest.mark.parametrize("recipe, bpp", [("bf16-mixed-adam", 14), ("fp16-adam", 10), ("fp32-adam", 12),
                                         ("fp16-mixed-adam", 14), ("bf16-weights", 2)])
def test_one_recipe_vocabulary_for_params_and_presets(recipe, bpp):
    from iobench.checkpointing import state
    from iobench.planner.models import plan

    by_params = plan("checkpoint-size", {"params": 1e9, "recipe": recipe})["outputs"]
    assert by_params["bytes_per_param"] == bpp == state.bytes_per_param(recipe)
    by_preset = plan("checkpoint-size", {"preset": "qwen3-8b", "recipe": recipe})["outputs"]
    assert by_preset["bytes_per_param"] == bpp


def test_unknown_recipe_same_message_on_both_paths():
    from iobench.errors import ConfigError
    from iobench.planner.models import plan

    for inputs in ({"params": 1e9, "recipe": "bf16-adam"}, {"preset": "qwen3-8b", "recipe": "bf16-adam"}):
        with pytest.raises(ConfigError, match=r"--set recipe: unknown recipe 'bf16-adam'.*bf16-mixed-adam 14 B/param.*fp16-adam 10 B/param"):
            plan("checkpoint-size", inputs)


@pytest.mark.parametrize("service_p99, io_p99, compute_ms", [(0.45, 0.2, 200), (0.05, 0.01, 5), (1.3, 1.2, 100)])
def test_plan_prefetch_reads_the_batch_time_the_loaders_advice_uses(tmp_path, service_p99, io_p99, compute_ms):
    # `plan prefetch --from load.json` and the load's own prefetch_recommendation (what `iobench load` prints)
    # read the same P99: storage + preparation per batch (batch_service_s), not storage alone
    from iobench.loader.analysis import recommend

    def hdr(p99):
        return {"count": 400, "min": p99 / 4, "mean": p99 / 2, "p50": p99 / 2, "p90": p99 * 0.8, "p99": p99,
                "p999": p99, "max": p99}

    m = load_metrics(batch_service_s=hdr(service_p99), batch_io_s=hdr(io_p99), batch_bytes=4_000_000)
    src = Results(command="load", metrics=m).write(tmp_path / "load.json")
    out = tmp_path / "plan.json"
    assert main(["plan", "prefetch", "--from", str(src), "--compute-ms", str(compute_ms), "--json", str(out)]) == 0
    p = json.loads(out.read_text())["metrics"]["plan"]
    assert p["inputs_from"]["p99_io_time"] == "results:metrics.batch_service_s.p99"
    assert p["outputs"]["depth_min"] == recommend(m, compute_ms / 1000)["depth_min"]
