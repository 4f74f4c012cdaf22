"""The few numbers a reader looks for first: the loads' stall (one source for the verdict and the
headline), and other commands' headline numbers pulled from any results file by their names."""

from __future__ import annotations

from dataclasses import dataclass

from . import data
from ..schema import ACCELERATOR_UTILIZATION, INTERVALS, STALL_RATIO

# Commands whose numbers are other files' numbers again (a run.json's stage summary): never a headline.
_SUMMARIES = ("run", "run (so far)")

# (suffix of a metric path, label); the first results' matches are listed in this order.
HEADLINE = (
    ("mlperf.max_accelerators_per_node", "simulated accelerators sustained per node (MLPerf Storage)"),
    (ACCELERATOR_UTILIZATION, "accelerator utilization"),
    (STALL_RATIO, "data stall"),
    ("throughput.bytes_per_s", "throughput"),
    ("throughput.samples_per_s", "samples/s"),
    ("batch_wait_s.p99", "batch wait P99"),
    ("blocking_s.mean", "checkpoint blocking (mean)"),
    ("commit_latency_s.p99", "checkpoint commit P99"),
    ("restore_s", "restore time"),
)


def _top_level(path: str) -> bool:
    # Table cells (gds cells[3], generate's per-dataset rows) are shown in their tables instead.
    return "[" not in path and path.count(".") <= 3


# Commands whose metrics are a load's: `watch` (iobench.watch, `iobench measure`: the user's own loader)
# writes the load schema too.
LOAD_COMMANDS = ("load", "watch")


def is_load(doc: dict) -> bool:
    m = doc.get("metrics") or {}
    return doc.get("command") in LOAD_COMMANDS and data.is_number(m.get(STALL_RATIO))


def stall_interval(m: dict) -> tuple[float, float] | None:
    iv = (m.get(INTERVALS) or {}).get(STALL_RATIO) if isinstance(m.get(INTERVALS), dict) else None
    if isinstance(iv, dict) and data.is_number(iv.get("low")) and data.is_number(iv.get("high")):
        return float(iv["low"]), float(iv["high"])
    return data.ci_pair(m.get(f"{STALL_RATIO}_ci95")) or data.ci_pair(m.get(f"{STALL_RATIO}_ci"))


def stall_text(m: dict) -> str:
    """"0.40% (±0.20 pp)" from a load's stall and its interval, when it has one."""
    from .format import fmt

    s = fmt(STALL_RATIO, m[STALL_RATIO])
    ci = stall_interval(m)
    if ci:
        s += f" (±{max(ci[1] - m[STALL_RATIO], m[STALL_RATIO] - ci[0]) * 100:.2f} pp)"
    return s


@dataclass(frozen=True)
class Loads:
    """The loads of a report, worst stall first: what the verdict and the headline both say."""

    docs: tuple[tuple[str, dict], ...]

    @classmethod
    def of(cls, docs: list[tuple[str, dict]]) -> Loads:
        loads = [(n, d) for n, d in docs if is_load(d)]
        return cls(tuple(sorted(loads, key=lambda x: -x[1]["metrics"][STALL_RATIO])))

    @property
    def worst(self) -> tuple[str, dict]:
        return self.docs[0][0], self.docs[0][1]["metrics"]

    @property
    def best(self) -> tuple[str, dict]:
        return self.docs[-1][0], self.docs[-1][1]["metrics"]

    def stall_line(self) -> str:
        """"data stall 12.00% (±1.00 pp) in a.json" or "data stall from X (a.json) to Y (b.json)"."""
        if len(self.docs) == 1:
            return f"data stall {stall_text(self.worst[1])} in {self.worst[0]}"
        return (f"data stall from {stall_text(self.best[1])} ({self.best[0]}) to {stall_text(self.worst[1])} "
                f"({self.worst[0]})")


def headline_rows(docs: list[tuple[str, dict]], limit: int = 30, group_size: int = 3) -> list[list[str]]:
    """Headline numbers per results file: the loads' stall as the verdict says it (``Loads``), then other
    commands' numbers by name; commands with many files get one min–max row per metric."""
    from .format import fmt

    loads = Loads.of(docs)
    rows = []
    if loads.docs:
        rows.append([f"load ({len(loads.docs)} files)" if len(loads.docs) > 1 else loads.docs[0][0],
                     "data stall (steady window, ±95% interval)", loads.stall_line().removeprefix("data stall ")])
    by_cmd: dict[str, list[tuple[str, dict]]] = {}
    for name, doc in docs:
        if doc.get("command") in _SUMMARIES or is_load(doc):
            continue
        by_cmd.setdefault(str(doc.get("command")), []).append((name, doc))
    for cmd, members in by_cmd.items():
        if len(members) > group_size:
            for suffix, label in HEADLINE:
                vals = [(v, p) for _, d in members for p, v in data.find(d.get("metrics", {}) or {}, suffix)
                        if _top_level(p)]
                if vals:
                    lo, hi = min(vals), max(vals)
                    rows.append([f"{cmd} ({len(members)} files)", f"{label} ({lo[1]}), min – max",
                                 f"{fmt(lo[1], lo[0])} – {fmt(hi[1], hi[0])}"])
            continue
        for name, doc in members:
            metrics = doc.get("metrics", {}) or {}
            for suffix, label in HEADLINE:
                for path, v in [x for x in data.find(metrics, suffix) if _top_level(x[0])][:2]:
                    rows.append([name, f"{label} ({path})", fmt(path, v)])
    return rows[:limit]
