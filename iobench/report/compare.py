"""Two runs side by side: every number of A and B by metric path, with the difference and ratio."""

from __future__ import annotations

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

    @property
    def diff(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def ratio(self) -> float | None:
        return None if self.a in (None, 0) or self.b is None else self.b / self.a

    def to_dict(self) -> dict:
        return {"path": self.path, "a": self.a, "b": self.b, "diff": self.diff, "ratio": self.ratio}


def compare(a: dict, b: dict) -> list[Row]:
    fa, fb = data.flat_numbers(a.get("metrics", {}) or {}), data.flat_numbers(b.get("metrics", {}) or {})
    paths = list(dict.fromkeys([*fa, *fb]))
    return [Row(p, fa.get(p), fb.get(p)) for p in paths]


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
        if r.a is None or r.b is None:
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


def markdown(rows: list[Row], name_a: str, name_b: str, checks: list[dict]) -> str:
    from .html import fmt

    lines = [f"# iobench compare: {name_a} vs {name_b}", "", f"| metric | A: {name_a} | B: {name_b} | B − A | B / A |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.path} | {'-' if r.a is None else fmt(r.path, r.a)} | "
                     f"{'-' if r.b is None else fmt(r.path, r.b)} | "
                     f"{'-' if r.diff is None else f'{r.diff:+.4g}'} | {'-' if r.ratio is None else f'{r.ratio:.3f}×'} |")
    if checks:
        lines += ["", "| check | metric | value | result |", "|---|---|---|---|"]
        lines += [f"| {c['check']} | {c['path']} | {c['value']} | {'pass' if c['ok'] else '**FAIL**'} |" for c in checks]
    return "\n".join(lines) + "\n"
