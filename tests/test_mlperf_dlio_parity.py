"""iobench's MLPerf loop against DLIO's definitions (argonne-lcf/dlio_benchmark@mlperf_storage_v2.0):
the AU window (statscounter.py compute_metrics_train) and tf.data's lock-stepped interleave
(TFRecordDataset(num_parallel_reads=W): block_length 1, 2 records buffered per file)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from iobench.cli import main
from iobench.errors import ConfigError
from iobench.loader.core import LoadConfig, round_need, run_load
from iobench.loader.source import ShardSource, backend_source
from iobench.mlperf.run import mlperf_steps


@pytest.mark.parametrize("t_s, wall, group, sleeps, barriers, want", [
    # one accelerator: the barrier is free, the window is the steps after the first
    ([0.0, 1.0, 1.5, 2.0], 2.5, 1, [0.2] * 4, [0.0] * 4, [0.5, 0.5, 0.5]),
    # two accelerators: step 0's barrier (0.7 s waiting for the other's first batch) is in the window
    ([0.0, 1.9, 2.4, 2.9], 3.4, 1, [0.2] * 4, [0.7, 0.1, 0.0, 0.0], [1.2, 0.5, 0.5]),
    # a batch cut in 2 pieces: a step is 2 loader steps, from its first piece's wait
    ([0.0, 0.1, 1.0, 1.1, 1.6, 1.7], 2.2, 2, [0.2] * 3, [0.3, 0.0, 0.0], [0.9, 0.6]),
])
def test_first_step_excluded_as_dlio_does_its_barrier_counted(t_s, wall, group, sleeps, barriers, want):
    """DLIO's window is the block's time less the first step's ``proc`` (start_loading to
    batch_processed: loading and compute); the ``comm.barrier()`` after it is inside the window."""
    st = mlperf_steps(t_s, wall, group, sleeps, barriers)
    assert st["step_s"] == pytest.approx(want)
    assert st["compute_s"] == sleeps[1:]
    # the window: from the end of step 0's compute (its start of the next group less the barrier) to the end
    assert sum(st["step_s"]) == pytest.approx(wall - (t_s[group] - barriers[0]))


@pytest.mark.parametrize("owner, workers, want", [
    ([0, 1, 0, 1, 0, 1], 2, [[0, 0], [1, 1], [2, 2]]),
    ([0, 1, 2, 0, 1, 2, 0], 3, [[0, 0, 0], [1, 1, 1], [2, 2, 2]]),
    # worker 1 ran dry after one batch: later rounds ask nothing more of it
    ([0, 1, 0, 0, 0], 2, [[0, 0], [1, 1], [3, 1]]),
])
def test_round_need_counts_each_workers_batches_of_the_earlier_rounds(owner, workers, want):
    assert round_need(np.array(owner), workers).tolist() == want


class _SlowWorker(ShardSource):
    """Worker 1 takes ``delay_s`` longer for every piece: the workers' progress diverges unless held."""

    def __init__(self, inner: ShardSource, delay_s: float) -> None:
        self.inner, self.delay_s, self.wid = inner, delay_s, 0

    @property
    def supports_pieces(self) -> bool:   # type: ignore[override]
        return self.inner.supports_pieces

    def open(self, worker_id: int = 0) -> None:
        self.wid = worker_id
        self.inner.open(worker_id)

    def close(self) -> None:
        self.inner.close()

    def stats(self) -> dict:
        return self.inner.stats()

    def read_shard(self, shard):
        return self.inner.read_shard(shard)

    def read_piece(self, shard, start, length, first):
        if self.wid == 1:
            time.sleep(self.delay_s)
        return self.inner.read_piece(shard, start, length, first)

    def read_piece_into(self, shard, start, out, first):
        if self.wid == 1:
            time.sleep(self.delay_s)
        self.inner.read_piece_into(shard, start, out, first)


