"""Parsing and formatting of sizes and durations given by users."""

from __future__ import annotations

import math
import re

from .errors import ConfigError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


MAX_DURATION_S = 7 * 86400.0   # longer than any benchmark or emulated wait: a typo, not a plan
MAX_SIZE = 1 << 60             # 1 EiB: past any storage this tool measures (and past int64 offsets)


def _finite(field: str, x: float, value, what: str) -> None:
    if not math.isfinite(x):
        raise ConfigError(field, f"{value!r} is not a finite {what}", f"give a {what} such as "
                          + ("250ms" if what == "duration" else "64MiB"))


def parse_size(value: str | int | float, field: str = "size", max_bytes: int = MAX_SIZE) -> int:
    """'64MiB' -> 67108864; plain numbers are bytes. Rejects zero, negatives, NaN/inf and more than
    ``max_bytes`` (1 EiB unless the caller knows the resource, e.g. memory)."""
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a size, got {value!r}", "use e.g. 64MiB or 1000000")
    if isinstance(value, (int, float)):
        _finite(field, float(value), value, "size")
        x = float(value)
    else:
        m = re.fullmatch(_NUM + r"\s*([a-zA-Z]*)", str(value).strip())
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ConfigError(field, f"cannot read {value!r} as a size", "use e.g. 4KiB, 64MiB, 1GB")
        x = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
        _finite(field, x, value, "size")
    if x > max_bytes:
        cap = "1 EiB" if max_bytes == MAX_SIZE else format_bytes(max_bytes)
        raise ConfigError(field, f"{value!r} is more than {cap}", f"give at most {cap}")
    n = int(x)
    if n <= 0:
        raise ConfigError(field, f"must be positive, got {value!r}", "give a size above zero")
    return n


def parse_duration(value: str | int | float, field: str = "duration", allow_zero: bool = True,
                   max_s: float = MAX_DURATION_S, bare_unit: str | None = None) -> float:
    """'250ms' -> 0.25 seconds.  A number given as text needs its unit ("180" could be 180 ms or
    180 s: refused, "give a unit: 180ms"), except 0 and where the format defines one
    (``bare_unit``, e.g. a step-time file of seconds); a number value (YAML, the Python API) is
    seconds.  Refused too: negatives, NaN/inf, and more than ``max_s`` (7 days)."""
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a duration, got {value!r}", "use e.g. 250ms or 2s")
    if isinstance(value, (int, float)):
        s = float(value)
    else:
        text = str(value).strip()
        m = re.fullmatch(_NUM + r"\s*([a-zA-Z]*)", text)
        if m and not m.group(2) and float(m.group(1)) != 0:
            if bare_unit is None:
                raise ConfigError(field, f"{text!r} has no unit", f"give a unit: {text}ms or {text}s")
            text += bare_unit
            m = re.fullmatch(_NUM + r"\s*([a-zA-Z]*)", text)
        if not m or m.group(2).lower() not in _TIME_UNITS | {"": 1.0}:
            raise ConfigError(field, f"cannot read {value!r} as a duration", "use e.g. 250ms, 2s, 1.5min")
        s = float(m.group(1)) * ({"": 1.0} | _TIME_UNITS)[m.group(2).lower()]
    _finite(field, s, value, "duration")
    if s < 0 or (s == 0 and not allow_zero):
        raise ConfigError(field, f"must be {'positive' if not allow_zero else 'zero or more'}, got {value!r}",
                          "give a non-negative duration")
    if s > max_s:
        cap = f"{max_s / 86400:g} days" if max_s >= 86400 else format_seconds(max_s)
        raise ConfigError(field, f"{value!r} is longer than {cap}", f"give at most {cap}")
    return s


def parse_rate(value: str | int | float, field: str = "rate", max_bytes_per_s: int = MAX_SIZE) -> float:
    """Bytes per second from ``bw:RATE`` / ``RATE`` with a size unit (``/s`` optional): '200MB',
    '1GiB/s', 'bw:500MB/s'.  A bare number is refused ("give a unit: 200MB/s"); a number value
    (YAML, the Python API) is bytes per second."""
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a rate, got {value!r}", "use e.g. 500MB/s")
    if isinstance(value, (int, float)):
        return float(parse_size(value, field, max_bytes_per_s))
    body = str(value).strip()
    if body.lower().startswith("bw:"):
        body = body[3:].strip()
    if body.lower().endswith("/s"):
        body = body[:-2].strip()
    m = re.fullmatch(_NUM + r"\s*([a-zA-Z]*)", body)
    if m and not m.group(2) and float(m.group(1)) != 0:
        raise ConfigError(field, f"{value!r} has no unit", f"give a unit: {body}MB/s or {body}MiB/s")
    return float(parse_size(body, field, max_bytes_per_s))


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
