"""Parsing and formatting of sizes and durations given by users."""

from __future__ import annotations

import re

from .errors import ConfigError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def parse_size(value: str | int | float, field: str = "size") -> int:
    """'64MiB' -> 67108864; plain numbers are bytes. Rejects zero and negatives."""
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a size, got {value!r}", "use e.g. 64MiB or 1000000")
    if isinstance(value, (int, float)):
        n = int(value)
    else:
        m = re.fullmatch(_NUM + r"\s*([a-zA-Z]*)", str(value).strip())
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ConfigError(field, f"cannot read {value!r} as a size", "use e.g. 4KiB, 64MiB, 1GB")
        n = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    if n <= 0:
        raise ConfigError(field, f"must be positive, got {value!r}", "give a size above zero")
    return n


def parse_duration(value: str | int | float, field: str = "duration", allow_zero: bool = True) -> float:
    """'250ms' -> 0.25 seconds; plain numbers are seconds."""
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a duration, got {value!r}", "use e.g. 250ms or 2s")
    if isinstance(value, (int, float)):
        s = float(value)
    else:
        m = re.fullmatch(_NUM + r"\s*([a-zA-Z]*)", str(value).strip())
        if not m or m.group(2).lower() not in _TIME_UNITS | {"": 1.0}:
            raise ConfigError(field, f"cannot read {value!r} as a duration", "use e.g. 250ms, 2s, 1.5min")
        s = float(m.group(1)) * ({"": 1.0} | _TIME_UNITS)[m.group(2).lower()]
    if s < 0 or (s == 0 and not allow_zero):
        raise ConfigError(field, f"must be {'positive' if not allow_zero else 'zero or more'}, got {value!r}",
                          "give a non-negative duration")
    return s


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_rate(bytes_per_s: float) -> str:
    return format_bytes(bytes_per_s) + "/s"


def format_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def format_duration(s: float) -> str:
    """Seconds, with minutes, hours or days beside them once they are long (plans, intervals)."""
    if s >= 86400 * 2:
        return f"{format_seconds(s)} ({s / 86400:.1f} days)"
    if s >= 7200:
        return f"{format_seconds(s)} ({s / 3600:.1f} h)"
    if s >= 120:
        return f"{format_seconds(s)} ({s / 60:.1f} min)"
    return format_seconds(s)
