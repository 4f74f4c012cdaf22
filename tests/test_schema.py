"""The results schema (iobench.schema): the published JSON Schema, its validator, versions."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iobench import schema
from iobench.cli import main
from iobench.results import Results, read_results
from results_helpers import load_metrics

ROOT = Path(__file__).resolve().parents[1]
LOAD_FIELDS = [n for n in schema.LoadMetrics.__dataclass_fields__ if n != "extra"]


def _doc(**metrics) -> dict:
    return json.loads(json.dumps(Results(command="load", metrics=load_metrics(**metrics)).to_dict()))


def test_published_schema_is_the_generated_one():
    # docs/results.schema.json is what iobench.schema.json_schema() derives from the types
    # (regenerate: python -c "from iobench.schema import schema_text; print(schema_text(), end='')")
    assert (ROOT / "docs" / "results.schema.json").read_text() == schema.schema_text()


def test_a_real_load_round_trips_through_load_metrics(tmp_path):
    from loader_helpers import quiet_cfg, tokens_dataset

    from iobench.loader.core import run_load

    class Factory:
        def mktemp(self, name):
            p = tmp_path / name
            p.mkdir()
            return p

    url = tokens_dataset(Factory(), "tok", samples=400, shard_samples=100)
    run = run_load(quiet_cfg(url, batch_size=20, steps=8, compute="1ms"))
    typed = schema.LoadMetrics.from_dict(run.metrics)
    assert typed.to_dict() == run.metrics and typed.extra == {}
    assert typed.stall_ratio == run.metrics[schema.STALL_RATIO] and typed.steps == 8
    doc = json.loads(json.dumps(Results(command="load", metrics=run.metrics).to_dict()))
    assert schema.errors(doc) == []


def test_valid_documents_of_every_command_pass():
    assert schema.errors(_doc(stall_ratio=0.2)) == []
    for cmd in ("ckpt", "probe", "run"):     # commands without a metrics dataclass: the envelope only
        assert schema.errors(json.loads(json.dumps(Results(command=cmd, metrics={"x": 1}).to_dict()))) == []
    # compare has one: its files are held to it
    bad = json.loads(json.dumps(Results(command="compare", metrics={"x": 1}).to_dict()))
    assert "$.metrics.verdict: missing" in schema.errors(bad)
    good = schema.CompareMetrics(verdict="PASS", setup_differences=[], checks=[], passed=True, rows=[
        {"path": "stall_ratio", "a": 0.1, "b": 0.2, "diff": 0.1, "ratio": 2.0, "ci_a": [0.05, None], "ci_b": None,
         "within_noise": False}])
    assert schema.errors(json.loads(json.dumps(Results(command="compare", metrics=good.to_dict()).to_dict()))) == []


# (mutation, the path the error must name)
BREAKS = [
    (lambda d: d.pop("command"), "$.command: missing"),
    (lambda d: d.update(schema_version=2), "$.schema_version"),
    (lambda d: d.update(warnings="x"), "$.warnings"),
    (lambda d: d["warnings"].append(3), "$.warnings[0]"),
    (lambda d: d["metrics"].update(steps=True), "$.metrics.steps"),          # a bool is not an integer
    (lambda d: d["metrics"].update(steps=1.5), "$.metrics.steps"),
    (lambda d: d["metrics"].update(stall_ratio=None), "$.metrics.stall_ratio"),
    (lambda d: d["metrics"].update(stall_ratio="3%"), "$.metrics.stall_ratio"),
    (lambda d: d["metrics"]["batch_wait_s"].pop("p99"), "$.metrics.batch_wait_s.p99: missing"),
    (lambda d: d["metrics"]["throughput"].update(bytes_per_s="fast"), "$.metrics.throughput.bytes_per_s"),
    (lambda d: d["metrics"]["read_latency_s"].update(get={"count": 1}), "$.metrics.read_latency_s.get.p50"),
    (lambda d: d["metrics"]["read_calls"].update(get=0.5), "$.metrics.read_calls.get"),
    (lambda d: d["metrics"]["stability"].update(not_stable_because=[1]), "not_stable_because[0]"),
]


@pytest.mark.parametrize("mutate, where", BREAKS, ids=[w for _, w in BREAKS])
def test_the_validator_names_what_breaks(mutate, where):
    d = _doc()
    mutate(d)
    found = schema.errors(d)
    assert any(where in e for e in found), found


@settings(max_examples=40, deadline=None)
@given(st.sets(st.sampled_from(LOAD_FIELDS), min_size=1, max_size=5))
def test_every_load_field_is_required(dropped):
    d = _doc()
    for k in dropped:
        d["metrics"].pop(k)
    assert {f"$.metrics.{k}: missing" for k in dropped} <= set(schema.errors(d))
    with pytest.raises(ValueError, match="not a load's metrics"):
        schema.LoadMetrics.from_dict(d["metrics"])


def test_other_commands_metrics_are_not_held_to_the_load_shape():
    d = json.loads(json.dumps(Results(command="ckpt", metrics={"stall_ratio": "n/a"}).to_dict()))
    assert schema.errors(d) == []


def test_writing_a_broken_results_file_fails_under_the_test_switch(tmp_path):
    with pytest.raises(AssertionError, match="metrics.steps: missing"):
        Results(command="load", metrics={"stall_ratio": 0.1}).write(tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()


@pytest.mark.parametrize("version", [0, 2, "1", None, 1.5])
@pytest.mark.parametrize("argv", [["report", "{f}", "-o", "{d}"], ["compare", "{f}", "{f}"], ["plan", "prefetch",
                                                                                            "--from", "{f}"]])
def test_unknown_schema_versions_are_refused_with_one_line(tmp_path, capsys, version, argv):
    d = _doc(stall_ratio=0.1)
    d["schema_version"] = version
    f = tmp_path / "r.json"
    f.write_text(json.dumps(d))
    assert main([a.format(f=f, d=tmp_path / "rep") for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "schema_version" in err and len(err.splitlines()) == 1, err


def test_read_results_accepts_the_current_version(tmp_path):
    f = Results(command="load", metrics=load_metrics()).write(tmp_path / "r.json")
    assert read_results(f)["schema_version"] == schema.SCHEMA_VERSION
    bad = copy.deepcopy(read_results(f)) | {"schema_version": 99}
    with pytest.raises(ValueError, match="schema_version 99"):
        schema.check_version(bad)


# --- HDR summaries: min <= p50 <= p90 <= p99 <= p999 <= max, whatever composes them ----------------

_durations = st.lists(st.floats(min_value=1e-9, max_value=100.0, allow_nan=False), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(st.lists(_durations, min_size=1, max_size=4))
def test_hdr_summaries_are_ordered_when_recorded_merged_or_decoded(groups):
    from iobench.metrics import LatencyHistogram, is_ordered, merged, summarize_seconds

    hists = []
    for g in groups:
        h = LatencyHistogram()
        for v in g:
            h.record_s(v)
        assert is_ordered(h.summary()), h.summary()
        hists.append(LatencyHistogram.decode(h.encode()))
    assert is_ordered(merged(hists).summary())
    assert is_ordered(summarize_seconds(v for g in groups for v in g))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(_durations, _durations), min_size=2, max_size=4))
def test_a_suite_loads_pooled_summaries_are_ordered(passes_values):
    # the suite's repeated loads (iobench.suite.intervals.merge_passes) pool their passes' batches:
    # a pooled P99 was once put beside the first pass's max (p99 9.7 us above max 3.9 us)
    from iobench.metrics import is_ordered, summarize_seconds
    from iobench.suite.intervals import merge_passes

    passes = []
    for io, wait in passes_values:
        k = min(len(io), len(wait))
        io, wait = io[:k], wait[:k]
        passes.append(load_metrics(stall_ratio=0.1, steps=k, batch_service_s=summarize_seconds(io[1:] or io),
                                   batch_wait_s=summarize_seconds(wait[1:] or wait),
                                   series={"io_s": io, "prep_s": [0.0] * k, "wait_s": wait, "step_s": [1.0] * k}))
    rule = {"stall_ci_half_width": 0.02, "p99_ci_relative_half_width": 0.25}
    m = merge_passes(passes, rule)
    for block in ("batch_service_s", "batch_wait_s"):
        assert is_ordered(m[block]), m[block]
    assert schema.errors(json.loads(json.dumps(Results(command="load", metrics=m).to_dict()))) == []


def test_a_suite_loads_pooled_histogram_is_of_the_same_batches_as_its_summary():
    from iobench.metrics import LatencyHistogram, summarize_seconds
    from iobench.suite.intervals import merge_passes

    passes = []
    for base in (0.01, 0.05):
        io = [base * (1 + k % 7) for k in range(50)]
        passes.append(load_metrics(stall_ratio=0.1, steps=50, batch_service_s=summarize_seconds(io[1:]),
                                   series={"io_s": io, "prep_s": [0.0] * 50, "wait_s": io, "step_s": [1.0] * 50}))
    m = merge_passes(passes, {"stall_ci_half_width": 0.02, "p99_ci_relative_half_width": 0.25})
    for block in ("batch_service", "batch_wait"):
        assert LatencyHistogram.decode(m[f"{block}_hist"]).summary() == m[f"{block}_s"]
