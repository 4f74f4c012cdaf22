"""``iobench.watch``: the stall of a loop around any iterable (no torch needed), against a known
truth, and results the report, the planner and compare read."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import dataclasses
import json
import os
import queue
import sys
import threading
import time

import numpy as np
import pytest

import iobench
from iobench.cli import main


def _slow_batches(n: int, produce_s: float, spent: list[float]):
    """A generator that takes ``produce_s`` per batch (recorded in ``spent``: its own clock, from
    being resumed to handing the batch over)."""
    for i in range(n):
        t0 = time.perf_counter()
        time.sleep(produce_s)
        b = np.full((4, 256), i, dtype=np.uint16)
        spent.append(time.perf_counter() - t0)
        yield b


def _loop(it, step_s: float, spent: list[float]) -> None:
    for _batch in it:
        t0 = time.perf_counter()
        time.sleep(step_s)
        spent.append(time.perf_counter() - t0)


def test_a_generator_without_prefetch_stalls_as_its_production_time_says(tmp_path):
    # 30 ms to make a batch, 20 ms a step, nothing made ahead: the loop waits 30 of every 50 ms = 60%.
    made, steps = [], []
    out = tmp_path / "run.json"
    _loop(iobench.watch(_slow_batches(60, 0.030, made), json=str(out)), 0.020, steps)
    doc = json.loads(out.read_text())
    m = doc["metrics"]
    assert doc["command"] == "watch" and m["steps"] == 60
    # the truth from both sides' own clocks, steps 1.. (step 0 excluded, as the stall is); what
    # neither clock sees is the hand-over between them (microseconds, more when the host preempts)
    truth = sum(made[1:]) / (sum(made[1:]) + sum(steps[1:]))
    assert m["stall_ratio_first_step_excluded"] == pytest.approx(truth, abs=0.02)
    assert m[STALL_RATIO] == pytest.approx(0.6, abs=0.05)
    # a loop that makes its own batches: the wait is the batch's production time, so the advice is
    # exact: 30 ms per batch over 0.8 x 20 ms -> 2 workers
    assert m["loader"]["num_workers"] == 0 and m["batch_service_basis"].startswith("exact")
    assert m["prefetch_recommendation"]["workers_recommended"] == 2
    assert m["batch_bytes"] == 4 * 256 * 2 and m["samples"] == 60 * 4


def test_a_prefetching_pipeline_stalls_only_by_what_prefetch_cannot_hide(tmp_path):
    # The same 30 ms producer on a thread, two batches ahead: the loop runs at the producer's pace,
    # one batch per 30 ms, and waits 10 of them: 1/3.
    made, steps = [], []
    q: queue.Queue = queue.Queue(maxsize=2)

    def producer():
        for b in _slow_batches(70, 0.030, made):
            q.put(b)
        q.put(None)

    def prefetched():
        while (b := q.get()) is not None:
            yield b

    threading.Thread(target=producer, daemon=True).start()
    w = iobench.watch(prefetched(), workers=1)
    _loop(w, 0.020, steps)
    m = w.results.metrics
    period = sum(made[10:]) / len(made[10:])
    truth = 1 - (sum(steps[10:]) / len(steps[10:])) / period
    assert m[STALL_RATIO] == pytest.approx(truth, abs=0.04)
    assert m[STALL_RATIO] == pytest.approx(1 / 3, abs=0.07)
    assert m["loader"]["num_workers"] == 1 and m["batch_service_basis"].startswith("estimate")


def test_a_loop_that_breaks_or_raises_still_writes_its_results(tmp_path):
    out = tmp_path / "broke.json"
    for i, _b in enumerate(iobench.watch(iter(range(100)), json=str(out))):
        if i == 9:
            break
    assert json.loads(out.read_text())["metrics"]["steps"] == 10
    out2 = tmp_path / "raised.json"
    with pytest.raises(RuntimeError):
        for i, _b in enumerate(iobench.watch(iter(range(100)), json=str(out2))):
            if i == 4:
                raise RuntimeError("the step failed")
    assert json.loads(out2.read_text())["metrics"]["steps"] == 5


def test_epochs_over_one_watch_accumulate(tmp_path):
    w = iobench.watch([np.zeros(8, dtype=np.uint8)] * 5)
    for _epoch in range(3):
        for _b in w:
            pass
    m = w.results.metrics
    assert m["steps"] == 15 and m["epochs"] == 3 and m["series"]["epoch"] == [0] * 5 + [1] * 5 + [2] * 5
    assert m["bytes_delivered"] == 15 * 8


def test_the_process_trees_reads_are_counted(tmp_path):
    import multiprocessing as mp

    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(2 << 20))

    def child_reads():
        p = mp.get_context("fork").Process(target=_read_then_linger, args=(str(f),))
        p.start()
        for _ in range(30):
            time.sleep(0.01)
            yield np.zeros(1000, dtype=np.uint8)
        p.join()

    w = iobench.watch(child_reads(), interval_s=0.02, path=str(tmp_path))
    for _b in w:
        with open(f, "rb") as fh:   # the loop's own process reads too
            fh.read()
    io = w.results.metrics["process_io"]
    assert io["children"] >= 1
    assert io["read_chars"] >= 2 * (2 << 20)   # the child's read and at least one of the loop's 30
    dev = w.results.metrics["device_io"]
    assert w.results.metrics["bytes_delivered"] == 30 * 1000
    if dev is not None and dev["device_bytes_read"] is not None:
        assert dev["read_amplification"] == pytest.approx(dev["device_bytes_read"] / 30_000)


def _read_then_linger(path: str) -> None:
    with open(path, "rb") as fh:
        fh.read()
    time.sleep(0.2)   # alive for several samples


def test_report_plan_and_compare_read_a_watch(tmp_path, capsys):
    made, steps = [], []
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        _loop(iobench.watch(_slow_batches(20, 0.004, made), json=str(out)), 0.002, steps)
    assert main(["report", str(a), "--out", str(tmp_path / "rep")]) == 0
    assert "Data stall" in capsys.readouterr().out
    assert main(["plan", "prefetch", "--from", str(a)]) == 0
    assert main(["compare", str(a), str(b)]) in (0, 1)


def test_a_watch_file_is_the_typed_watch_schema(tmp_path):
    from iobench import schema

    out = tmp_path / "w.json"
    for _b in iobench.watch(iter([np.zeros(16, dtype=np.uint8)] * 6), json=str(out)):
        pass
    doc = json.loads(out.read_text())
    assert schema.errors(doc) == []
    assert set(doc["metrics"]) >= {f.name for f in dataclasses.fields(schema.WatchMetrics)} - {"extra"}
    broken = json.loads(out.read_text())
    del broken["metrics"]["device_io"]
    assert schema.errors(broken) == ["$.metrics.device_io: missing"]


def test_bad_arguments_are_refused_with_the_fix():
    from iobench.errors import ConfigError

    with pytest.raises(ConfigError, match="path"):
        iobench.watch([], path="/no/such/place")
    with pytest.raises(ConfigError, match="interval_s"):
        iobench.watch([], interval_s=0)


def test_the_results_path_is_checked_before_the_loop_runs(tmp_path):
    from iobench.errors import ConfigError

    with pytest.raises(ConfigError, match="writable directory"):
        iobench.watch([], json=str(tmp_path / "no" / "such" / "run.json"))
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "own data"}')
    with pytest.raises(ConfigError, match="exists and is not"):
        iobench.watch([], json=str(mine))
    assert mine.read_text() == '{"my": "own data"}'
    ours = tmp_path / "run.json"
    for _b in iobench.watch([np.zeros(4)] * 3, json=str(ours)):
        pass
    for _b in iobench.watch([np.zeros(4)] * 5, json=str(ours)):   # its own results: replaced
        pass
    assert json.loads(ours.read_text())["metrics"]["steps"] == 5


# -- iobench measure: an unchanged script, watched through the environment hook ------------------

TORCH_PYTHON = os.environ.get("IOBENCH_TORCH_PYTHON", "/work/venvs/torch/bin/python")

TRAIN = '''
import time, torch
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self): return 96
    def __getitem__(self, i):
        time.sleep(0.002); return torch.zeros(64, dtype=torch.int16)
for epoch in range(2):
    for b in DataLoader(D(), batch_size=8, num_workers=0) if epoch == 0 else loader:
        time.sleep(0.004)
    loader = DataLoader(D(), batch_size=8, num_workers=1, prefetch_factor=3)
print("trained")
'''


@pytest.mark.skipif(not os.path.exists(TORCH_PYTHON), reason="no torch interpreter (IOBENCH_TORCH_PYTHON)")
def test_measure_watches_an_unchanged_torch_script(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out, keep = tmp_path / "run.json", tmp_path / "all"
    rc = main(["measure", "--json", str(out), "--keep", str(keep), "--path", str(tmp_path), "--",
               TORCH_PYTHON, str(script)])
    assert rc == 0
    files = sorted(keep.glob("loader-*.json"))
    assert len(files) == 2   # two DataLoaders, each its own results
    loaders = sorted((json.loads(f.read_text())["metrics"]["loader"] for f in files), key=lambda d: d["num_workers"])
    assert [(d["num_workers"], d["prefetch_factor"]) for d in loaders] == [(0, None), (1, 3)]
    m = json.loads(out.read_text())["metrics"]
    assert m["steps"] == 12 and m["samples"] == 96 and m["batch_bytes"] == 8 * 64 * 2
    assert "num_workers 0" in capsys.readouterr().out


def test_measure_without_a_dataloader_says_what_it_hooks(tmp_path, capsys):
    script = tmp_path / "plain.py"
    script.write_text("print('no loader here')\n")
    import sys

    assert main(["measure", "--", sys.executable, str(script)]) == 1
    assert "watches torch.utils.data.DataLoader only" in capsys.readouterr().err
    script.write_text("raise SystemExit(3)\n")
    assert main(["measure", "--", sys.executable, str(script)]) == 3   # the command's own status


def _foreign_python() -> str | None:
    """An interpreter that is not this venv's (as a user's training venv is not iobench's)."""
    if sys.prefix == sys.base_prefix:
        return None                       # not in a venv: no interpreter without iobench to hand
    exe = os.path.join(sys.base_prefix, "bin", "python3")
    return exe if os.path.exists(exe) else None


