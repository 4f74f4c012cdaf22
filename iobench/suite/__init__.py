"""`iobench run`: the default suite, stage by stage, on the embedded default or a cluster config.

One module per stage in this package (``iobench.suite.<stage>``), each with
``suite_stage(ctx: SuiteContext) -> dict``, listed in ``STAGES`` as "module:function"
(a lazy registry: a stage's dependencies load only when it runs).  A stage calls its
area's public API (generate, tiers, loader, checkpointing, gds, planner, report): the
areas know nothing of the suite.  It reads what earlier stages left in ``ctx.state`` (a
typed ``SuiteState``), writes its own results files under ``ctx.out_dir``, adds rows to
the summary with ``ctx.row(...)`` and returns its metrics, which land under
``metrics.<stage name>`` in ``run.json``.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import build, load_yaml_file, to_dict
from ..errors import ConfigError
from ..results import Results, begin
from .state import SuiteState

# Order matters: later stages read what earlier ones put in ctx.state.
STAGES: list[tuple[str, str]] = [
    ("generate", "iobench.suite.generate:suite_stage"),      # gen + verify; fills state.datasets
    # generate's timing rounds, probe and gds: one repeat here, one between load passes, one after
    # checkpoint (ctx.repeated)
    ("probe", "iobench.suite.probe:suite_stage"),            # short probe of each tier
    ("gds", "iobench.suite.gds:suite_stage"),                # probe + CPU path numbers
    ("stage", "iobench.suite.stage:suite_stage"),            # staging across nvme/pfs/object; fills state.tiers_file
    ("load", "iobench.suite.load:suite_stage"),              # cold/warm loads + prefetch recommendation
    ("checkpoint", "iobench.suite.checkpoint:suite_stage"),
    ("report", "iobench.suite.report:suite_stage"),          # HTML + Markdown from the run's results
]


@dataclass(frozen=True)
class ObjectTierConfig:
    url: str
    endpoint_url: str | None = None
    storage_options: dict | None = None  # fsspec options (no secrets: those come from AWS_* / profiles)

    def __post_init__(self) -> None:
        if not self.url.startswith("s3://"):
            raise ConfigError("object.url", f"{self.url!r} is not an s3:// URL", "use s3://bucket/prefix")


@dataclass(frozen=True)
class CheckpointStageConfig:
    scale: float = 1e-3                 # fraction of the preset's state to save and restore

    def __post_init__(self) -> None:
        if not 0 < self.scale <= 1:
            raise ConfigError("checkpoint.scale", f"must be in (0, 1], got {self.scale}", "use e.g. 0.001")


@dataclass(frozen=True)
class PlannerAssumptions:
    job_mtbf: str = "7.9h"              # mean time between job failures, for the checkpoint interval
    accelerators: int = 8               # accelerators per node, for the bandwidth plan


@dataclass(frozen=True)
class SuiteConfig:
    """`iobench run --config FILE`: real tiers instead of the embedded default."""

    work_dir: str | None = None
    object: ObjectTierConfig | None = None
    checkpoint: CheckpointStageConfig | None = None
    planner: PlannerAssumptions | None = None

    def as_dict(self) -> dict:
        """The sections that were given, as the plain mapping stages read."""
        return {k: v for k, v in to_dict(self).items() if v is not None}


def load_suite_config(path: str) -> SuiteConfig:
    data = load_yaml_file(path, "--config")
    if not data:   # (as `--workload`): asked for a config, the suite would silently run with none
        raise ConfigError("--config", f"{path} is empty: it holds no section",
                          "give a cluster YAML (tiers, object store), or omit --config for the embedded default")
    try:
        return build(SuiteConfig, data, "")
    except ConfigError as e:   # which file: not only the key inside it
        raise ConfigError("--config", f"{path}: {e.field}: {e.problem}", e.fix) from None


@dataclass
class SuiteContext:
    out_dir: Path                       # where results and the report go
    work_dir: Path                      # scratch space for local tiers (removed at the end)
    s3_url: str | None = None           # s3://bucket/prefix of the object tier, if any
    s3_storage_options: dict = field(default_factory=dict, repr=False)
    endpoint_url: str | None = None
    quick: bool = True                  # the embedded default: small sizes, a few minutes in all
    # the embedded S3 server's restart (same data and endpoint, a fresh process): the load stage measures
    # each S3 load on several server instances; None on a cluster store
    restart_object_store: Callable[[], object] | None = None
    config: dict = field(default_factory=dict)
    state: SuiteState = field(default_factory=SuiteState)    # what stages hand to each other
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    verdict: str = ""              # the report stage's one-line answer, printed before the summary table
    results_files: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    spread_over_run: bool = False       # set by run_suite: ``repeated`` stages spread their repeats
    spread: list = field(default_factory=list)   # SpreadRepeats still owed repeats (run_suite merges them)
    t0: float = field(default_factory=time.perf_counter)   # the run's start

    def row(self, stage: str, what: str, value: str, notes: tuple[str, ...] = ()) -> None:
        """One line of the run's table; ``notes``: caveats, printed once each as footnotes under it."""
        from .report import Row

        self.rows.append(Row(stage, what, value, notes))

    def repeated(self, name: str, measure: Callable[[], object], finish: Callable[[list], dict],
                 repeats: int | None = None, points: tuple[int, ...] | None = None) -> dict | None:
        """A stage's repeats (REPEATS unless given) of a short measurement (``intervals.SpreadRepeats``).
        Within `iobench run` the first runs now and the rest are spread over the run (before the load
        passes in ``points``, then after checkpoint); run_suite merges them before the report, and the
        stage returns None.  Called on its own (tests), all repeats run now and the merged metrics are
        returned."""
        from .intervals import REPEATS, SpreadRepeats

        s = SpreadRepeats(name, measure, finish, repeats=repeats or REPEATS, t0=self.t0,
                          **({} if points is None else {"points": points}))
        s.more()
        if not self.spread_over_run:
            return s.done()
        self.spread.append(s)
        return None

    def spread_point(self, load_pass: int) -> None:
        """One more repeat of every spread stage that takes one before this load pass (0-based)."""
        for s in self.spread:
            if load_pass in s.points:
                s.more()

    def local_dir(self, name: str) -> Path:
        p = self.work_dir / name
        p.mkdir(parents=True, exist_ok=True)
        return p


