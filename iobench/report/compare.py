"""Two runs side by side: every measured number of A and B by metric path, with the difference.

What a person reads (``iobench compare``): the verdict first, then only the metrics whose
difference is beyond both runs' intervals (``Row.beyond_noise``), then the headline metrics
that carry no interval and changed by more than 5% (``Row.unjudged_change``).  Identifiers
(pids, worker and rank numbers), settings and raw series are never compared (``is_measurement``);
two runs of different setups (format, access, cache, step time) are refused (``setup_differences``).
"""

from __future__ import annotations

from ..schema import STALL_RATIO
import math
import re
from dataclasses import dataclass

from . import data
from ..schema import ACCELERATOR_UTILIZATION, BYTES_PER_S, SAMPLES_PER_S

# Metric path suffixes where a larger value is better / worse, for regression checks.
HIGHER_IS_BETTER = (BYTES_PER_S, SAMPLES_PER_S, ACCELERATOR_UTILIZATION)
LOWER_IS_BETTER = (STALL_RATIO,)
UNJUDGED_SHOWN = 0.05     # a headline number without an interval is shown when it moved by more than this

# Names of numbers that identify or configure, not measure: never compared (a pid differs every run).
_IDENTIFIER = re.compile(r"pid|worker|rank|pass|server_instance|seed|port|id|\w+_id|from_step|to_step|slots|slot_bytes"
                         r"|steps_planned|epochs_planned|first_step_excluded|shards|cpu_count|memory_bytes")
# Containers of raw samples or settings: their numbers are inputs, not results.
_CONTAINERS = {"series", "steady_window", "stability", "config", "mlperf_steps", "intervals"}


def is_measurement(path: str) -> bool:
    """True for a number a run measured; False for ids, settings and raw series."""
    parts = re.sub(r"\[\d+\]", "", path).split(".")
    if len(parts) > 1 and parts[-1] in data.HDR_KEYS:      # batch_wait_s.p99: judged by batch_wait_s
        parts = parts[:-1]
    return not _CONTAINERS.intersection(parts) and not _IDENTIFIER.fullmatch(parts[-1])


