"""Checkpoint sizing and models against the domain models' worked examples and MLPerf Storage v2."""

from __future__ import annotations

import math

import pytest

from iobench.checkpointing import exposure as ex
from iobench.planner import checkpoint as pc
from iobench.checkpointing.reshard import reshard_plan
from iobench.checkpointing.state import (
    StateSpec, TensorSpec, bytes_per_param, checkpoint_bytes, from_params, max_rank_bytes, mlperf_reference_bytes,
    preset, rank_bytes, rank_shards,
)
from iobench.errors import ConfigError

GB, GiB, MiB = 1e9, 1024**3, 1024**2

# Vectors copied from ../shared/seed-examples.json (CI runs from a fresh clone).
G29 = {"params": 175e9, "weights_GB": 350, "optimizer_GB": 1400, "checkpoint_GB": 1750}
G69 = {"N": 8_190_735_360, "ckpt_bytes": 114_670_295_040}
G70 = {"rows": 12288, "cols": 4096, "tp_old": 4, "tp_new": 8, "W_MiB": 96, "old_shard_MiB": 24, "new_shard_MiB": 12,
       "full_state_MiB": 672}
G72 = {"S": 112, "bw": (7, 20), "interval": (10, 20)}
G73 = {"S": 112, "snaps": (20, 40), "copy": 0.5, "t_fail": 50, "commits_7": (36.5, 56.5), "commits_20": (26.1, 46.1),
       "redo_7": 30, "redo_20": 10}


def test_g29_gpt175b_is_1750_gb_at_10_bytes_per_param():
    spec = preset("gpt-175b")
    assert spec.params == G29["params"]
    assert bytes_per_param(spec.recipe) == 10
    assert checkpoint_bytes(spec) == pytest.approx(G29["checkpoint_GB"] * GB)
    assert spec.params * 2 == pytest.approx(G29["weights_GB"] * GB)
    assert spec.params * 8 == pytest.approx(G29["optimizer_GB"] * GB)


def test_g69_qwen3_8b_exact_bytes_at_14_bytes_per_param():
    spec = preset("qwen3-8b")
    assert spec.params == G69["N"]
    assert spec.bytes_per_param == 14
    assert checkpoint_bytes(spec) == G69["ckpt_bytes"]
    assert round(checkpoint_bytes(spec) / GB) == 115


@pytest.mark.parametrize("name,tol", [("llama3-8b", 0.005), ("llama3-70b", 0.005), ("llama3-405b", 0.005)])
def test_mlperf_storage_v2_table(name, tol):
    spec = preset(name)
    assert checkpoint_bytes(spec) == pytest.approx(mlperf_reference_bytes(name), rel=tol)


def test_mlperf_parallelism():
    got = {n: (preset(n).tp, preset(n).pp, preset(n).dp, preset(n).zero_stage, preset(n).ranks)
           for n in ("llama3-8b", "llama3-70b", "llama3-405b", "llama3-1t")}
    assert got == {"llama3-8b": (1, 1, 8, 3, 8), "llama3-70b": (8, 1, 8, 3, 64),
                   "llama3-405b": (8, 32, 2, 1, 512), "llama3-1t": (8, 64, 2, 1, 1024)}


@pytest.mark.parametrize("name", ["llama3-8b", "qwen3-8b", "gpt-175b"])
def test_every_element_saved_exactly_once(name):
    spec = preset(name, scale=1e-4)
    assert sum(rank_bytes(spec)) == checkpoint_bytes(spec)
    seen = {}
    for shards in rank_shards(spec):
        for s in shards:
            seen[s.key] = seen.get(s.key, 0) + s.numel
    for t in spec.tensors:
        for c in spec.components:
            assert seen[f"{t.name}/{c.name}"] == t.numel


def test_scale_keeps_layout_and_shrinks_bytes():
    full, small = preset("llama3-70b"), preset("llama3-70b", scale=1e-4)
    assert [t.name for t in full.tensors] == [t.name for t in small.tensors]
    assert (small.tp, small.pp, small.dp, small.ranks) == (full.tp, full.pp, full.dp, full.ranks)
    assert len(rank_shards(small)[5]) == len(rank_shards(full)[5])
    assert checkpoint_bytes(small) == pytest.approx(checkpoint_bytes(full) * 1e-4, rel=0.05)


def test_pipeline_stages_hold_embedding_first_and_head_last():
    spec = preset("llama3-405b", scale=1e-5)
    first = {s.tensor for s in rank_shards(spec)[0]}
    last = {s.tensor for s in rank_shards(spec)[spec.tp * (spec.pp - 1)]}
    assert "embed" in first and "lm_head" not in first
    assert "lm_head" in last and "embed" not in last


def test_zero_stage_decides_who_saves_weights():
    z1 = from_params(1 << 20, tp=1, pp=1, dp=4, zero_stage=1)
    per = rank_shards(z1)
    assert any(s.component == "weights" for s in per[0])
    assert not any(s.component == "weights" for s in per[1])       # replicas do not save weights
    assert any(s.component == "adam_m" for s in per[3])            # optimizer sharded over DP
    z3 = z1.with_parallelism(zero_stage=3)
    assert all(any(s.component == "weights" for s in shards) for shards in rank_shards(z3))
    assert max_rank_bytes(z3) <= checkpoint_bytes(z3) / 4 + 1024


