"""The results schema: metric names, the typed load metrics, and the published JSON Schema.

Every results file (``iobench.results.Results``) is an envelope (``schema_version``,
``command``, ``config``, ``environment``, ``metrics``, ...).  A load's ``metrics`` are a
``LoadMetrics``: the loader builds one, writes ``to_dict()``, and readers (report,
planner, check, compare, mlperf) take the fields back with ``LoadMetrics.from_dict`` or
by the name constants below — never by spelling a key or sniffing a suffix.

``json_schema()`` derives the JSON Schema from these types; ``docs/results.schema.json``
is its output (a test keeps the two equal), and ``validate`` checks a document against
it (the tests validate every results file they write: ``IOBENCH_VALIDATE_RESULTS=1``).
Readers accept the versions in ``SUPPORTED_VERSIONS`` and refuse any other.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypedDict, Union

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = (1,)

# Metric names (keys of a load's ``metrics``).  Readers use these, never the literal.
STALL_RATIO = "stall_ratio"                          # steady window: wait / step time
ACCELERATOR_UTILIZATION = "accelerator_utilization"  # 1 - STALL_RATIO
STALL_RATIO_MLPERF = "stall_ratio_first_step_excluded"  # MLPerf Storage's count (every step but the first)
AU_MLPERF = "accelerator_utilization_first_step_excluded"
WALL_CLOCK_UTILIZATION = "wall_clock_utilization"
INTERVALS = "intervals"
STABLE = "stable"
THROUGHPUT = "throughput"
BYTES_PER_S = "bytes_per_s"
SAMPLES_PER_S = "samples_per_s"
BATCH_WAIT_S = "batch_wait_s"
BATCH_SERVICE_S = "batch_service_s"                 # storage + preparation per batch at its worker
BATCH_IO_S = "batch_io_s"                           # storage alone
P99_SERVICE_INTERVAL = "batch_service_p99_s"   # key under INTERVALS
P99_WAIT_INTERVAL = "batch_wait_p99_s"         # key under INTERVALS


class HdrSummary(TypedDict):
    """An HDR histogram's summary in seconds (``iobench.metrics.LatencyHistogram.summary``);
    ``min <= p50 <= p90 <= p99 <= p999 <= max`` (None when ``count`` is 0)."""

    count: int
    min: float | None
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    p999: float | None
    max: float | None


class Throughput(TypedDict):
    samples_per_s: float | None
    bytes_per_s: float | None      # counted at the backend (what storage delivered)
    batches_per_s: float | None
    steady_samples_per_s: float | None


class SteadyWindow(TypedDict):
    from_step: int
    to_step: int
    rule: str


class QueueDepth(TypedDict):
    mean: float
    max: int
    slots: int
    slot_bytes: int


class Interval(TypedDict, total=False):
    """A confidence interval (``iobench.loader.stability``); ``high`` is None while the sample
    is too small to bound it, and ``note`` says why."""

    low: float | None
    high: float | None
    half_width: float | None
    relative_half_width: float | None
    note: str | None


class Stability(TypedDict):
    rule: dict                     # iobench.loader.stability.StopRule.describe()
    until_stable: bool
    stopped: str
    not_stable_because: list[str]


@dataclass
class StepSeries:
    """What a step loop records, one entry per step in step order (iobench's loader,
    ``iobench.watch``): the fields ``iobench.loader.stability`` judges and a results file's
    ``series`` come from."""

    waits: list[float] = field(default_factory=list)
    computes: list[float] = field(default_factory=list)
    steps_s: list[float] = field(default_factory=list)
    t_step: list[float] = field(default_factory=list)
    batch_bytes: list[int] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    io_s: list[float] = field(default_factory=list)      # storage time spent producing the batch (where known)
    prep_s: list[float] = field(default_factory=list)    # parse/decode/collate time of the batch
    t_end: int = 0


@dataclass(frozen=True)
class StepMetrics:
    """What every step loop measures, iobench's loader or a loop around the user's own
    (``LoadMetrics``, ``WatchMetrics``): the stall, its timings and histograms.  Field names are
    the keys written; see README: Results schema."""

    access: str                     # the access pattern ("watch": the user's own loader)
    steps: int
    samples: int
    first_step_excluded: bool
    stall_ratio: float
    accelerator_utilization: float
    steady_window: SteadyWindow
    stall_ratio_first_step_excluded: float
    accelerator_utilization_first_step_excluded: float
    wall_clock_utilization: float | None
    wall_s: float
    wall_s_with_startup: float
    wait_s_total: float
    compute_s_total: float
    first_step_s: float | None
    startup_s: float
    time_to_first_batch_s: float | None
    warmup_s: float
    warmup_fraction: float | None
    batch_wait_s: HdrSummary
    batch_wait_hist: str | None
    batch_io_s: HdrSummary          # storage alone (watch: = batch_service_s, what `plan prefetch` reads)
    batch_service_s: HdrSummary     # storage + preparation per batch (watch: exact or estimated)
    batch_service_hist: str | None
    compute_s: HdrSummary
    compute_hist: str | None
    step_s: HdrSummary
    batch_bytes: float              # mean bytes of the batches the consumer received
    batch_bytes_max: int
    throughput: Throughput
    series: dict[str, list]
    device_io: dict | None
    intervals: dict[str, Interval]
    stable: bool

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"} | \
            getattr(self, "extra", {})

    @property
    def stall_interval(self) -> Interval | None:
        return self.intervals.get(STALL_RATIO)


@dataclass(frozen=True)
class LoadMetrics(StepMetrics):
    """What one load measured (``iobench.loader.core.run_load``): the ``metrics`` of a
    ``load`` results file."""

    steps_planned: int
    stopped_early: str | None
    epochs_planned: int
    fill_io_s_total: float
    batch_io_hist: str | None
    batch_prep_s: HdrSummary
    bytes_read: int
    requests: int
    read_latency_s: dict[str, HdrSummary]
    read_calls: dict[str, int]
    queue_depth: QueueDepth
    per_worker: list[dict]
    system: dict
    pickled_batches: int
    verify_checksums: dict | None
    stability: Stability
    # What later stages add (repeats, tiers, analysis, prefetch_recommendation, ...): kept, not typed.
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, metrics: dict) -> LoadMetrics:
        """The typed view of a load's ``metrics``; a missing field is a malformed file (exit 2)."""
        from .errors import ConfigError

        names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
        missing = [n for n in names if n not in metrics]
        if missing:
            raise ConfigError("results.metrics", f"not a load's metrics: {', '.join(missing[:3])} missing",
                              "give a results file written by `iobench load --json`")
        return cls(**{n: metrics[n] for n in names}, extra={k: v for k, v in metrics.items() if k not in names})


