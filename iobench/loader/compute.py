"""Consumer emulation: how long each training step computes, and how.

Durations come from a constant, a distribution (``normal``, ``lognormal``) or a file of
measured step times (one number per line, seconds or with a unit, cycled).  Modes:
``sleep`` (an accelerator: the host CPU is free while it computes), ``spin`` (busy CPU,
to model contention with the loader's workers) or ``callback`` — a user function
``module:function`` called as ``fn(batch, step)`` that does the real work (e.g. a PyTorch
training step; see README "Loader").  A callback that is a :class:`StepCallback` is also handed
the loader's ``idle`` (it may take worker messages while the step sleeps, as sleep mode does).
"""

from __future__ import annotations

import importlib
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError, IobenchError
from ..io.inputs import read_text
from ..units import parse_duration
from ..wrappers import Z99, parse_params   # the emulated storage's distributions: one grammar, one constant

MODES = ("sleep", "spin", "callback")


@dataclass(frozen=True)
class ComputeModel:
    kind: str = "const"          # const | normal | lognormal | file
    mean_s: float = 0.0          # const value, normal mean, lognormal p50
    spread_s: float = 0.0        # normal std, lognormal p99
    times_s: tuple[float, ...] = ()
    mode: str = "sleep"
    callback: str | None = None  # "module:function"
    seed: int = 0

    @property
    def nominal_s(self) -> float:
        """The typical step compute time (used for prefetch sizing)."""
        if self.kind == "file" and self.times_s:
            return sum(self.times_s) / len(self.times_s)
        return self.mean_s

    def describe(self) -> dict:
        by_kind: dict[str, dict[str, Any]] = {"normal": {"std_s": self.spread_s}, "file": {"steps_in_file": len(self.times_s)},
                                              "lognormal": {"p50_s": self.mean_s, "p99_s": self.spread_s}}
        return {"kind": self.kind, "mode": self.mode, "nominal_s": self.nominal_s, **by_kind.get(self.kind, {}),
                **({"callback": self.callback} if self.callback else {})}


def parse_compute(spec: "str | float | int", mode: str = "sleep", callback: str | None = None,
                  seed: int = 0, field: str = "--compute") -> ComputeModel:
    """'200ms' | 'normal:mean=200ms,std=20ms' | 'lognormal:p50=180ms,p99=400ms' | 'file:PATH'.
    ``mode`` is one of ``MODES`` (``LoadConfig`` refuses any other)."""
    if mode == "callback" and not callback:
        raise ConfigError("--compute-fn", "callback mode needs a function", "give --compute-fn module:function")
    text = str(spec).strip()
    kind, sep, body = text.partition(":")
    if not sep or kind not in ("const", "normal", "lognormal", "file"):
        kind, body = "const", text
    if kind == "const":
        return ComputeModel(kind="const", mean_s=parse_duration(body, field), mode=mode, callback=callback, seed=seed)
    if kind == "file":
        try:
            lines = [ln.strip() for ln in read_text(body, field, what="step-time file").splitlines()]
        except OSError as e:
            raise ConfigError(field, f"cannot read step-time file {body!r} ({e.strerror})",
                              "give a file with one step time per line") from None
        times = []
        for n, ln in enumerate(lines, 1):
            if ln and not ln.startswith("#"):
                try:
                    times.append(parse_duration(ln, field, bare_unit="s"))
                except ConfigError as e:   # which file, which line: not only the value
                    raise ConfigError(field, f"{body}:{n}: {e.problem}", e.fix) from None
        if not times:
            raise ConfigError(field, f"{body!r} holds no step times", "one number (seconds) or duration per line")
        return ComputeModel(kind="file", times_s=tuple(times), mode=mode, callback=callback, seed=seed)
    need = ("mean", "std") if kind == "normal" else ("p50", "p99")
    params = parse_params(text, body, need, field, "e.g. normal:mean=200ms,std=20ms or lognormal:p50=180ms,p99=400ms")
    a, b = (parse_duration(params[k], field) for k in need)
    if kind == "lognormal" and (a <= 0 or b < a):
        raise ConfigError(field, f"{text!r}: need 0 < p50 <= p99", "e.g. lognormal:p50=180ms,p99=400ms")
    return ComputeModel(kind=kind, mean_s=a, spread_s=b, mode=mode, callback=callback, seed=seed)


