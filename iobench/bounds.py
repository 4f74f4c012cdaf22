"""Bounds of every numeric command-line flag, checked before any work (exit 2, one line naming the flag).

argparse converts ``type=int``/``type=float`` flags but bounds nothing: ``--accelerators 100000``
forked until the host gave up, ``--interval-ms 1e14`` overflowed after writing a step.  The bounds
of all numeric flags are kept here, in one table, so that one check (``check_flags``, called by
``iobench.cli.main`` right after parsing) applies them to every command and the hostile-value test
(``tests/test_hostile_values.py``) reads the same table.  A numeric flag without an entry gets
``DEFAULT``: finite, not negative, at most a billion; so a new flag is never unbounded.

Resources give the upper bounds where one exists: process counts from the cores and the process
and open-file limits (``process_cap``), threads and requests in flight from the open-file limit
(``thread_cap``), bytes held in memory from the host's memory (``memory_cap``).  Durations have the
one cap of ``iobench.units`` (7 days); a number of milliseconds or seconds (``--interval-ms``,
``--compute-s``) is held to it too.  Flags whose value is text (sizes, durations, rates, lists)
are parsed, and bounded, by ``iobench.units`` where the command reads them.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Callable

from .errors import ConfigError
from .units import MAX_DURATION_S


def _limit(which: str) -> float:
    import resource

    soft, _hard = resource.getrlimit(getattr(resource, which))
    return math.inf if soft == resource.RLIM_INFINITY else float(soft)


def process_cap() -> int:
    """Processes one command may start: 32 per core (MLPerf hosts simulate many accelerators per core),
    within the process limit and a quarter of the open-file limit (each worker holds pipes and slots)."""
    return int(max(1, min(32 * (os.cpu_count() or 1), _limit("RLIMIT_NPROC") // 2, _limit("RLIMIT_NOFILE") // 4)))


def thread_cap() -> int:
    """Threads or requests in flight: each holds a descriptor, so half the open-file limit, at most 4096."""
    return int(max(1, min(4096, _limit("RLIMIT_NOFILE") // 2)))


def memory_cap() -> int:
    """Bytes one buffer may take: the host's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 1 << 40


@dataclass(frozen=True)
class Bound:
    """``lo <= value <= hi`` (``hi`` a number or a resource function); ``why`` names the resource."""

    lo: float
    hi: "float | Callable[[], float]"
    why: str = ""
    lo_open: bool = False   # lo itself refused (a fraction in (0, 1])

    def upper(self) -> float:
        return float(self.hi()) if callable(self.hi) else float(self.hi)

    def check(self, flag: str, value: float) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(flag, f"{value!r} is not a finite number", f"give a number from {self.text()}")
        if value < self.lo or (self.lo_open and value == self.lo):
            raise ConfigError(flag, f"must be {'above' if self.lo_open else 'at least'} {self.lo:g}, got {value:g}",
                              f"give a number from {self.text()}")
        hi = self.upper()
        if value > hi:
            raise ConfigError(flag, f"{value:g} is more than {hi:g}" + (f": {self.why}" if self.why else ""),
                              f"give a number from {self.text()}")

    def text(self) -> str:
        return f"{'above ' if self.lo_open else ''}{self.lo:g} to {self.upper():g}"


DEFAULT = Bound(0, 1e9)
COUNT = Bound(1, 1e9)                         # a number of steps, samples, saves...
SEED = Bound(0, 2**63 - 1)
FRACTION = Bound(0, 1)                        # a ratio, a probability, an AU threshold
SCALE = Bound(0, 1, lo_open=True)             # shrink factors: 0 < F <= 1
PROCS = Bound(1, process_cap, "the processes this host can run: 32 per core, within ulimit -u and -n")
PROCS_OR_DEFAULT = Bound(0, process_cap, "the processes this host can run: 32 per core, within ulimit -u and -n")
# load --workers 0: no worker process, the consumer makes its own batches (iobench.loader.inprocess)
PROCS_OR_NONE = Bound(0, process_cap, "the processes this host can run: 32 per core, within ulimit -u and -n")
THREADS = Bound(1, thread_cap, "the open-file limit (ulimit -n) allows no more in flight")
SECONDS = Bound(0, MAX_DURATION_S, "7 days, the cap on any duration")
MILLISECONDS = Bound(0, MAX_DURATION_S * 1000, "7 days, the cap on any duration")
EPOCHS = Bound(1, 1e6)
RUNS = Bound(1, 1000)

