"""Plot-ready series in results files, so the report renders probe curves without re-measuring.

Every plot is ``{"title", "x_label", "y_label", "x_log", "y_log", "series": [{"label",
"points": [[x, y], ...]}]}`` with x and y in SI units (bytes, seconds, bytes_per_s, ...).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable


def plot(title: str, x_label: str, y_label: str, series: dict[str, list], x_log: bool = True,
         y_log: bool = False) -> dict:
    return {"title": title, "x_label": x_label, "y_label": y_label, "x_log": x_log, "y_log": y_log,
            "series": [{"label": k, "points": sorted(v)} for k, v in series.items() if v]}


def group(points: Iterable[dict], label: Callable[[dict], str | None], x: str, y: str) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for p in points:
        name = label(p)
        if name is not None and p.get(y) is not None:
            out[name].append([p[x], p[y]])
    return dict(out)
