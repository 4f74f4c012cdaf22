"""`iobench plan scale`: accelerators sustained at scale from measured points."""

from __future__ import annotations

import json
import math

from iobench.cli import main
from iobench.planner.models import plan
from iobench.planner.scale import Point, leave_one_out, parse_points, straggler_cap, sustained


def test_bandwidth_and_metadata_limits():
    assert sustained(4, 12, 1e8, 1.2e9).per_node == 3 and sustained(4, 12, 1e8, 1.2e9).limit == "bandwidth"
    assert sustained(1, 12, 1e8, 1.2e10).per_node == 12 and sustained(1, 12, 1e8, 1.2e10).limit == "node"
    # metadata: 2 nodes x a x 50 opens/s <= 300 -> a = 3
    s = sustained(2, 12, 1e8, 1e12, metadata_ops_per_s=300, ops_per_accelerator=50)
    assert (s.per_node, s.limit) == (3, "metadata")


def test_straggler_cap_matches_a_direct_search():
    for p, w, c, thr in [(0.001, 0.5, 0.2, 0.9), (0.01, 1.0, 0.1, 0.9), (0.0001, 2.0, 0.3, 0.7)]:
        def au(n):
            return c / (c + (1 - (1 - p) ** n) * w)
        direct = 0
        while au(direct + 1) >= thr:
            direct += 1
        assert straggler_cap(p, w, c, thr) == direct
    assert straggler_cap(0.0, 1.0, 0.1, 0.9) == math.inf
    assert straggler_cap(0.5, 0.01, 1.0, 0.9) == math.inf     # even every step slow stays above 90%


def test_leave_one_out_is_exact_on_model_data_and_flags_an_outlier():
    d, agg = 1e8, 1.6e9
    pts = [Point(n, sustained(n, 8, d, agg).per_node, sustained(n, 8, d, agg).per_node * n * d) for n in (1, 2, 4)]
    assert [p.accelerators_per_node for p in pts] == [8, 8, 4]
    assert all(r["error"] == 0 for r in leave_one_out(pts, agg))
    bad = pts[:2] + [Point(4, 8, 8 * 4 * d)]          # claims 8 per node at 4 nodes, over the aggregate
    assert any(r["error"] != 0 for r in leave_one_out(bad, agg))


def test_plan_scale_from_a_find_max_result(tmp_path, capsys):
    res = {"schema_version": 1, "command": "mlperf",
           "metrics": {"mlperf": {"max_accelerators_per_node": 6}, "throughput": {"bytes_per_s": 6e8},
                       "mlperf_run": {"sample_bytes_mean": 1.5e8, "compute_s_per_step": 0.323, "au_threshold": 0.9}}}
    f = tmp_path / "fm.json"
    f.write_text(json.dumps(res))
    assert main(["plan", "scale", "--from", str(f), "--set", "aggregate_bandwidth=4.8GB/s",
                 "--set", "nodes=1,8,16", "--json", str(tmp_path / "p.json")]) == 0
    out = json.loads((tmp_path / "p.json").read_text())["metrics"]["plan"]["outputs"]
    rows = {r["nodes"]: r for r in out["prediction_table"]}
    # demand 1e8 B/s per accelerator; 4.8e9 / (8 x 1e8) = 6 per node; at 16 nodes 3
    assert rows[1]["per_node"] == 6 and rows[8]["per_node"] == 6 and rows[16]["per_node"] == 3
    assert rows[16]["limit"] == "bandwidth"
    assert out["leave_one_out_table"] == []


def test_bad_points_are_one_line_errors(capsys):
    assert main(["plan", "scale", "--set", "points=2:x:1GB/s", "--set", "aggregate_bandwidth=1GB/s",
                 "--set", "accelerators_per_node=2", "--set", "node_bandwidth=1GB/s"]) == 2
    assert "points" in capsys.readouterr().err
    assert parse_points("1:2:1MB/s, 2:2:2MB/s") == [Point(1, 2, 1e6), Point(2, 2, 2e6)]
    assert plan("scale", {"accelerators_per_node": 2, "node_bandwidth": "1MB/s",
                          "aggregate_bandwidth": "10MB/s"})["outputs"]["node_cap_accelerators"] == 2