def load_callback(target: str) -> Callable:
    """``module:function`` (installed, or a module in the current directory) or ``path/file.py:function``."""
    module, sep, name = target.rpartition(":")
    if not sep or not module or not name:
        raise ConfigError("--compute-fn", f"{target!r} is not module:function", "e.g. mytrain:step or mytrain.py:step")
    try:
        if module.endswith(".py"):
            from importlib import util as ilu

            if not os.path.isfile(module):
                raise ImportError(f"no file {module}")
            spec = ilu.spec_from_file_location(os.path.basename(module)[:-3], module)
            if spec is None or spec.loader is None:
                raise ImportError(f"{module} is not a Python module")
            mod = ilu.module_from_spec(spec)
            spec.loader.exec_module(mod)
        else:
            # `python train.py` would find a module beside it; the `iobench` script does not put the
            # current directory on sys.path, so add it (last: installed packages win)
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.append(os.getcwd())
            mod = importlib.import_module(module)
        fn = getattr(mod, name)
    except (ImportError, AttributeError) as e:
        raise ConfigError("--compute-fn", f"cannot load {target!r} ({e})", "check the module path and name") from e
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing (SyntaxError, its own raise)
        raise ConfigError("--compute-fn", f"importing {module!r} raised {type(e).__name__}: {e}",
                          "fix the module (--debug shows its traceback)") from e
    if not callable(fn):
        raise ConfigError("--compute-fn", f"{target!r} is not callable", "name a function")
    return fn


class StepCallback:
    """A callback step that gets the loader's ``idle(seconds)`` too (e.g. MLPerf's step: sleep, then a
    barrier across the simulated accelerators, iobench.mlperf.sync)."""

    def __call__(self, batch: Any, step: int, idle: Callable[[float], Any] | None = None) -> None:
        raise NotImplementedError


class Compute:
    """Runs one step's emulated compute; ``__call__`` returns its duration in seconds."""

    def __init__(self, model: ComputeModel) -> None:
        self.model = model
        self._rng = random.Random(model.seed)
        self._fn = load_callback(model.callback) if model.mode == "callback" and model.callback else None

    def duration(self, step: int) -> float:
        m = self.model
        if m.kind == "file":
            return m.times_s[step % len(m.times_s)]
        if m.kind == "normal":
            return max(0.0, self._rng.gauss(m.mean_s, m.spread_s))
        if m.kind == "lognormal":
            sigma = math.log(m.spread_s / m.mean_s) / Z99 if m.spread_s > m.mean_s else 0.0
            return self._rng.lognormvariate(math.log(m.mean_s), sigma)
        return m.mean_s

    def __call__(self, batch: Any, step: int, idle: Callable[[float], Any] | None = None) -> float:
        """Run the step; in sleep mode ``idle(seconds)`` may use the host thread while the device computes."""
        t0 = time.perf_counter_ns()
        if self._fn is not None:
            try:
                if isinstance(self._fn, StepCallback):
                    self._fn(batch, step, idle)
                else:
                    self._fn(batch, step)
            except Exception as e:   # the user's step failed: name it and the step, keep its traceback
                raise IobenchError(f"--compute-fn {self.model.callback} failed at step {step}: "
                                   f"{type(e).__name__}: {e}") from e
        else:
            d = self.duration(step)
            if d > 0:
                if self.model.mode == "spin":
                    end = t0 + int(d * 1e9)
                    while time.perf_counter_ns() < end:
                        pass
                else:
                    sleep_until(t0 + int(d * 1e9), idle)
        return (time.perf_counter_ns() - t0) / 1e9


def sleep_until(deadline_ns: int, idle: Callable[[float], Any] | None = None) -> None:
    """Sleep until ``deadline_ns`` (perf_counter), handing the time to ``idle`` where given."""
    while True:  # a signal, or idle work, may return early
        left = deadline_ns - time.perf_counter_ns()
        if left <= 0:
            return
        if idle is not None:
            idle(left / 1e9)
        else:
            time.sleep(left / 1e9)
