"""What every benchmark shares: the machine it ran on, paired alternating rounds, ratios.

Measurement rule 8 ("ratios, same run", docs/design.md): on a shared machine absolute times
are noise, so iobench and its peer run in the same rounds, in alternating order (A B, B A, ...:
a drift in the machine's load favours neither), and each round gives one ratio; a row reports
the median of them.
"""

from __future__ import annotations

import os
import statistics
from typing import Callable

from iobench.results import host_info

SHARED = "a shared 2-core VM: other work ran while measuring, so only same-run ratios are meaningful"


def machine(**extra) -> dict:
    """The host (``iobench.results.host_info``, as every results file records it), its load average
    now, and the note that it was shared; ``extra`` adds a benchmark's own facts."""
    info = host_info()
    info.pop("hostname", None)
    return {**info, "load_avg_at_start": [round(x, 2) for x in os.getloadavg()], "note": SHARED, **extra}


def alternating(rounds: int, sides: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run every side once per round, the order reversed every other round; each side's values."""
    names = list(sides)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            out[n].append(sides[n]())
    return out


def median_ratio(ours: list[float], peer: list[float]) -> float | None:
    """The median of the per-round ratios ours / peer (None without a usable round)."""
    ratios = [a / b for a, b in zip(ours, peer) if b]
    return statistics.median(ratios) if ratios else None