@dataclass(frozen=True)
class WatchMetrics(StepMetrics):
    """What ``iobench.watch`` measured around the user's own loader: the ``metrics`` of a ``watch``
    results file (``iobench measure`` too).  The load's names for what a loop around any iterable
    can measure; no queue, worker or request counters, which only iobench's own loader has."""

    epochs: int
    batch_service_basis: str
    bytes_delivered: int
    bytes_read: int | None          # the device's (path=) or the process tree's: bytes_read_basis
    bytes_read_basis: str
    loader: dict                    # kind, num_workers, prefetch_factor (a torch DataLoader's)
    process_io: dict | None
    stability: dict
    extra: dict = field(default_factory=dict)   # prefetch_recommendation


class CompareRow(TypedDict):
    """One metric of ``iobench compare``: A, B, their difference and 95% intervals ([low, high], a missing
    bound null)."""

    path: str
    a: float | None
    b: float | None
    diff: float | None
    ratio: float | None
    ci_a: list | None
    ci_b: list | None
    within_noise: bool


@dataclass(frozen=True)
class CompareMetrics:
    """The ``metrics`` of a ``compare`` results file (``iobench compare --json``)."""

    verdict: str
    setup_differences: list[str]
    rows: list[CompareRow]
    checks: list[dict]
    passed: bool

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def is_load_metrics(metrics: Any) -> bool:
    """True when ``metrics`` (a dict read from a file) has every field of a ``LoadMetrics``."""
    return isinstance(metrics, dict) and all(f.name in metrics for f in dataclasses.fields(LoadMetrics)
                                             if f.name != "extra")


def check_version(doc: dict, where: str = "results") -> None:
    """Refuse a results document whose ``schema_version`` this iobench cannot read (exit 2)."""
    from .errors import ConfigError

    v = doc.get("schema_version")
    if v not in SUPPORTED_VERSIONS:
        raise ConfigError(where, f"schema_version {v!r} is not one this iobench reads "
                                 f"({', '.join(map(str, SUPPORTED_VERSIONS))})",
                          "rerun with this iobench, or read it with the iobench that wrote it")


# --- the JSON Schema, derived from the types above -------------------------------------------------

_ENVELOPE = {
    "schema_version": int, "command": str, "iobench_version": str, "started_at": str, "finished_at": str,
    "host": dict, "config": dict, "environment": dict, "world": dict, "metrics": dict, "warnings": list[str],
}


