"""Read results files generically: HDR summaries, time series, scalars, tables and plans.

The report never needs to know every command: it walks ``metrics`` and recognises shapes.
An HDR summary is a dict with ``count`` and ``p50``/``p99``; a time series is a dict of
equal-length lists with a time key (``t``, ``t_s``, ``time_s``, ...) or a list of records
with such a key (a bare list of numbers, such as the times repeats ran at, is not one: it
would plot as filler); a table is a list of flat dicts.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

HDR_KEYS = ("count", "min", "mean", "p50", "p90", "p99", "p999", "max")
TIME_KEYS = ("t", "t_s", "time_s", "elapsed_s", "ts", "time")


def is_plot_spec(v: Any) -> bool:
    """A plot described in a results file: {title, x_label, y_label, x_log, y_log, series: [{label, points}]}."""
    return (isinstance(v, dict) and "title" in v and isinstance(v.get("series"), list)
            and all(isinstance(s, dict) and "points" in s for s in v["series"]))


def is_hdr(v: Any) -> bool:
    return isinstance(v, dict) and "count" in v and ("p50" in v or "p99" in v)


def hdr_in_seconds(path: str) -> bool:
    """HDR summaries are latencies in seconds (results schema) unless their name says bytes."""
    return "bytes" not in path.rsplit(".", 1)[-1]


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _time_key(d: dict) -> str | None:
    for k in TIME_KEYS:
        if k in d:
            return k
    return None


def as_series(v: Any) -> tuple[list[float], dict[str, list[float]], str] | None:
    """(x, {name: ys}, x label) when ``v`` looks like a time series, else None."""
    if isinstance(v, dict):
        tk = _time_key(v)
        if tk and isinstance(v[tk], list) and len(v[tk]) >= 2 and all(is_number(x) for x in v[tk]):
            n = len(v[tk])
            ys = {k: [float(y) if is_number(y) else math.nan for y in vals] for k, vals in v.items()
                  if k != tk and isinstance(vals, list) and len(vals) == n and any(is_number(y) for y in vals)}
            if ys:
                return [float(x) for x in v[tk]], ys, tk
        return None
    if isinstance(v, list) and len(v) >= 2 and all(isinstance(r, dict) for r in v):
        tk = _time_key(v[0])
        if tk and all(is_number(r.get(tk)) for r in v):
            names = [k for k in v[0] if k != tk and is_number(v[0][k])]
            if names:
                return ([float(r[tk]) for r in v],
                        {k: [float(r[k]) if is_number(r.get(k)) else math.nan for r in v] for k in names}, tk)
        return None
    return None


def flatten_record(r: dict, prefix: str = "") -> dict:
    """Nested dicts become dotted keys; lists are dropped (a table cell holds one value)."""
    out: dict = {}
    for k, v in r.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_record(v, key + "."))
        elif not isinstance(v, list):
            out[key] = v
    return out


def is_table(v: Any) -> bool:
    """A list of records, or a dict of records keyed by name (e.g. one row per tier)."""
    if is_plot_spec(v) or (isinstance(v, dict) and v and all(is_plot_spec(x) for x in v.values())):
        return False
    if isinstance(v, list):
        return (len(v) >= 1 and all(isinstance(r, dict) and r for r in v) and as_series(v) is None
                and all(not is_hdr(r) for r in v) and len(flatten_record(v[0])) <= 40)
    if isinstance(v, dict) and v and not is_hdr(v) and len(v) <= 200:
        rows = list(v.values())
        if not all(isinstance(r, dict) and r and not is_hdr(r) for r in rows):
            return False
        if all(not isinstance(x, (dict, list)) for r in rows for x in r.values()):
            return True
        # Records with nested parts (e.g. gen's per-dataset throughput and verify): a table when
        # the rows look alike, so a dict of unrelated sections stays a tree.
        flat = [flatten_record(r) for r in rows]
        cols = set().union(*flat)
        return len(rows) >= 2 and len(cols) <= 40 and all(len(f) >= len(cols) / 2 for f in flat) \
            and not any(is_hdr(x) for r in rows for x in r.values())
    return False


def table_rows(v: Any) -> list[dict]:
    if isinstance(v, dict):
        return [{"name": k, **flatten_record(r)} for k, r in v.items()]
    return [flatten_record(r) for r in v]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) for every HDR summary, series, table and scalar below ``node``."""
    if is_hdr(node) or is_plot_spec(node) or as_series(node) is not None or is_table(node):
        yield path, node
        return
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, f"{path}.{k}" if path else str(k))
        return
    if isinstance(node, list):
        if all(isinstance(x, dict) for x in node):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}[{i}]")
        return
    if is_number(node) or isinstance(node, (str, bool)) or node is None:
        yield path, node


