"""Start-up and the clocks.  The loader's ``wall_s_with_startup`` runs from before the first worker
starts (DESIGN rule 13): a worker reads as soon as it is ready, while the next ones are still being
started, so a clock from after the start-up would count the bytes read meanwhile without their time
(cosmoflow under a 100 MB/s cap read at 100.9 MB/s, benchmarks/bench_dlio.py).

mlperf's samples/s and bytes/s run from the first read to the end of the last step
(iobench.mlperf.run): every I/O operation counts, the excluded first step's too (Submission_guidelines.md
§4), and starting processes before anything is read, which is not I/O, does not."""

from __future__ import annotations

import multiprocessing.process
import os
import time

import pytest

from iobench.cli import main
from iobench.loader.core import run_load
from iobench.mlperf.run import MlperfConfig, first_io_s, run_mlperf

from loader_helpers import quiet_cfg, tokens_dataset

DELAY_S = 0.15


def _slow_starts(monkeypatch, before: float, after: float) -> list[str]:
    """Loader workers start ``before`` s late (nothing read yet) and hold the next one back ``after`` s
    (a slow fork on a loaded host, while the started ones read)."""
    start = multiprocessing.process.BaseProcess.start
    started: list[str] = []

    def slow_start(self):
        loader = self.name.startswith("iobench-load-")
        if loader and not started:
            time.sleep(before)
        start(self)
        if loader:
            started.append(self.name)
            time.sleep(after)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", slow_start)
    return started


def test_startup_clock_covers_starting_every_worker(tmp_path_factory, monkeypatch):
    url = tokens_dataset(tmp_path_factory, "startclock", samples=64, shard_samples=16)
    started = _slow_starts(monkeypatch, 0.0, DELAY_S)
    m = run_load(quiet_cfg(url, 4, workers=3, epochs=1)).metrics
    assert len(started) == 3
    assert m["startup_s"] >= 3 * DELAY_S
    assert m["wall_s_with_startup"] >= m["wall_s"] + 3 * DELAY_S


def test_first_io_is_the_earliest_batch_start_else_the_spawn():
    assert first_io_s({"start_s": [0.2, -0.3, None, 0.1]}, {"startup_s": 1.0}) == -0.3
    assert first_io_s({"start_s": [None]}, {"startup_s": 1.0}) == -1.0
    assert first_io_s({}, {"startup_s": 0.5}) == -0.5


def test_mlperf_clock_runs_from_the_first_read(tmp_path, monkeypatch):
    out = tmp_path / "unet3d"
    assert main(["gen", "--workload", "unet3d", "--scale", "0.0001", "--num-samples", "28", "--out", str(out),
                 "--no-progress"]) == 0
    delay = 2 * DELAY_S
    _slow_starts(monkeypatch, before=delay, after=delay)
    t0 = time.perf_counter()
    r = run_mlperf(MlperfConfig(dataset=str(out), accelerators=1, compute_s=0.01, epochs=1, runs=1, warmup=False,
                                cache="as-is", checkpoint=False))
    elapsed = time.perf_counter() - t0
    run, rank = r["per_run"][0], r["per_rank"][0]
    # before the first worker started nothing was read: not in the clock, but reported
    assert rank["startup_s_before_first_io"] >= delay
    # worker 0 read while workers 1..3 were started (4 delays after its start): all inside the clock
    assert rank["wall_s_from_first_io"] >= 3 * delay
    assert rank["wall_s_from_first_io"] + rank["startup_s_before_first_io"] <= elapsed
    assert run["wall_s_from_first_io"] == rank["wall_s_from_first_io"]
    assert r["samples_per_s"] == pytest.approx(run["samples"] / run["wall_s_from_first_io"])
    assert rank["samples_per_s"] == pytest.approx(rank["samples"] / rank["wall_s_from_first_io"])


def test_accelerators_start_reading_together_whatever_their_setup_took(tmp_path, monkeypatch):
    """The start barrier is after each accelerator's loader setup: one whose setup is 1 s slower must not
    let the other read alone for that second (the excluded first step would absorb its head start)."""
    import iobench.loader.core as core

    out = tmp_path / "unet3d"
    assert main(["gen", "--workload", "unet3d", "--scale", "0.0001", "--num-samples", "28", "--out", str(out),
                 "--no-progress"]) == 0
    setup, loop = core._setup, core._step_loop

    def slow_setup(cfg, storage_options, source, rank, *a, **k):
        if rank == 1:
            time.sleep(1.0)
        return setup(cfg, storage_options, source, rank, *a, **k)

    def timed_loop(st, *a, **k):     # in each accelerator's process: when its workers start
        (tmp_path / f"start-{os.getpid()}").write_text(str(time.monotonic()))
        return loop(st, *a, **k)

    monkeypatch.setattr(core, "_setup", slow_setup)
    monkeypatch.setattr(core, "_step_loop", timed_loop)
    run_mlperf(MlperfConfig(dataset=str(out), accelerators=2, compute_s=0.01, epochs=1, runs=1, warmup=False,
                            cache="as-is", checkpoint=False))
    starts = [float(p.read_text()) for p in tmp_path.glob("start-*")]
    assert len(starts) == 2 and max(starts) - min(starts) < 0.5