def test_params_layout_is_exact():
    for n in (1, 7, 4096, 1_000_003, 8_000_000_000):
        assert from_params(n).params == n


def test_bad_input_names_the_field():
    with pytest.raises(ConfigError, match="preset"):
        preset("llama-8b")
    with pytest.raises(ConfigError, match="recipe"):
        preset("llama3-8b", recipe="int3")
    with pytest.raises(ConfigError, match="tp"):
        from_params(100, tp=0)
    with pytest.raises(ConfigError, match="scale"):
        preset("llama3-8b", scale=2)


def test_g70_tp4_to_tp8_source_map():
    w = TensorSpec("w", (G70["rows"], G70["cols"]), tp_dim=0, stage=1)
    old = StateSpec(tensors=(w,), recipe="bf16-mixed-adam", tp=G70["tp_old"], layers=1)
    new = old.with_parallelism(tp=G70["tp_new"])
    assert G70["rows"] * G70["cols"] * 2 == G70["W_MiB"] * MiB
    assert checkpoint_bytes(old) == G70["full_state_MiB"] * MiB
    old_w = [s for s in rank_shards(old)[0] if s.component == "weights"][0]
    assert old_w.nbytes == G70["old_shard_MiB"] * MiB and old_w.shape[0] == 3072
    plan = reshard_plan(old, new)
    for r in range(8):
        t, pieces = [(t, p) for t, p in plan[r] if t.component == "weights"][0]
        assert t.nbytes == G70["new_shard_MiB"] * MiB
        assert t.offsets[0] == 1536 * r and t.shape[0] == 1536
        assert [p.src_rank for p in pieces] == [r // 2]
        half = "first" if pieces[0].src_slices[0].start == 0 else "second"
        assert half == ("first", "second")[r % 2]


def test_g72_backlog():
    # The domain models' formulas are the planner's (their one home); checkpointing asks it.
    s, (bw7, bw20), (i10, i20) = G72["S"], G72["bw"], G72["interval"]
    assert pc.write_time(s, bw7) == pytest.approx(16)
    assert pc.write_time(s, bw20) == pytest.approx(5.6)
    assert pc.async_backlog(s, bw7, i10).demand_bytes_per_s == pytest.approx(11.2)
    assert ex.has_backlog(s, bw7, i10) is True
    assert ex.has_backlog(s, bw7, i20) is False


def test_g73_recovery_point_is_last_committed_not_last_captured():
    for bw, commits, redo in ((7, G73["commits_7"], G73["redo_7"]), (20, G73["commits_20"], G73["redo_20"])):
        c = list(pc.commit_timeline(G73["S"], bw, G73["snaps"], G73["copy"], G73["t_fail"]).commits_s)
        assert c == pytest.approx(list(commits), abs=0.05)
        rec = ex.recovery_at([(i + 1, t, ct) for i, (t, ct) in enumerate(zip(G73["snaps"], c))], G73["t_fail"])
        assert rec.redo_s == pytest.approx(redo)
    assert len(G73["snaps"]) * G73["copy"] == 1.0  # foreground pause total


def test_g74_g75_young_daly_and_overhead_table():
    c = pc.write_time(114_670_295_040, 7e9)
    assert c == pytest.approx(16.381, abs=5e-4)
    mtbf = 7.9 * 3600
    lam = 1 / mtbf
    assert pc.optimal_interval(c, lam) == pytest.approx(965.29, abs=5e-3)
    for tau, total in ((300, 6.4), (900, 3.8), (1800, 4.5)):
        assert pc.checkpoint_overhead(c, lam, 120, tau).total * 100 == pytest.approx(total, abs=0.05)


def test_g31_g32_g33_storm_and_staging():
    per_replica = (140 + 140 + 840) * GB
    assert pc.checkpoint_storm(per_replica, 1024, 100 * GB, sharded=False).write_s == pytest.approx(11468.8)
    assert pc.checkpoint_storm(per_replica, 1024, 100 * GB, sharded=True).write_s == pytest.approx(11.2)
    st = pc.staged_checkpoint(1750 * GB, 256, 28 * GB, 1000 * GB, 600)
    assert st.shard_bytes / GB == pytest.approx(6.836, abs=0.001)
    assert st.local_write_s == pytest.approx(0.244, abs=0.001)
    assert st.pfs_drain_s == pytest.approx(1.75)
    assert st.pfs_bytes_per_s_per_node / GB == pytest.approx(3.906, abs=0.001)
    assert st.pause_overhead * 100 == pytest.approx(0.04, abs=0.005)
    # the gpt-175b preset spreads the same 1,750 GB over 256 ZeRO-3 ranks
    assert max_rank_bytes(preset("gpt-175b")) / GB == pytest.approx(6.8359375, rel=1e-3)
    assert math.isclose(checkpoint_bytes(preset("gpt-175b")) / 256 / GB, 6.8359375)
