"""Fidelity: the loader's stall and prefetch numbers match the domain models' models (G04, G05).

Emulated storage (sleep-based latency per shard read) and sleep-mode compute, so the
numbers hold on a loaded 2-core machine; one shard = one batch, so a shard read is a
batch's I/O.  Tolerances are the issue's, and generous elsewhere.
"""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import random

import pytest

from iobench.loader.analysis import recommend
from iobench.loader.core import run_load
from iobench.wrappers import parse_emulation
from loader_helpers import quiet_cfg, tokens_dataset

B = 8


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return tokens_dataset(tmp_path_factory, "fid", B * 16, B)


def _cfg(url, **kw):
    return quiet_cfg(url, B, **({"access": "block"} | kw))


def test_io_250ms_compute_200ms_depth_1_stalls_20_percent(ds):
    # G04: pipelined T_step = max(200, 250) = 250 ms -> stall = 50/250 = 20 %
    r = run_load(_cfg(ds, prefetch=1, steps=12, compute="200ms", emulate="const:250ms"))
    m = r.metrics
    # G04's formula on the times this run really had: a 250 ms sleep overshoots by 5-12 ms on a VM, and the
    # stall follows (0.238 for a batch service of 263 ms), so the nominal 20 % is checked more loosely
    assert m[STALL_RATIO] == pytest.approx(max(0.0, 1 - m["compute_s"]["mean"] / m["batch_service_s"]["p50"]),
                                           abs=0.03)
    assert m[STALL_RATIO] == pytest.approx(0.20, abs=0.06)
    assert r.environment["storage"] == "emulated"


def test_io_150ms_compute_200ms_depth_2_hides_io(ds):
    r = run_load(_cfg(ds, prefetch=2, steps=10, compute="200ms", emulate="const:150ms"))
    assert r.metrics[STALL_RATIO] < 0.03


def _seed_with_tail(spec: str, draws: int) -> int:
    """A seed whose first draws include the tail (P99 ≈ 500 ms): a short run sees its P99 only then."""
    s = parse_emulation(spec)
    for seed in range(100):
        rng = random.Random(seed * 1_000_003)   # worker 0's emulation seed (BackendSource.open)
        if max(s.sample_latency(rng) for _ in range(draws)) > 0.45:
            return seed
    raise AssertionError("no seed")


def test_p99_500ms_recommends_depth_3_and_that_depth_stalls_less(ds):
    # G05: ceil(P99 500 ms / compute 200 ms) = 3; mean I/O ~160 ms < compute, so depth absorbs the tail
    spec = "lognormal:p50=130ms,p99=500ms"
    steps = 20
    seed = _seed_with_tail(spec, steps)
    shallow = run_load(_cfg(ds, prefetch=1, steps=steps, compute="200ms", emulate=spec, seed=seed))
    rec = recommend(shallow.metrics, 0.2)
    assert rec["depth_min"] >= 3 and rec["depth_recommended"] >= 5
    deep = run_load(_cfg(ds, prefetch=rec["depth_recommended"], steps=steps, compute="200ms", emulate=spec,
                         seed=seed))
    assert deep.metrics[STALL_RATIO] < shallow.metrics[STALL_RATIO]
