"""``iobench.watch(loader)``: the data stall of the user's own training loop, measured in place.

    import iobench
    for batch in iobench.watch(loader, json="run.json", path="/data/train"):
        step(batch)

``loader`` is any iterable: a torch ``DataLoader``, a tf.data iterator, a generator.  Each
``next()`` the loop makes is timed: the **wait** for batch ``k`` is from the loop asking for it
to having it (the time ``iter()`` takes — a DataLoader starting its workers — counts in the
first batch of its epoch), and the **compute** of step ``k`` is from having batch ``k`` to asking
for the next one (the user's step, whatever it does).  Stall = Σ wait / Σ (wait + compute) over
the steady window, as ``iobench load`` reports it (``iobench.loader.stability``: step 0 and a
prefetch head start's drain excluded), with its interval; warm-up (the first ``iter()`` and the
first batch) is reported apart, never dropped.

Beside the clock, it counts what storage did for the loop: the process tree's I/O (psutil
``io_counters`` of this process and every child it forks, a DataLoader's workers included,
sampled every ``interval_s`` — a child's last interval before it exits is lost, so the
device counter is the one to trust), the block device's bytes read (``path=``: the device
holding the data, by ``iobench.blockdev``: the run's own cgroup where it has one, else
``/proc/diskstats``), and read amplification = device bytes / bytes the loop received.

The results are the ``load`` schema's (``command: "watch"``): ``iobench report``, ``iobench
plan prefetch --from`` and ``iobench compare`` read them.  With torch loaded, a DataLoader's
``num_workers`` and ``prefetch_factor`` are recorded and the worker/depth advice is
``iobench load --recommend``'s (``iobench.loader.analysis.recommend``), from a batch service
time that is exact for a loop that makes its own batches (a generator, ``num_workers=0``: the
wait *is* the batch's production) and, with W workers, estimated as W × the step time (exact
while the loop stalls, an upper bound otherwise; the results say which).

The JSON is written when the loop ends, breaks (the wrapper's generator is closed) or raises,
and again after each further epoch over the same ``Watch`` (cumulative).
"""

from __future__ import annotations

from .schema import STALL_RATIO, StepSeries
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from time import perf_counter_ns as now_ns   # iobench.metrics' clock, without its import cost in `import iobench`


@dataclass
class _Record(StepSeries):
    """Per step, in step order; ``io_s`` is the batch's production time where known (W=0)."""

    epochs: list[int] = field(default_factory=list)
    startup_s: float = 0.0
    t0: int = 0


class _TreeIO:
    """Read bytes of this process and its children (by pid, so exited children keep their last sample)."""

    def __init__(self, interval_s: float) -> None:
        import psutil

        self._psutil = psutil
        self.interval_s = interval_s
        self.me = psutil.Process()
        self.seen: dict[int, tuple[int, int]] = {}     # pid -> (read_bytes, read_chars), latest
        self.base: dict[int, tuple[int, int]] = {}     # pid -> counters when first seen (this process: at start)
        self.children_seen: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _one(self, p) -> None:
        try:
            io = p.io_counters()
        except (self._psutil.Error, AttributeError):
            return
        v = (int(io.read_bytes), int(getattr(io, "read_chars", 0)))
        self.seen[p.pid] = v
        self.base.setdefault(p.pid, v if p.pid == self.me.pid else (0, 0))

    def sample(self) -> None:
        self._one(self.me)
        try:
            kids = self.me.children(recursive=True)
        except self._psutil.Error:
            kids = []
        for c in kids:
            self.children_seen.add(c.pid)
            self._one(c)

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stop.is_set()

    def start(self) -> None:
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="iobench-watch-io", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def totals(self) -> dict:
        rb = sum(v[0] - self.base.get(pid, (0, 0))[0] for pid, v in self.seen.items())
        rc = sum(v[1] - self.base.get(pid, (0, 0))[1] for pid, v in self.seen.items())
        return {"read_bytes": rb, "read_chars": rc, "processes": len(self.seen),
                "children": len(self.children_seen), "interval_s": self.interval_s,
                "note": "psutil io_counters of this process and its children, sampled every interval_s: read_bytes "
                        "is what the storage layer fetched for them (page faults included), read_chars what "
                        "their read calls returned (page-cache hits and pipes included); a child's reads after "
                        "its last sample are lost (device_io counts them)"}


