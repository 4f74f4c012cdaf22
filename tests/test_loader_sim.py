"""The discrete-event loader model (iobench.planner.loader_sim) and the real loader agree.

Unit tests check the model against closed forms; the grid tests run the real loader on
emulated storage and replay each run's recorded per-batch worker times and consumer times
through the model: measured stall within 2 pp of predicted.  A subset runs in make test;
the full grid (pattern × W {1,2,4} × Q {1,2,4} × storage × compute) is marked slow and
reported by benchmarks/bench_fidelity.py.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from iobench.generate import GenSpec, generate
from iobench.loader import fidelity
from iobench.planner.loader_sim import (Schedule, bandwidth_stall, expected_stall, round_robin, schedule_for,
                                        simulate)
from iobench.wrappers import parse_emulation

B = 8
SEQ = 512            # uint16 tokens: 1 KiB a sample
COMPUTE_S = 0.06
STEPS = 24
TOL_PP = 2.0


def _patterns() -> tuple[str, ...]:
    from iobench.loader.core import LoadConfig

    has_access = "access" in {f.name for f in dataclasses.fields(LoadConfig)}
    return fidelity.PATTERNS if has_access else ("block",)


# ------------------------------------------------------------------ the model alone

@pytest.mark.parametrize("pattern", ["map", "stream", "block"])
@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_constant_io_gives_the_pipelined_closed_form(pattern, workers, prefetch):
    # W producers at L per batch deliver one per L/W; step = max(C, L/W) in steady state
    L, C, n = 0.25, 0.1, 400
    sch = schedule_for(pattern, n, workers, prefetch)
    r = simulate(sch, [L] * n, [C] * n)
    want = 1 - C / max(C, L / workers)
    assert r.stall_ratio == pytest.approx(want, abs=0.01)


def test_depth_hides_a_tail_only_with_depth():
    # mean I/O < compute, occasional long requests: Q=1 stalls on every spike, deep Q absorbs them
    n, C = 2000, 0.2
    rng = random.Random(1)
    io = [0.15 + (0.5 if rng.random() < 0.05 else 0.0) for _ in range(n)]
    shallow = simulate(schedule_for("map", n, 1, 1), io, [C] * n).stall_ratio
    deep = simulate(schedule_for("map", n, 1, 8), io, [C] * n).stall_ratio
    assert shallow > 0.04 and deep < 0.005


def test_gate_on_take_vs_release():
    # Q·W = 1, gate at start: the worker starts batch k only once k-1 is taken (torch semantics)
    sch = Schedule(round_robin(3, 1), lag=1, gate_on="take", gate_at="start")
    r = simulate(sch, [1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    assert r.ready_s == (1.0, 2.0, 4.0)
    # a 1-slot ring released after compute: the worker reads ahead but writes once the slot is free
    sch = Schedule(round_robin(3, 1), lag=1, gate_on="release", gate_at="end")
    r = simulate(sch, [1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    assert r.ready_s == (1.0, 3.0, 5.0)


def test_workers_that_start_before_the_clock_are_not_held_to_it():
    # the consumer's clock starts once every worker is up; a worker that began 1 s earlier is 1 s ahead
    sch = Schedule(round_robin(2, 2), lag=2, gate_on="take", gate_at="start")
    r = simulate(sch, [2.0, 2.0], [0.5, 0.5], start_s=[-1.0, 0.0])
    assert r.ready_s == (1.0, 2.0)
    assert r.wait_s == (1.0, 0.5)


def test_bandwidth_stall_formula():
    # 4.2 MB batch at 50 MiB/s is 80 ms; 64 ms compute -> 20 % stall
    assert bandwidth_stall(0.064, 4.2e6, 50 * 2**20) == pytest.approx(1 - 0.064 / (4.2e6 / (50 * 2**20)))
    assert bandwidth_stall(0.2, 1e6, 1e9) == 0.0


def test_expected_stall_from_a_distribution():
    spec = parse_emulation("lognormal:p50=100ms,p99=600ms")
    n = 300
    reqs = [[1]] * n
    shallow, _ = expected_stall(schedule_for("map", n, 1, 1), spec, reqs, [0.2] * n, draws=10)
    deep, _ = expected_stall(schedule_for("map", n, 1, 3), spec, reqs, [0.2] * n, draws=10)
    assert deep < shallow


# ------------------------------------------------------------------ the model vs the real loader

@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("sim") / "tok")
    generate(GenSpec(format="raw", modality="tokens", num_samples=B * 64, shard_size=f"{B} samples", seq_len=SEQ,
                     vocab_size=1000, fsync=False), url, progress=False)
    return url


def _check(url: str, cell: fidelity.Cell) -> dict:
    kw = dict(batch_size=B, shard_samples=B, sample_bytes=SEQ * 2, steps=STEPS, compute_s=COMPUTE_S)
    tries = []
    for _ in range(3):
        # Re-run a miss (at most twice): on a shared host a process descheduled for tens of ms between
        # finishing a batch and handing it over shows up as stall the model does not know about.
        r = fidelity.run_cell(url, cell, **kw)
        tries.append(round(r["diff_pp"], 2))
        if abs(r["diff_pp"]) <= TOL_PP:
            break
    r["diff_pp_tries"] = tries
    return r


# W=4 cells mostly run with -m slow: four workers on a 2-core CI host measure its scheduler as much as the loader
SUBSET = [fidelity.Cell(*c) for c in (
    ("block", 1, 1, "const", "const"), ("block", 4, 4, "lognormal", "const"), ("block", 2, 1, "bw", "normal"),
    ("map", 2, 2, "lognormal", "normal"), ("map", 2, 1, "spike", "const"), ("map", 1, 4, "bw", "normal"),
    ("stream", 1, 2, "spike", "normal"), ("stream", 2, 4, "const", "const"), ("stream", 2, 2, "bw", "const"))]


@pytest.mark.parametrize("cell", SUBSET, ids=lambda c: c.name)
def test_model_matches_loader_subset(ds, cell):
    if cell.pattern not in _patterns():
        pytest.skip(f"this loader has no --access {cell.pattern}")
    r = _check(ds, cell)
    assert abs(r["diff_pp"]) <= TOL_PP, r


@pytest.mark.slow
@pytest.mark.parametrize("cell", fidelity.grid(), ids=lambda c: c.name)
def test_model_matches_loader_full_grid(ds, cell):
    if cell.pattern not in _patterns():
        pytest.skip(f"this loader has no --access {cell.pattern}")
    r = _check(ds, cell)
    assert abs(r["diff_pp"]) <= TOL_PP, r
