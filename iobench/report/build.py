"""Build a report directory (report.html + report.md) from results files, and check thresholds."""

from __future__ import annotations

from ..schema import STALL_RATIO
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import data

# Threshold flags: name -> (metric path suffix, comparison, label)
THRESHOLDS = {
    "min_au": ("accelerator_utilization", ">=", "accelerator utilization ≥"),
    "max_stall": (STALL_RATIO, "<=", "data stall ≤"),
    "min_throughput": ("throughput.bytes_per_s", ">=", "throughput ≥"),
    "max_wait_p99": ("batch_wait_s.p99", "<=", "batch wait P99 ≤"),
}


@dataclass
class Report:
    html: Path
    markdown: Path
    checks: list[dict] = field(default_factory=list)
    verdict: str = ""       # the line a reader acts on: printed first by the commands, atop both pages
    plots: bool = True      # False: matplotlib is not installed (or --no-plots), the pages have no plots

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks)


def load(paths, expand_runs: bool = True) -> list[tuple[str, dict]]:
    """(name, results) per file; a run.json brings the stage results files it lists."""
    from ..results import read_results

    docs, seen = [], set()
    for p in paths:
        if isinstance(p, tuple):
            docs.append(p)
            continue
        path = Path(p)
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        doc = read_results(path)
        docs.append((path.name if path.name != "run.json" else str(path), doc))
        if expand_runs and doc.get("command") == "run":
            for f in (doc.get("environment") or {}).get("results_files") or []:
                fp = Path(f)
                # `iobench run` records them relative to its own folder (so a copied or moved run
                # still finds its own files, not those of a later run at the old path); older runs
                # recorded them as the run saw them.
                for cand in (path.parent / fp, fp, path.parent / fp.name):
                    if cand.exists() and cand.resolve() not in seen:
                        seen.add(cand.resolve())
                        docs.append((_rel(path.parent, cand), read_results(cand)))
                        break
    return docs


def _rel(root: Path, p: Path) -> str:
    try:
        return str(p.resolve().relative_to(root.resolve()))
    except ValueError:
        return p.name


def check(docs: list[tuple[str, dict]], limits: dict[str, float | None]) -> list[dict]:
    """One row per (limit, matching metric); a limit that matches no metric at all fails."""
    out = []
    for name, limit in limits.items():
        if limit is None:
            continue
        suffix, op, label = THRESHOLDS[name]
        from .format import fmt

        text = f"{label} {fmt(suffix, float(limit))}"
        found = [(n, d, p, v) for n, d in docs for p, v in data.find(d.get("metrics", {}) or {}, suffix)]
        if not found:
            out.append({"check": text, "path": f"(no metric ending in {suffix})", "value": None,
                        "ok": False, "results": ""})
        for n, d, p, v in found:
            ok = v >= limit if op == ">=" else v <= limit
            out.append({"check": text, "path": p, "value": v, "ok": ok, "results": n, "where": where(n, d, p)})
    return out


def where(name: str, doc: dict, path: str) -> str:
    """What a check judged, in words a CI log reader can act on: the results file, its command,
    the dataset (or target) it measured and the rank when the value is one rank's."""
    cfg = doc.get("config") or {}
    parts = [name, str(doc.get("command") or "?")]
    target = cfg.get("dataset") or cfg.get("url") or cfg.get("target") or cfg.get("durable")
    if target:
        parts.append(f"dataset {target}" if cfg.get("dataset") else str(target))
    import re

    m = re.search(r"per_rank\.\[?(\d+)\]?", path)
    if m:
        parts.append(f"rank {m.group(1)}")
    elif (doc.get("world") or {}).get("size", 1) > 1:
        parts.append(f"{doc['world']['size']} ranks")
    return " · ".join(parts)


def build_report(inputs, out_dir: str | os.PathLike, title: str = "iobench report",
                 limits: dict[str, float | None] | None = None, plots: bool | None = None) -> Report:
    """report.html and report.md in ``out_dir``; ``plots`` None: drawn where matplotlib is installed."""
    from ..extras import require
    from ..io.atomic import atomic_write_bytes
    from ..results import now_iso
    from . import html, markdown

    if plots is None:
        plots = has_plots()
    elif plots:
        require("matplotlib", "report plots")  # asked for: before any work, not as a per-plot failure
    docs = load(inputs)
    checks = check(docs, limits or {})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    when = now_iso()
    page = html.render(docs, title, checks, when, plots=plots)
    md = markdown.render(docs, title, checks, when)
    text, _ = html.verdict(docs, checks)
    hp, mp = out / "report.html", out / "report.md"
    atomic_write_bytes(hp, page.encode("utf-8"), fsync=False)
    atomic_write_bytes(mp, md.encode("utf-8"), fsync=False)
    return Report(hp, mp, checks, text, plots)


def has_plots() -> bool:
    """matplotlib is installed (the `report` extra): without it the report has its tables, no plots."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