def _nbytes(obj: Any, depth: int = 0) -> int:
    """Payload bytes of a batch: arrays, tensors, buffers, and containers of them."""
    if depth > 4 or obj is None:
        return 0
    nb = getattr(obj, "nbytes", None)          # numpy, iobench Batch, tf tensors (numpy())
    if isinstance(nb, int):
        return nb
    ne, es = getattr(obj, "nelement", None), getattr(obj, "element_size", None)
    if callable(ne) and callable(es):          # torch tensors
        return int(ne()) * int(es())
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return memoryview(obj).nbytes
    if isinstance(obj, dict):
        return sum(_nbytes(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v, depth + 1) for v in obj)
    return 0


def _nsamples(obj: Any) -> int:
    """Samples in a batch: the leading dimension of its first array (of a tuple/dict: the first item's)."""
    if isinstance(obj, dict):
        obj = next(iter(obj.values()), None)
    elif isinstance(obj, (list, tuple)) and obj and not isinstance(obj[0], (int, float)):
        first = obj[0]
        if hasattr(first, "shape") or isinstance(first, (list, tuple, dict)):
            return _nsamples(first)
    shape = getattr(obj, "shape", None)
    if shape is not None and len(shape):
        return int(shape[0])
    try:
        return len(obj)
    except TypeError:
        return 1


def loader_settings(loader: Any) -> dict:
    """What kind of loader this is, and a torch DataLoader's num_workers / prefetch_factor / batch_size."""
    data = sys.modules.get("torch.utils.data")
    dl = getattr(data, "DataLoader", None) if data is not None else None
    if dl is not None and isinstance(loader, dl):
        w = int(loader.num_workers)
        return {"kind": "torch.utils.data.DataLoader", "num_workers": w,
                "prefetch_factor": (loader.prefetch_factor or 2) if w > 0 else None,
                "batch_size": loader.batch_size, "pin_memory": bool(loader.pin_memory),
                "persistent_workers": bool(getattr(loader, "persistent_workers", False))}
    kind = f"{type(loader).__module__}.{type(loader).__qualname__}"
    return {"kind": kind, "num_workers": 0 if kind == "builtins.generator" else None, "prefetch_factor": None}


