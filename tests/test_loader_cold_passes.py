"""A cold load reads storage once: the cache is dropped at setup, so any step past the first pass
over a local dataset the page cache can hold would read memory and be counted as storage.  The
class, for every access pattern and worker count and both ways of asking for more (epochs, steps):
refused before any work, naming the field; ``--until-stable`` (no count asked for) stops at one
pass; one pass, ``--cache as-is``, O_DIRECT and a dataset larger than memory run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from iobench.errors import ConfigError
from iobench.loader.core import run_load
from loader_helpers import quiet_cfg, tokens_dataset

SAMPLES, SHARD, BATCH = 96, 16, 8
ONE_PASS = SAMPLES // BATCH
ACCESS = ("map", "stream", "block", "memmap")
MORE_THAN_ONE_PASS = (("epochs", dict(epochs=2), "load.epochs"), ("steps", dict(steps=ONE_PASS + 1), "load.steps"))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokens_dataset(tmp_path_factory, "coldpass", SAMPLES, SHARD)


@pytest.mark.parametrize("how,kw,field", MORE_THAN_ONE_PASS, ids=[m[0] for m in MORE_THAN_ONE_PASS])
@pytest.mark.parametrize("workers", (0, 1))
@pytest.mark.parametrize("access", ACCESS)
def test_a_cold_run_past_one_pass_is_refused_before_any_work(tok, access, workers, how, kw, field, monkeypatch):
    import iobench.io.pagecache as pc

    dropped = []
    monkeypatch.setattr(pc, "drop_pages", lambda p: dropped.append(p))
    with pytest.raises(ConfigError) as e:
        run_load(quiet_cfg(tok, BATCH, workers=workers, access=access, cache="cold", shuffle=False, **kw))
    assert e.value.field == field and f"--steps {ONE_PASS} or fewer" in str(e.value)
    assert dropped == []    # refused before the cache was touched


@pytest.mark.parametrize("workers", (0, 1))
@pytest.mark.parametrize("access", ACCESS)
def test_until_stable_on_a_cold_cache_stops_at_one_pass(tok, access, workers):
    r = run_load(quiet_cfg(tok, BATCH, workers=workers, access=access, cache="cold", shuffle=False, until_stable=True,
                           min_steps=200, max_time_s=30.0))
    assert r.metrics["steps_planned"] == ONE_PASS and r.metrics["steps"] <= ONE_PASS
    assert any("stops at the end of one pass" in w for w in r.warnings)


@pytest.mark.parametrize("kw", (dict(epochs=1), dict(steps=ONE_PASS), dict(epochs=2, cache="as-is"),
                                dict(epochs=2, cache="warm")), ids=("one-pass", "steps-one-pass", "as-is", "warm"))
def test_one_pass_or_a_declared_cached_state_runs(tok, kw):
    r = run_load(quiet_cfg(tok, BATCH, **({"cache": "cold"} | kw)))
    assert r.metrics["steps"] == r.metrics["steps_planned"] == ONE_PASS * kw.get("epochs", 1)


def test_a_dataset_larger_than_memory_may_take_cold_passes_with_a_warning(tok, monkeypatch):
    import iobench.loader.core as core

    monkeypatch.setattr(core, "_page_cache_bytes", lambda: 1024)
    r = run_load(quiet_cfg(tok, BATCH, cache="cold", epochs=2))
    assert r.metrics["steps"] == 2 * ONE_PASS
    assert any("larger than memory" in w for w in r.warnings)


def test_the_cli_refuses_it_with_one_line_and_exit_2(tok):
    p = subprocess.run([sys.executable, "-c", "import sys; from iobench.cli import main; sys.exit(main())", "load", tok, "--cache", "cold", "--epochs", "3", "-B", "8",
                        "--no-progress"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "load.epochs" in lines[0] and "Traceback" not in p.stderr
