"""mlperf's samples/s and bytes/s divide by each epoch's wall with the workers' start-up in it
(iobench.mlperf.run; DESIGN rule 13).  A worker reads as soon as it is ready, while the next ones are
still being started, so the start-up clock must run from before the first worker starts: otherwise
the bytes read meanwhile count without their time (cosmoflow under a 100 MB/s cap read at 100.9 MB/s,
benchmarks/bench_dlio.py)."""

from __future__ import annotations

import multiprocessing.process
import time

from iobench.loader.core import run_load

from loader_helpers import quiet_cfg, tokens_dataset

DELAY_S = 0.15


def test_startup_clock_covers_starting_every_worker(tmp_path_factory, monkeypatch):
    url = tokens_dataset(tmp_path_factory, "startclock", samples=64, shard_samples=16)
    start = multiprocessing.process.BaseProcess.start
    started: list[str] = []

    def slow_start(self):
        start(self)                 # the worker runs (and may read) from here
        if self.name.startswith("iobench-load-"):
            started.append(self.name)
            time.sleep(DELAY_S)     # a slow fork on a loaded host, before the next worker starts

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", slow_start)
    m = run_load(quiet_cfg(url, 4, workers=3, epochs=1)).metrics
    assert len(started) == 3
    assert m["startup_s"] >= 3 * DELAY_S
    assert m["wall_s_with_startup"] >= m["wall_s"] + 3 * DELAY_S