class Watch:
    """The iterable ``watch()`` returns; iterate it as the loader (once per epoch, as often as wanted)."""

    def __init__(self, loader: Iterable, json: str | None = None, path: str | None = None,
                 interval_s: float = 0.2, name: str | None = None, workers: int | None = None) -> None:
        self.loader = loader
        self.json = json
        self.path = path
        self.interval_s = interval_s
        self.name = name
        self.settings = loader_settings(loader)
        if workers is not None:   # the caller knows better (e.g. a tf.data pipeline's parallelism)
            self.settings["num_workers"] = int(workers)
        self.rec = _Record()
        self._epoch = -1
        self._io: _TreeIO | None = None
        self._device = None
        self.results = None

    def __iter__(self) -> Iterator:
        return self._epoch_iter()

    def _begin(self) -> None:
        self._io = _TreeIO(self.interval_s)
        self._io.start()
        if self.path is not None:
            from .blockdev import DeviceCounter

            c = DeviceCounter(self.path)
            self._device = c if c.dev is not None else None
        self.rec.t0 = now_ns()

    def _epoch_iter(self) -> Iterator:
        rec = self.rec
        if self._io is None:
            self._begin()
        elif not self._io.running:
            self._io.start()
        self._epoch += 1
        epoch = self._epoch
        t_ask = now_ns()
        it = iter(self.loader)
        t_got = None
        if epoch == 0:
            rec.startup_s = (now_ns() - t_ask) / 1e9
            t_ask = now_ns()   # the first iter() is start-up; later ones (workers restarted) are wait
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    t_end = now_ns()
                    if t_got is not None:
                        self._close_step(t_got, t_end)
                    return
                t_got = now_ns()
                rec.waits.append((t_got - t_ask) / 1e9)
                rec.t_step.append((t_ask - rec.t0) / 1e9)
                rec.batch_bytes.append(_nbytes(batch))
                rec.lens.append(_nsamples(batch))
                rec.epochs.append(epoch)
                yield batch
                del batch
                t_ask = now_ns()
                self._close_step(t_got, t_ask)
                t_got = None
        finally:
            # the loop ended, broke out (this generator closed) or raised: a step still open ends now
            if t_got is not None:
                self._close_step(t_got, now_ns())
            rec.t_end = now_ns()
            self._finish()

    def _close_step(self, t_got: int, t_next: int) -> None:
        rec = self.rec
        c = (t_next - t_got) / 1e9
        rec.computes.append(c)
        rec.steps_s.append(rec.waits[len(rec.computes) - 1] + c)

    def _finish(self) -> None:
        if self._io is not None:
            self._io.stop()   # a further epoch over this Watch starts it again
        self.results = self._results()
        if self.json:
            self.results.write(self.json)

    # -- results ---------------------------------------------------------------------------------

    def metrics(self) -> dict:
        """The results' metrics (``iobench.schema.WatchMetrics``: the load's names) for what was measured so far."""
        from .loader.analysis import recommend
        from .loader.stability import StopRule, steady_verdict, steady_window, window_stall
        from .metrics import encoded_seconds, summarize_seconds
        from .schema import WatchMetrics

        rec = self.rec
        n = len(rec.computes)
        waits, steps, comps = rec.waits[:n], rec.steps_s[:n], rec.computes[:n]
        w = self.settings.get("num_workers")
        # The batch service time: exact when the loop makes its own batches; with W workers each one
        # makes one batch per W steps, so S = W x step while the loop stalls (an upper bound otherwise).
        if w == 0:
            svc, svc_how = waits, "exact: the loop makes its own batches (no workers), so a batch's wait is its production"
        elif w:
            svc, svc_how = [w * s for s in steps], (f"estimate: {w} workers x the step time (exact while the loop "
                                                    "stalls; an upper bound when it does not)")
        else:
            svc, svc_how = waits, "the wait (the loader's parallelism is unknown: give watch(..., workers=N))"
        rec.io_s, rec.prep_s = list(svc), [0.0] * n
        k0, k1, why = steady_window(waits)
        stall = window_stall(waits, steps, (k0, k1)) if n else 0.0
        w1, s1 = waits[1:], steps[1:]
        stall_mlperf = sum(w1) / sum(s1) if s1 and sum(s1) > 0 else 0.0
        wall_s = (rec.t_end - rec.t0) / 1e9 if rec.t_end else 0.0
        first_wait = waits[0] if waits else None
        warmup_s = rec.startup_s + (first_wait or 0.0)
        delivered = sum(rec.batch_bytes[:n])
        io = self._io.totals() if self._io is not None else None
        dev = self._device.stop(delivered, delivered) if self._device is not None else None
        if dev is not None:
            dev["read_amplification_basis"] = "device bytes / bytes of the batches the loop received"
        v = steady_verdict(rec, StopRule())
        m: dict = {
            "access": "watch",
            "steps": n,
            "epochs": self._epoch + 1,
            "samples": sum(rec.lens[:n]),
            "first_step_excluded": True,
            STALL_RATIO: stall,
            "accelerator_utilization": 1.0 - stall,
            "steady_window": {"from_step": k0, "to_step": k1, "rule": why},
            "stall_ratio_first_step_excluded": stall_mlperf,
            "accelerator_utilization_first_step_excluded": 1.0 - stall_mlperf,
            "wall_clock_utilization": sum(comps) / (wall_s + rec.startup_s) if wall_s > 0 else None,
            "wall_s": wall_s,
            "wall_s_with_startup": wall_s + rec.startup_s,
            "wait_s_total": sum(w1),
            "compute_s_total": sum(comps[1:]),
            "first_step_s": steps[0] if steps else None,
            "startup_s": rec.startup_s,
            "time_to_first_batch_s": first_wait,
            "warmup_s": warmup_s,
            "warmup_fraction": warmup_s / (wall_s + rec.startup_s) if wall_s > 0 else None,
            "batch_wait_s": summarize_seconds(w1),
            "batch_wait_hist": encoded_seconds(w1),
            "compute_s": summarize_seconds(comps[1:] or comps),
            "compute_hist": encoded_seconds(comps[1:]),
            "step_s": summarize_seconds(s1),
            # what --recommend and `plan prefetch` read as the batch's time at its producer
            "batch_service_s": summarize_seconds(svc[1:] or svc),
            "batch_service_hist": encoded_seconds(svc[1:]),
            "batch_io_s": summarize_seconds(svc[1:] or svc),
            "batch_service_basis": svc_how,
            "batch_bytes": delivered / n if n else 0.0,
            "batch_bytes_max": max(rec.batch_bytes[:n], default=0),
            "bytes_delivered": delivered,
            "bytes_read": (dev or {}).get("device_bytes_read") if dev else (io or {}).get("read_bytes"),
            "bytes_read_basis": "device_io.device_bytes_read" if dev else "process_io.read_bytes",
            "throughput": {
                "samples_per_s": sum(rec.lens[:n]) / wall_s if wall_s > 0 else None,
                "bytes_per_s": delivered / wall_s if wall_s > 0 else None,
                "batches_per_s": n / wall_s if wall_s > 0 else None,
                "steady_samples_per_s": sum(rec.lens[1:n]) / sum(s1) if s1 and sum(s1) > 0 else None,
            },
            "series": {"t_s": rec.t_step[:n], "wait_s": waits, "step_s": steps, "compute_s": comps,
                       "epoch": rec.epochs[:n], "batch_bytes": rec.batch_bytes[:n]},
            "loader": dict(self.settings),
            "process_io": io,
            "device_io": dev,
            "intervals": {k: v[k] for k in (STALL_RATIO, "batch_service_p99_s", "batch_wait_p99_s")},
            "stable": v["stable"],
            "stability": {"rule": StopRule().describe(), "not_stable_because": v["not_stable_because"]},
        }
        extra = {"prefetch_recommendation": recommend(m, m["compute_s"]["mean"] or 0.0)} if n > 1 else {}
        return WatchMetrics(**m, extra=extra).to_dict()   # typed: a missing or misspelt field fails here

    def _results(self):
        from .results import Results

        r = Results(command="watch", config={"loader": self.settings, "path": self.path, "json": self.json,
                                             "name": self.name, "interval_s": self.interval_s},
                    environment={"loader": dict(self.settings),
                                 "storage": "real (the user's own loader)",
                                 "cache": {"declared": "as-is (the user's loader decides)"},
                                 "first_step_excluded": "stall and utilization exclude step 0, as MLPerf Storage does, "
                                                        "and the drain of a prefetch head start (steady_window); the "
                                                        "first iter() is startup_s; wall_clock_utilization includes "
                                                        "both"})
        m = self.metrics()
        r.metrics = m
        for warning in _warnings(m, self.path):
            r.warn(warning)
        return r