@pytest.fixture(scope="module")
def tfr(tmp_path_factory):
    out = tmp_path_factory.mktemp("lockstep") / "d"
    assert main(["gen", "--format", "tfrecord", "--modality", "records", "--num-samples", "240",
                 "--shard-size", "60 samples", "--set", "gen.record_bytes=4096", "--set", "gen.record_bytes_stdev=0", "--out", str(out), "--no-progress"]) == 0
    return str(out)


def _rounds_run(data: str, lockstep: bool):
    cfg = LoadConfig(dataset=data, workers=2, prefetch=4, batch_size=6, shuffle=False, shuffle_buffer=0,
                     access="stream", cache="as-is", lockstep=lockstep, stream_read_size="4KiB")
    s = run_load(cfg, source=_SlowWorker(backend_source(data), 0.004)).metrics["series"]
    # earliest start of a batch of round r vs the last ready of round r - 1 (both from the clock's start)
    rounds = len(s["t_s"]) // 2
    ahead = [min(s["start_s"][2 * r], s["start_s"][2 * r + 1]) - max(s["ready_s"][2 * r - 2], s["ready_s"][2 * r - 1])
             for r in range(1, rounds)]
    return s, ahead


def test_lockstep_workers_start_a_round_only_once_the_last_one_was_sent(tfr):
    """With worker 1 slow, free-running workers let worker 0 read rounds ahead (the test can fail);
    in lock step no batch of a round starts before every batch of the round before it is ready."""
    s, ahead = _rounds_run(tfr, lockstep=False)
    assert min(ahead) < 0                         # worker 0 started rounds before worker 1 finished the last
    s, ahead = _rounds_run(tfr, lockstep=True)
    assert len(s["t_s"]) == 40 and min(ahead) >= 0


@pytest.mark.parametrize("fields", [dict(access="map", workers=2), dict(access="stream", workers=1)])
def test_lockstep_is_refused_where_there_are_no_rounds(tfr, fields):
    with pytest.raises(ConfigError, match="lockstep"):
        run_load(LoadConfig(dataset=tfr, batch_size=6, lockstep=True, **fields))


# -- the compliance blocks: "rule-compliant" only when every rule holds, each rule with its source --------------

def _run_inputs(**over):
    """compliance_for's inputs for a unet3d run on 8 accelerators that follows every rule, then ``over``."""
    from types import SimpleNamespace

    from iobench.mlperf import rules as R
    from iobench.mlperf.run import MlperfConfig
    from iobench.mlperf.workloads import load_mlperf_workload

    wl, _ = load_mlperf_workload("unet3d")
    cfg_fields = {k: over.pop(k) for k in list(over) if k in ("compute_s", "au_threshold", "synthetic", "emulate",
                                                              "min_steps", "accelerator")}
    cfg = MlperfConfig(dataset="/nonexistent", accelerators=8, **cfg_fields)
    need = R.datasize(64 * 2**30, 1, 8, 1, wl.record_bytes, wl.batch_size)        # 28,000 files
    files = over.pop("files", need.files)
    manifest = SimpleNamespace(shards=[None] * files, total_samples=files)
    out = {"compute_s_per_step": cfg.compute_s or wl.compute_s[cfg.accelerator],
           "au_threshold": cfg.au_threshold or wl.au_threshold, "au": 0.95, "epochs": wl.epochs,
           "steps_per_epoch": files // wl.batch_size // 8, "accelerators": 8, "warmup_run": True,
           "runs": R.DEFAULT_RUNS, "seeds": [1000, 2000, 3000, 4000, 5000], "read_threads": wl.read_threads,
           "checkpoint": {"bytes": wl.checkpoint.model_bytes, "after_epoch": 5, "seconds_mean": 1.0}}
    scale = over.pop("scale", 1.0)
    nodes = over.pop("nodes", 1)
    out.update(over)
    return cfg, wl, out, manifest, need, scale, nodes