@dataclass(frozen=True)
class Row:
    path: str
    a: float | None
    b: float | None
    ci_a: tuple[float, float] | None = None   # the run's own confidence interval, where it has one
    ci_b: tuple[float, float] | None = None

    @property
    def within_noise(self) -> bool:
        """True when the runs' intervals overlap: the difference is not evidence of a change."""
        if self.a is None or self.b is None:
            return False
        if self.a == self.b:
            return True
        lo_a, hi_a = self.ci_a or (self.a, self.a)
        lo_b, hi_b = self.ci_b or (self.b, self.b)
        if self.ci_a is None and self.ci_b is None:
            return False
        return lo_a <= hi_b and lo_b <= hi_a

    @property
    def beyond_noise(self) -> bool:
        """Both runs carry an interval and the intervals do not overlap: a real difference."""
        return self.ci_a is not None and self.ci_b is not None and self.a is not None and self.b is not None \
            and not self.within_noise

    @property
    def judged(self) -> bool:
        """A number whose direction is good or bad (a rate, the stall, AU, a P99)."""
        return self.path.endswith((*HIGHER_IS_BETTER, *LOWER_IS_BETTER, ".p99"))

    @property
    def unjudged_change(self) -> bool:
        """A judged number without an interval on both sides that moved by more than UNJUDGED_SHOWN."""
        if self.ci_a is not None and self.ci_b is not None or not self.judged or self.a is None or self.b is None:
            return False
        scale = max(abs(self.a), abs(self.b))
        return scale > 0 and abs(self.b - self.a) / scale > UNJUDGED_SHOWN

    @property
    def diff(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def ratio(self) -> float | None:
        return None if self.a in (None, 0) or self.b is None else self.b / self.a

    def to_dict(self) -> dict:
        return {"path": self.path, "a": self.a, "b": self.b, "diff": self.diff, "ratio": self.ratio,
                # a P99 with no upper bound yet carries inf: JSON has no inf, it is written null
                "ci_a": _finite(self.ci_a), "ci_b": _finite(self.ci_b),
                "within_noise": self.within_noise}


def _finite(ci: tuple[float, float] | None) -> list | None:
    return [v if math.isfinite(v) else None for v in ci] if ci else None


_CI_SUFFIXES = ("_ci95", "_ci")


def intervals(metrics: dict, prefix: str = "") -> dict[str, tuple[float, float]]:
    """Confidence intervals a results file carries, by the path of the number they bound:
    ``stall_ratio_ci95: [lo, hi]`` (or ``_ci``) bounds ``stall_ratio``; ``{value|mean, ci95|ci}``
    bounds ``<path>.value`` / ``<path>.mean``."""
    out: dict[str, tuple[float, float]] = {}
    if not isinstance(metrics, dict):
        return out
    # the loader's block: intervals.stall_ratio, intervals.batch_wait_p99_s -> batch_wait_s.p99
    for name, iv in (metrics.get("intervals") or {}).items() if isinstance(metrics.get("intervals"), dict) else ():
        if isinstance(iv, dict) and data.is_number(iv.get("low")):
            high = iv["high"] if data.is_number(iv.get("high")) else float("inf")  # no upper bound yet
            base = f"{name[: -len('_p99_s')]}_s.p99" if name.endswith("_p99_s") else name
            out[f"{prefix}{base}"] = (float(iv["low"]), float(high))
            if name == STALL_RATIO and data.is_number(metrics.get("accelerator_utilization")):
                # the loader's steady AU is 1 − its steady stall (same window), so the stall's interval bounds it
                out[f"{prefix}accelerator_utilization"] = (1.0 - float(high), 1.0 - float(iv["low"]))
    for k, v in metrics.items():
        path = f"{prefix}{k}"
        if isinstance(k, str) and k.endswith(_CI_SUFFIXES) and data.ci_pair(v):
            out[path[: path.rindex("_ci")]] = data.ci_pair(v)
        elif isinstance(v, dict):
            for key in ("ci95", "ci"):
                if data.ci_pair(v.get(key)):
                    for base in ("value", "mean", "ratio"):
                        if data.is_number(v.get(base)):
                            out[f"{path}.{base}"] = data.ci_pair(v[key])
            out.update(intervals(v, path + "."))
        elif isinstance(v, list):  # rows of a table (probe points, gds cells): paths as flat_numbers names them
            for i, row in enumerate(v):
                if isinstance(row, dict):
                    out.update(intervals(row, f"{path}[{i}]."))
    return out


def compare(a: dict, b: dict) -> list[Row]:
    ma, mb = a.get("metrics", {}) or {}, b.get("metrics", {}) or {}
    fa, fb = data.flat_numbers(ma), data.flat_numbers(mb)
    ia, ib = intervals(ma), intervals(mb)
    # the intervals are shown beside the numbers they bound, not as rows of their own
    paths = [p for p in dict.fromkeys([*fa, *fb]) if is_measurement(p)
             and not any(p.startswith(c) for c in (*(f"{k}_ci" for k in ia), *(f"{k}_ci" for k in ib)))]
    return [Row(p, fa.get(p), fb.get(p), ia.get(p), ib.get(p)) for p in paths]


def setup(doc: dict) -> dict[str, str]:
    """What must match for two results to be compared: dataset format, access, cache, step time."""
    env, cfg, m = doc.get("environment") or {}, doc.get("config") or {}, doc.get("metrics") or {}
    loader = env.get("loader") or {}
    cache = env.get("cache")
    compute = loader.get("compute") or {}
    out = {"format": (env.get("dataset") or {}).get("format") or cfg.get("format"),
           "access": loader.get("access") or m.get("access"),
           "cache": (cache.get("declared") if isinstance(cache, dict) else cache) or cfg.get("cache"),
           "step time": compute.get("nominal_s") if isinstance(compute, dict) and compute.get("nominal_s") is not None
           else cfg.get("compute", cfg.get("step_s"))}
    return {k: str(v) for k, v in out.items() if v not in (None, "")}


def setup_differences(docs_a: list[tuple[str, dict]], docs_b: list[tuple[str, dict]]) -> list[str]:
    """'name: format webdataset vs parquet' for each paired file whose setups differ."""
    single = len(docs_a) == 1 and len(docs_b) == 1
    by_name = {n: d for n, d in docs_b[1:]} if not single else {}
    pairs = [(docs_a[0][0], docs_a[0][1], docs_b[0][1])] if single else \
        [(n, d, by_name[n]) for n, d in docs_a[1:] if n in by_name]
    out = []
    for name, a, b in pairs:
        sa, sb = setup(a), setup(b)
        diffs = [f"{k} {sa[k]} vs {sb[k]}" for k in sa if k in sb and sa[k] != sb[k]]
        if a.get("command") != b.get("command"):
            # a load against a verify shares a throughput metric, not a meaning: "B matches A" would be false
            diffs.insert(0, f"command {a.get('command')} vs {b.get('command')}")
        if diffs:
            out.append(f"{name}: {', '.join(diffs)}")
    return out


def compare_runs(docs_a: list[tuple[str, dict]], docs_b: list[tuple[str, dict]]) -> list[Row]:
    """``compare`` for inputs that bring several results files (a run.json and its stage files):
    files are paired by name, and each metric path starts with the file's name."""
    if len(docs_a) == 1 and len(docs_b) == 1:
        return compare(docs_a[0][1], docs_b[0][1])

    def merged(docs):
        # The run.json itself is named by its own path, which differs between runs: call it "run".
        return {"metrics": {("run" if i == 0 else name): d.get("metrics", {}) or {}
                            for i, (name, d) in enumerate(docs)}}

    return compare(merged(docs_a), merged(docs_b))


def regressions(rows: list[Row], max_regression: float) -> list[dict]:
    """Checks on metrics where B is worse than A by more than ``max_regression`` (a fraction).

    A stall ratio that carries its confidence interval in both runs (a load's
    ``intervals.stall_ratio``) is a regression only when B's interval lies wholly above A's
    by more than ``max_regression`` points: two runs that agree within their intervals agree.
    """
    out = []
    for r in rows:
        if r.a is None or r.b is None or r.within_noise:
            continue
        if r.path.endswith(HIGHER_IS_BETTER) and r.a > 0:
            ok = r.b >= r.a * (1 - max_regression)
            out.append({"check": f"no drop > {max_regression:.0%}", "path": r.path, "value": r.b, "ok": ok,
                        "results": "B"})
        elif r.path.endswith(LOWER_IS_BETTER):
            ia, ib = r.ci_a, r.ci_b
            if ia is not None and ib is not None:
                ok = ib[0] <= ia[1] + max_regression
                out.append({"check": f"95% intervals overlap, or rise <= {max_regression:.0%} points", "path": r.path,
                            "value": r.b, "ok": ok, "results": "B", "interval_a": ia, "interval_b": ib})
                continue
            ok = r.b <= r.a + max_regression
            out.append({"check": f"no rise > {max_regression:.0%} points", "path": r.path, "value": r.b, "ok": ok,
                        "results": "B"})
    return out


def with_ci(path: str, v: float | None, ci: tuple[float, float] | None) -> str:
    from .format import fmt

    if v is None:
        return "-"
    if ci is None:
        return fmt(path, v)
    hi = "no upper bound yet" if ci[1] == float("inf") else fmt(path, ci[1])
    return f"{fmt(path, v)} [{fmt(path, ci[0])}, {hi}]"


def change(r: Row) -> str:
    """B − A in the metric's unit, signed; "within noise" when the runs' intervals overlap."""
    from .format import fmt

    if r.diff is None:
        return "-"
    if r.diff == 0:
        return "0"
    text = ("+" if r.diff > 0 else "−") + fmt(r.path, abs(r.diff))
    if r.path.endswith("_ratio") or r.path.endswith("utilization"):
        text = text.replace("%", " pp")
    return text + (" (within noise)" if r.within_noise else "")


def markdown(rows: list[Row], name_a: str, name_b: str, checks: list[dict], gated: bool = False) -> str:
    from .format import check_line

    lines = [f"# iobench compare: {name_a} vs {name_b}", "", f"**{verdict(rows, checks, gated)}**", "",
             f"| metric | A: {name_a} | B: {name_b} | change (B − A) | B / A |", "|---|---|---|---|---|"]
    for r in shown(rows):
        lines.append(f"| {r.path} | {with_ci(r.path, r.a, r.ci_a)} | {with_ci(r.path, r.b, r.ci_b)} | "
                     f"{change(r)} | {ratio_text(r)} |")
    if checks:
        lines += ["", *(f"- {check_line(c)}" for c in checks)]
    return "\n".join(lines) + "\n"


def shown(rows: list[Row], everything: bool = False) -> list[Row]:
    """The rows a person reads: beyond both intervals first, then judged numbers without one that moved."""
    if everything:
        return rows
    return [r for r in rows if r.beyond_noise] + [r for r in rows if r.unjudged_change]


def ratio_text(r: Row) -> str:
    """B / A where it means something (a ratio of a number near zero, 5111807×, does not)."""
    ratio = r.ratio
    if ratio is None or not 0.01 <= abs(ratio) <= 100:
        return "-"
    return f"{ratio:.3f}×"


def verdict(rows: list[Row], checks: list[dict], gated: bool = False) -> str:
    """The line a person acts on: the checks' result (``gated``: thresholds or --max-regression were
    given, so no check made is a pass), then what differs beyond the runs' noise."""
    from .format import fmt

    failed = [c for c in checks if not c["ok"]]
    beyond = [r for r in rows if r.beyond_noise]
    judged = sum(1 for r in rows if r.ci_a is not None and r.ci_b is not None)
    if failed:
        worst = failed[0]
        head = f"REGRESSION: {len(failed)} of {len(checks)} checks failed (first: {worst['path']} = " \
               f"{fmt(worst['path'], worst['value'])})"
    elif checks or gated:
        head = f"PASS: {len(checks)} of {len(checks)} checks passed"
    else:
        head = "B differs from A" if beyond else "B matches A"
    if beyond:
        names = ", ".join(f"{r.path} {change(r)}" for r in beyond[:3])
        tail = f"{len(beyond)} of {judged} metrics with intervals differ beyond both runs' noise ({names}" \
               + (", ..." if len(beyond) > 3 else "") + ")"
    else:
        tail = f"no metric differs beyond both runs' intervals ({judged} with intervals)"
    return f"{head}; {tail}."