def _warnings(m: dict, path: str | None) -> list[str]:
    out = []
    if m["steps"] < 2:
        out.append(f"only {m['steps']} step(s): no stall can be measured (step 0 is excluded)")
    elif not m["stable"]:
        out.append(f"not stable after {m['steps']} steps: " + "; ".join(m["stability"]["not_stable_because"]))
    if path is None:
        out.append("no path= given: the device's bytes (and read amplification) are not counted; "
                   "process_io is the process tree's own count")
    wf = m.get("warmup_fraction")
    if wf is not None and wf > 0.10:
        out.append(f"warm-up (the first iter() + first batch) took {m['warmup_s']:.2f} s, {wf:.0%} of the wall clock")
    return out


def watch(loader: Iterable, json: str | None = None, path: str | None = None, interval_s: float = 0.2,
          name: str | None = None, workers: int | None = None) -> Watch:
    """Wrap ``loader`` (any iterable) to measure the loop's data stall; see the module docstring.

    ``json``: results file written when the loop ends (the ``load`` schema, ``command: "watch"``);
    ``path``: where the data lives, for the device's bytes; ``workers``: the loader's parallelism
    when it is not a torch DataLoader (0 for a loop that makes its own batches)."""
    if interval_s <= 0:
        from .errors import ConfigError

        raise ConfigError("interval_s", f"must be positive, got {interval_s}", "e.g. interval_s=0.2")
    from .errors import ConfigError

    if path is not None and not os.path.exists(path):
        raise ConfigError("path", f"{path} does not exist", "give the directory or file the loader reads")
    if json is not None:
        # before the loop starts: a results file that cannot be written would fail only at its end
        from .guard import refuse_foreign_file

        folder = os.path.dirname(os.path.abspath(json))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise ConfigError("json", f"cannot write {json}: {folder} is not a writable directory",
                              "give a path in an existing, writable directory")
        refuse_foreign_file(json, "json", "results", force=False)   # never over a file iobench did not write
    return Watch(loader, json=json, path=path, interval_s=interval_s, name=name, workers=workers)