@pytest.mark.parametrize("over, broken", [
    ({}, set()),
    ({"files": 2343}, {"dataset size"}),                     # 5x 64 GiB alone: MLPerf needs 28,000
    ({"scale": 0.01}, {"dataset content"}),
    ({"synthetic": True}, {"storage"}),
    ({"emulate": "const:1ms"}, {"storage"}),
    ({"compute_s": 0.2}, {"step time"}),
    ({"au_threshold": 0.5}, {"AU threshold"}),
    ({"epochs": 3}, {"epochs"}),
    ({"steps_per_epoch": 600}, {"steps per epoch"}),
    ({"nodes": 2}, {"step barrier"}),                      # across nodes the barrier is once per epoch
    ({"warmup_run": False}, {"warm-up run"}),
    ({"runs": 1, "seeds": [1000]}, {"runs"}),
    ({"seeds": [1000] * 5}, {"seeds"}),
    ({"checkpoint": None}, {"checkpoint"}),
    ({"checkpoint": {"bytes": 4991531, "after_epoch": 5, "seconds_mean": 0.1}}, {"checkpoint"}),
])
def test_mlperf_run_is_rule_compliant_only_when_every_rule_holds(over, broken):
    from iobench.mlperf.run import compliance_for

    c = compliance_for(*_run_inputs(**over))
    assert {r.rule for r in c.broken} == broken
    assert c.compliant == (not broken)
    assert c.verdict == ("rule-compliant" if not broken else "not rule-compliant: " + ", ".join(r.rule for r in c.broken))
    for r in c.rules:                                         # every rule names the file (and section) it comes from
        assert "mlcommons/storage" in r.source or "dlio_benchmark" in r.source, r


@pytest.mark.parametrize("over, broken", [
    ({}, set()),
    ({"mode": "default", "processes": 8}, {"processes"}),    # default mode: every one of TP x PP x DP ranks
    ({"scale": 0.001}, {"checkpoint size"}),
    ({"checkpoints": 1}, {"checkpoints"}),
    ({"interval_s": 0.5}, {"interval"}),
    ({"runs": 1}, {"runs"}),
    ({"resident": 0.4}, {"cache cleared"}),
])
def test_mlperf_ckpt_is_rule_compliant_only_when_every_rule_holds(over, broken):
    from iobench.mlperf.checkpoint import CkptWorkload, compliance_for

    resident = over.pop("resident", 0.0)
    processes = over.pop("processes", 8)
    w = CkptWorkload(model="llama3-8b", out="/nonexistent", **over)
    c = compliance_for(w, {"ranks_in_model": 8 if w.mode == "subset" else 64, "processes": processes,
                           "read": {"resident_after_clear_max": resident}})
    assert {r.rule for r in c.broken} == broken
    assert c.compliant == (not broken)
    for r in c.rules:
        assert "mlcommons/storage" in r.source or "Submission_guidelines.md" in r.source, r


@pytest.mark.parametrize("workload, workers, want", [
    ("unet3d", 4, 1),       # PyTorch: prefetch_factor = ceil(prefetch_size 2 / read_threads 4) = 1 per worker
    ("unet3d", 1, 2),
    ("unet3d", 3, 1),
    ("resnet50", 8, 2),     # tf.data: prefetch(2) whole batches, cut in one piece per worker
    ("cosmoflow", 4, 2),
])
def test_prefetch_per_worker_is_dlios(workload, workers, want):
    """DLIO data_loader/torch_data_loader.py ``read``: ``prefetch_factor = ceil(prefetch_size / read_threads)``;
    reader/tf_reader.py ``next``: ``prefetch(buffer_size=prefetch_size)`` (utils/config.py prefetch_size = 2,
    which no MLPerf workload config sets)."""
    from iobench.mlperf.run import loader_group, prefetch_for
    from iobench.mlperf.workloads import TABLE

    wl = TABLE[workload]
    assert prefetch_for(wl, workers, loader_group(wl, workers)) == want
