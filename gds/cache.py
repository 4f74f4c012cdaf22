"""Page-cache state of one file: declared, set (fadvise DONTNEED / pre-read) and verified (mincore)."""

from __future__ import annotations

from iobench.cache import set_file_state


def prepare(path: str, state: str) -> dict:
    """Put ``path`` in cache ``state`` ('cold' | 'warm') and measure what that achieved."""
    if state not in ("cold", "warm"):
        raise ValueError(f"unknown cache state {state!r}")
    r = set_file_state(path, state)
    out: dict = {"declared": state, "resident_ratio": r}
    if r is None:
        out.update(verified=False, note="mincore unavailable: residency unknown")
    elif state == "cold":
        out["verified"] = r <= 0.05
        if not out["verified"]:
            out["note"] = (f"{r:.0%} of the file stayed in memory after DONTNEED "
                           "(tmpfs, or pages pinned elsewhere): these are not cold-cache numbers")
    else:
        out["verified"] = r >= 0.95
        if not out["verified"]:
            out["note"] = f"only {r:.0%} of the file is resident after pre-reading (memory pressure)"
    return out