def _type_schema(tp: Any, defs: dict) -> dict:
    origin = typing.get_origin(tp)
    if tp is Any:
        return {}
    if origin in (Union, types.UnionType):
        parts = [_type_schema(a, defs) for a in typing.get_args(tp)]
        types_ = [p["type"] for p in parts if set(p) == {"type"} and isinstance(p["type"], str)]
        if len(types_) == len(parts):
            return {"type": types_}
        return {"anyOf": parts}
    if tp is type(None):
        return {"type": "null"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if tp is dict or origin is dict:
        args = typing.get_args(tp)
        return {"type": "object"} | ({"additionalProperties": _type_schema(args[1], defs)} if args else {})
    if tp is list or origin is list:
        args = typing.get_args(tp)
        return {"type": "array"} | ({"items": _type_schema(args[0], defs)} if args else {})
    if typing.is_typeddict(tp) or dataclasses.is_dataclass(tp):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}   # placeholder against recursion
            hints = typing.get_type_hints(tp)
            if dataclasses.is_dataclass(tp):
                hints = {f.name: hints[f.name] for f in dataclasses.fields(tp) if f.name != "extra"}
                required = list(hints)
            else:
                required = sorted(getattr(tp, "__required_keys__", hints))
            doc = (tp.__doc__ or "").split("\n\n")[0].replace("\n", " ").strip()
            defs[name] = {"type": "object", **({"description": " ".join(doc.split())} if doc else {}),
                          "properties": {k: _type_schema(v, defs) for k, v in hints.items()},
                          "required": required}
        return {"$ref": f"#/$defs/{name}"}
    raise TypeError(f"no JSON Schema for {tp!r}")


def json_schema() -> dict:
    """The JSON Schema of a results file (``docs/results.schema.json``)."""
    defs: dict = {}
    props = {k: _type_schema(v, defs) for k, v in _ENVELOPE.items()}
    props["schema_version"] = {"const": SCHEMA_VERSION}
    props["per_rank"] = {"type": "array", "items": {"type": "object"}}
    # command -> the dataclass its results' ``metrics`` are (each file is held to it)
    per_command = {"load": LoadMetrics, "watch": WatchMetrics, "compare": CompareMetrics}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://iobench.dev/results.schema.json",
        "title": "iobench results",
        "description": "One run's results, as every iobench command writes them with --json "
                       "(generated by iobench.schema.json_schema).",
        "type": "object",
        "properties": props,
        "required": list(_ENVELOPE),
        "allOf": [{"if": {"properties": {"command": {"const": cmd}}, "required": ["command"]},
                   "then": {"properties": {"metrics": _type_schema(cls, defs)}}} for cmd, cls in per_command.items()],
        "$defs": dict(sorted(defs.items())),
    }


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"


# --- a small validator for the keywords json_schema() uses (no third-party dependency) -------------

_JSON_TYPES = {"object": dict, "array": list, "string": str, "null": type(None), "boolean": bool}


def _is_type(v: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if name == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, _JSON_TYPES[name])


def errors(doc: Any, schema: dict | None = None) -> list[str]:
    """Every way ``doc`` breaks ``schema`` (default: the results schema), as 'path: problem'."""
    root = schema or json_schema()
    out: list[str] = []

    def check(v: Any, s: dict, path: str) -> None:
        if "$ref" in s:
            s = root["$defs"][s["$ref"].rsplit("/", 1)[-1]]
        if "const" in s and v != s["const"]:
            out.append(f"{path}: {v!r} is not {s['const']!r}")
        if "type" in s:
            names = s["type"] if isinstance(s["type"], list) else [s["type"]]
            if not any(_is_type(v, n) for n in names):
                out.append(f"{path}: {type(v).__name__} is not {'/'.join(names)}")
                return
        if "anyOf" in s and all(_sub(v, p, path) for p in s["anyOf"]):
            out.append(f"{path}: matches none of anyOf")
        for part in s.get("allOf", ()):
            if "if" in part and _sub(v, part["if"], path):
                continue
            check(v, part.get("then", part), path)
        if isinstance(v, dict):
            for k in s.get("required", ()):
                if k not in v:
                    out.append(f"{path}.{k}: missing")
            props = s.get("properties", {})
            for k, x in v.items():
                if k in props:
                    check(x, props[k], f"{path}.{k}")
                elif isinstance(s.get("additionalProperties"), dict):
                    check(x, s["additionalProperties"], f"{path}.{k}")
        if isinstance(v, list) and "items" in s:
            for i, x in enumerate(v):
                check(x, s["items"], f"{path}[{i}]")

    def _sub(v: Any, s: dict, path: str) -> list[str]:
        saved = len(out)
        check(v, s, path)
        found = out[saved:]
        del out[saved:]
        return found

    check(doc, root, "$")
    return out