def run_suite(out_dir: Path, config: dict | None = None, stages: list[str] | None = None,
              keep_data: bool = False, progress: bool = True) -> Path:
    """Run the suite; returns the path of run.json."""
    from rich.console import Console
    from ..s3server import S3Server

    console = Console(stderr=True, quiet=not progress)  # stage rules and spinners are the run's progress
    out_dir.mkdir(parents=True, exist_ok=True)
    results = Results(command="run", config=config or {})
    parent = (config or {}).get("work_dir")
    if parent and not os.path.isdir(parent):  # before any work; mkdtemp would give a traceback
        raise ConfigError("work_dir", f"{parent} is not a directory",
                          "create it, or drop work_dir to use the system temp dir")
    work_dir = Path(tempfile.mkdtemp(prefix="iobench-run-", dir=parent))
    server = None
    created_s3 = None  # the run's own prefix on a cluster store: removed at the end, nothing else
    try:
        cluster = (config or {}).get("object")
        if cluster:
            s3_url = f"{cluster['url'].rstrip('/')}/{work_dir.name}"
            endpoint, opts = cluster.get("endpoint_url"), dict(cluster.get("storage_options") or {})
            created_s3 = (s3_url, endpoint, opts)
        else:
            with console.status("starting the embedded S3 server (SeaweedFS)"):
                server = S3Server(bucket="iobench").start()
            s3_url, endpoint, opts = "s3://iobench/run", server.endpoint_url, {
                "key": server.access_key, "secret": server.secret_key}
        ctx = SuiteContext(out_dir=out_dir, work_dir=work_dir, s3_url=s3_url, s3_storage_options=opts,
                           endpoint_url=endpoint, quick=not cluster, config=config or {},
                           restart_object_store=server.restart if server is not None else None,
                           spread_over_run=True)

        own_s: dict[str, float] = {}   # a spread stage's time at its own place outside its repeats (set-up)

        def finish_spread() -> None:
            # the spread stages' last repeats (after load and checkpoint), merged into their metrics
            for s in ctx.spread:
                m = dict(s.done())
                m["stage_s"], m["repeats_at_s"] = own_s.get(s.name, 0.0) + s.took_s, s.at_s
                results.metrics[s.name] = ctx.state.stage_metrics[s.name] = m
            ctx.spread.clear()
            order = {n: i for i, (n, _) in enumerate(STAGES)}
            ctx.rows.sort(key=lambda r: order.get(r[0], len(order)))  # stable: each stage's rows keep their order
        results.environment["object_tier"] = {"url": s3_url, "endpoint_url": endpoint,
                                              "embedded": server is not None}
        for name, target in STAGES:
            if stages and name not in stages:
                continue
            if name == "report":
                finish_spread()
            module, func = target.split(":")
            console.rule(f"[bold]{name}")
            # The host's 1-minute load average around each stage: on a shared machine, other work
            # shows here (the suite itself keeps ~2-3 busy), and explains two runs that disagree.
            load_avg = [round(os.getloadavg()[0], 2)]
            t0 = time.perf_counter_ns()
            begin()  # the stage's results files carry their own start time
            metrics = getattr(importlib.import_module(module), func)(ctx)
            results.environment.setdefault("load_average_1m", {})[name] = load_avg + [round(os.getloadavg()[0], 2)]
            spread = next((s for s in ctx.spread if s.name == name), None)
            if metrics is None and spread is not None:
                results.metrics[name] = {}     # keeps its place in run.json; finish_spread fills it
                own_s[name] = (time.perf_counter_ns() - t0) / 1e9 - spread.took_s
                continue
            metrics = dict(metrics or {})
            metrics["stage_s"] = (time.perf_counter_ns() - t0) / 1e9
            results.metrics[name] = metrics
            # Later stages (the report) see what earlier ones returned; run.json is written only at the end.
            ctx.state.stage_metrics[name] = metrics
        finish_spread()  # when the report stage was not run
        for w in ctx.warnings:
            results.warn(w)
        # relative to out_dir: the run's folder can be moved or copied and still compared as a whole
        results.environment["results_files"] = [_relative(p, out_dir) for p in ctx.results_files]
        path = results.write(out_dir / "run.json")
        from .report import print_summary

        print_summary(Console(), ctx.verdict, ctx.rows)   # the answer first, then the table and its footnotes
        return path
    finally:
        if created_s3 is not None and not keep_data:
            _remove_prefix(*created_s3, console)
        if server is not None:
            server.stop()
        if not keep_data:
            shutil.rmtree(work_dir, ignore_errors=True)


def _relative(p: Path, root: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(p)


def _remove_prefix(url: str, endpoint: str | None, opts: dict, console) -> None:
    """Remove the run's own prefix (iobench-run-XXXX under the configured URL) from the object store."""
    from ..storage import open_backend

    try:
        backend = open_backend(url, endpoint_url=endpoint, storage_options=opts, field_name="object.url")
        if backend.fs.exists(backend.root):
            backend.fs.rm(backend.root, recursive=True)
    except Exception as e:  # cleanup must not hide the run's own error; say what is left
        console.print(f"[yellow]warning[/]: could not remove {url} ({type(e).__name__}); remove it by hand")