def _is_plan(node) -> bool:
    return isinstance(node, dict) and "model" in node and "outputs" in node and "inputs" in node


def without_plans(node: Any) -> Any:
    """``node`` with planner results removed (they are rendered on their own)."""
    if isinstance(node, dict):
        return {k: without_plans(v) for k, v in node.items() if not _is_plan(v)}
    if isinstance(node, list):
        return [without_plans(v) for v in node if not _is_plan(v)]
    return node


def walk_all(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) for every node, containers included."""
    if path:
        yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk_all(v, f"{path}.{k}" if path else str(k))


def plot_specs(metrics: dict) -> list[tuple[str, dict]]:
    return [(p, v) for p, v in walk(metrics) if is_plot_spec(v)]


def hdrs(metrics: dict) -> list[tuple[str, dict]]:
    return [(p, v) for p, v in walk(metrics) if is_hdr(v)]


def series(metrics: dict) -> list[tuple[str, tuple]]:
    out = []
    for p, v in walk(metrics):
        s = None if is_hdr(v) else as_series(v)
        if s is not None:
            out.append((p, s))
    return out


def tables(metrics: dict) -> list[tuple[str, list[dict]]]:
    return [(p, table_rows(v)) for p, v in walk(metrics) if is_table(v)]


def scalars(metrics: dict) -> list[tuple[str, Any]]:
    out = []
    for p, v in walk(metrics):
        if isinstance(v, str) and len(v) > 160:      # encoded histograms and the like
            v = f"({len(v)} characters, not shown)"
        if not isinstance(v, (dict, list)) and (is_number(v) or isinstance(v, (str, bool)) or v is None):
            out.append((p, v))
    return out


def flat_numbers(metrics: dict) -> dict[str, float]:
    """Every number under ``metrics`` by dotted path, HDR summaries expanded (``x.p99``)."""
    out: dict[str, float] = {}
    for p, v in walk(metrics):
        if is_hdr(v):
            for k in HDR_KEYS:
                if is_number(v.get(k)):
                    out[f"{p}.{k}"] = float(v[k])
        elif is_table(v):
            items = v.items() if isinstance(v, dict) else ((f"[{i}]", r) for i, r in enumerate(v))
            for key, r in items:
                base = f"{p}.{key}" if isinstance(v, dict) else f"{p}{key}"
                for c, x in flatten_record(r).items():
                    if is_number(x):
                        out[f"{base}.{c}"] = float(x)
        elif is_number(v):
            out[p] = float(v)
    return out


def plans(results: dict) -> list[dict]:
    """Planner results (``metrics.plan`` of `iobench plan`, or any nested ``plan``/``plans``)."""
    found = []

    def visit(node):
        if isinstance(node, dict):
            if _is_plan(node):
                found.append(node)
                return
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(results.get("metrics", {}))
    return found


def find(metrics: dict, suffix: str) -> list[tuple[str, float]]:
    """Numbers whose path ends with ``suffix`` (e.g. 'accelerator_utilization')."""
    return [(p, v) for p, v in flat_numbers(metrics).items() if p == suffix or p.endswith("." + suffix)]


def ci_pair(v) -> tuple[float, float] | None:
    """A confidence interval as (lo, hi), from [lo, hi] or {lo, hi}; None when ``v`` is not one."""
    if isinstance(v, dict):
        v = [v.get("lo", v.get("low")), v.get("hi", v.get("high"))]
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(is_number(x) for x in v):
        return float(v[0]), float(v[1])
    return None