# (command, flag) -> its bound; command is the subcommand path ("mlperf run"), flag its long option.
FLAGS: dict[tuple[str, str], Bound] = {
    ("check", "--batch-size"): Bound(1, 1e7), ("check", "--workers"): PROCS, ("check", "--prefetch"): Bound(1, 1024),
    ("check", "--steps"): Bound(2, 1e7), ("check", "--samples"): COUNT, ("check", "--max-stall"): FRACTION,
    ("ckpt", "--params"): Bound(1, 1e13, "more parameters than any model, 10 trillion"),
    ("ckpt", "--tp"): Bound(1, 1e5), ("ckpt", "--pp"): Bound(1, 1e5), ("ckpt", "--dp"): Bound(1, 1e6),
    ("ckpt", "--zero"): Bound(0, 3), ("ckpt", "--ranks"): Bound(1, 1e7), ("ckpt", "--scale"): SCALE,
    ("ckpt", "--count"): Bound(1, 1e5), ("ckpt", "--interval-ms"): MILLISECONDS,
    ("ckpt", "--queue-depth"): Bound(1, 64), ("ckpt", "--keep-local"): Bound(1, 1e5),
    ("ckpt", "--keep-durable"): Bound(1, 1e5), ("ckpt", "--fail-at"): SECONDS, ("ckpt", "--seed"): SEED,
    ("compare", "--max-regression"): Bound(0, 100), ("compare", "--min-au"): FRACTION,
    ("compare", "--max-stall"): FRACTION,
    ("gds bench", "--qd1-samples"): Bound(0, 1e7),
    ("gen", "--scale"): SCALE,
    ("load", "--min-steps"): Bound(2, 1e9), ("load", "--max-time"): Bound(0, MAX_DURATION_S, "7 days", lo_open=True),
    ("load", "--stall-ci"): Bound(0, 100, lo_open=True), ("load", "--repeat"): RUNS, ("load", "--workers"): PROCS_OR_NONE,
    ("load", "--prefetch"): Bound(1, 1024), ("load", "--batch-size"): Bound(1, 1e7), ("load", "--epochs"): EPOCHS,
    ("load", "--steps"): COUNT, ("load", "--shuffle-buffer"): Bound(0, 1e8), ("load", "--seed"): SEED,
    ("load", "--s3-concurrency"): THREADS, ("load", "--retries"): Bound(1, 100),
    ("load", "--retry-budget"): Bound(0, MAX_DURATION_S, "7 days", lo_open=True),
    ("load", "--error-rate"): FRACTION, ("load", "--timeout-rate"): FRACTION, ("load", "--read-ahead"): Bound(0, 1024),
    ("load", "--slot-bytes"): Bound(1, memory_cap, "the host's memory"),
    ("mlperf run", "--accelerators"): PROCS, ("mlperf run", "--compute-s"): SECONDS,
    ("mlperf run", "--epochs"): Bound(0, 1e6), ("mlperf run", "--runs"): RUNS, ("mlperf run", "--min-steps"): DEFAULT,
    ("mlperf run", "--workers"): PROCS_OR_DEFAULT, ("mlperf run", "--prefetch"): Bound(0, 1024),   # 0: the default depth
    ("mlperf run", "--au-threshold"): FRACTION, ("mlperf run", "--seed"): SEED,
    ("mlperf run", "--max-accelerators"): PROCS,
    ("mlperf datasize", "--accelerators"): Bound(1, 1e7), ("mlperf datasize", "--nodes"): Bound(1, 1e6),
    ("mlperf ckpt", "--ranks"): PROCS_OR_DEFAULT, ("mlperf ckpt", "--scale"): SCALE,
    ("mlperf ckpt", "--checkpoints"): Bound(1, 1000),
    ("plan", "--compute-ms"): MILLISECONDS,
    ("smoke", "--timeout"): Bound(0, MAX_DURATION_S, "7 days", lo_open=True), ("smoke", "--max-stall"): FRACTION,
    ("stage", "--epochs"): Bound(0, 1e6), ("stage", "--readers"): THREADS, ("stage", "--concurrency"): THREADS,
    ("stage", "--seed"): SEED,
    ("tiers init", "--concurrency"): THREADS,
    ("tiers lifecycle", "--keep-last"): DEFAULT, ("tiers lifecycle", "--every-nth"): DEFAULT,
    ("check", "--min-steps"): Bound(2, 1e9), ("index", "--seq-len"): Bound(0, 2**31 - 1),
    ("mlperf run", "--checkpoint-scale"): SCALE, ("report", "--min-au"): FRACTION, ("report", "--max-stall"): FRACTION,
    ("smoke", "--steps"): Bound(1, 1e7),
    ("mlperf ckpt", "--processes"): PROCS_OR_DEFAULT, ("mlperf ckpt", "--interval-s"): SECONDS,
    ("mlperf ckpt", "--runs"): RUNS,
}


def numeric_actions(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, long flag, action) of every ``type=int``/``type=float`` flag, subcommands included."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from numeric_actions(sub, path + (name,))
        elif a.option_strings and a.type in (int, float):
            yield " ".join(path), max(a.option_strings, key=len), a


def bound_of(command: str, flag: str) -> Bound:
    return FLAGS.get((command, flag), DEFAULT)


def chosen(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """(command path, parser) of each level of the subcommand the user chose: ("", top), ("mlperf", ...),
    ("mlperf run", ...)."""
    path: list[str] = []
    while parser is not None:
        yield " ".join(path), parser
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if not subs or name not in subs[0].choices:
            return
        path.append(name)
        parser = subs[0].choices[name]


def check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every numeric flag of the chosen command within its bound (``ConfigError`` naming the flag)."""
    for cmd, p in chosen(parser, args):
        for a in p._actions:
            if not a.option_strings or a.type not in (int, float):
                continue
            flag = max(a.option_strings, key=len)
            value = getattr(args, a.dest, None)
            for v in value if isinstance(value, list) else [value]:
                if v is not None and v != a.default:   # a default is the program's own choice
                    bound_of(cmd, flag).check(flag, v)