def test_measure_hook_imports_every_iobench_package_in_another_interpreter(tmp_path, capsys):
    """The class: whatever iobench's install maps (editable .pth finders, package-dir), the hook in a
    foreign interpreter imports all of it -- the watch's metrics import the loader, which imports formats."""
    exe = _foreign_python()
    if exe is None:
        pytest.skip("no interpreter besides this venv's")
    tomllib = pytest.importorskip("tomllib")
    pyproject = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
    with open(pyproject, "rb") as f:
        names = tomllib.load(f)["tool"]["setuptools"]["packages"]     # every package the install maps
    assert "iobench.formats" in names
    script = tmp_path / "imports.py"
    script.write_text("import importlib, sys\n"
                      f"for n in {names!r}:\n    importlib.import_module(n)\n"
                      "import iobench.loader.analysis\nsys.exit(7)\n")
    assert main(["measure", "--", exe, str(script)]) == 7     # no DataLoader; the script's own status
    err = capsys.readouterr().err
    assert "not watching" not in err and "Error" not in err


@pytest.mark.parametrize("argv,field", [(["measure"], "COMMAND"), (["measure", "--json", "-", "--", "python"], "--json"),
                                        (["measure", "--", "no-such-program-xyz"], "COMMAND"),
                                        (["measure", "--path", "/no/such", "--", "python"], "--path")])
def test_measure_refuses_bad_input_before_running(argv, field, capsys):
    assert main(argv) == 2
    assert field in capsys.readouterr().err


def test_the_hook_routes_a_loaders_iter_through_one_watch_per_loader(tmp_path, monkeypatch):
    # the patch itself, on a class shaped like DataLoader (torch is not in this venv)
    from iobench import watch_hook

    class Loader:
        num_workers = 0

        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter([np.zeros(4, dtype=np.uint8)] * self.n)

    monkeypatch.setenv("IOBENCH_MEASURE_DIR", str(tmp_path))
    watch_hook.patch(Loader)
    watch_hook.patch(Loader)   # idempotent: one wrapper, not two
    a, b = Loader(3), Loader(5)
    for _epoch in range(2):
        assert len(list(a)) == 3
    assert len(list(b)) == 5
    docs = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("loader-*.json"))]
    assert sorted(d["metrics"]["steps"] for d in docs) == [5, 6]
