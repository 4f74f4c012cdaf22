"""Two runs side by side: every number of A and B by metric path, with the difference and ratio."""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import data

# Metric path suffixes where a larger value is better / worse, for regression checks.
HIGHER_IS_BETTER = ("bytes_per_s", "samples_per_s", "accelerator_utilization")
LOWER_IS_BETTER = ("stall_ratio",)


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
            if name == "stall_ratio" and data.is_number(metrics.get("accelerator_utilization")):
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
    paths = [p for p in dict.fromkeys([*fa, *fb]) if not p.startswith("intervals.") and not any(p.startswith(c) for c in
                                                           (*(f"{k}_ci" for k in ia), *(f"{k}_ci" for k in ib)))]
    return [Row(p, fa.get(p), fb.get(p), ia.get(p), ib.get(p)) for p in paths]


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


def _interval(by_path: dict, path: str, side: str) -> tuple[float, float] | None:
    """The 95% interval a load recorded for ``...stall_ratio`` (``...intervals.stall_ratio.low/high``)."""
    stem = path[: -len("stall_ratio")]
    lo, hi = by_path.get(f"{stem}intervals.stall_ratio.low"), by_path.get(f"{stem}intervals.stall_ratio.high")
    if lo is None or hi is None:
        return None
    lo, hi = getattr(lo, side), getattr(hi, side)
    return None if lo is None or hi is None else (lo, hi)


def regressions(rows: list[Row], max_regression: float) -> list[dict]:
    """Checks on metrics where B is worse than A by more than ``max_regression`` (a fraction).

    A stall ratio that carries its confidence interval in both runs (a load's
    ``intervals.stall_ratio``) is a regression only when B's interval lies wholly above A's
    by more than ``max_regression`` points: two runs that agree within their intervals agree.
    """
    by_path = {r.path: r for r in rows}
    out = []
    for r in rows:
        if r.a is None or r.b is None or r.within_noise:
            continue
        if r.path.endswith(HIGHER_IS_BETTER) and r.a > 0:
            ok = r.b >= r.a * (1 - max_regression)
            out.append({"check": f"no drop > {max_regression:.0%}", "path": r.path, "value": r.b, "ok": ok,
                        "results": "B"})
        elif r.path.endswith(LOWER_IS_BETTER):
            ia, ib = _interval(by_path, r.path, "a"), _interval(by_path, r.path, "b")
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


def markdown(rows: list[Row], name_a: str, name_b: str, checks: list[dict]) -> str:
    from .format import check_line

    lines = [f"# iobench compare: {name_a} vs {name_b}", "",
             f"| metric | A: {name_a} | B: {name_b} | change (B − A) | B / A |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.path} | {with_ci(r.path, r.a, r.ci_a)} | {with_ci(r.path, r.b, r.ci_b)} | "
                     f"{change(r)} | {'-' if r.ratio is None else f'{r.ratio:.3f}×'} |")
    if checks:
        lines += ["", *(f"- {check_line(c)}" for c in checks)]
    return "\n".join(lines) + "\n"
