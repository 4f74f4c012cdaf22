"""Frozen, validated configuration objects built from YAML workloads, flags and --set overrides.

A config section is a frozen dataclass.  ``build(cls, mapping, section)`` rejects unknown
keys (naming the nearest valid one), converts simple types, and lets the class's
``__post_init__`` check values, raising ``ConfigError`` with the field's dotted name.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, TypeVar

from .errors import ConfigError

T = TypeVar("T")


def nearest(name: str, choices) -> str:
    """A hint naming the closest valid choice, or listing them when none is close."""
    choices = sorted(choices)
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    if close:
        return f"did you mean '{close[0]}'?"
    return "valid: " + ", ".join(choices)


def check_choice(field: str, value: str, choices) -> str:
    if value not in choices:
        raise ConfigError(field, f"unknown value {value!r}", nearest(str(value), choices))
    return value


def _convert(field: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # Optional[X]: X's own error names the field and the fix
            return _convert(field, value, options[0])
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(field, value, a)
            except ConfigError:
                continue
        raise ConfigError(field, f"cannot use {value!r}", f"expected {tp}")
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(field, f"expected a list, got {value!r}", "give a YAML list or comma-separated values")
        inner = args[0] if args else Any
        return tuple(_convert(field, v, inner) for v in value)
    if tp is dict or origin is dict:   # (storage_options: a string here reached fsspec as **kwargs)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ConfigError(field, f"expected a mapping, got {value!r}", "give key: value pairs")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(field, f"expected a mapping, got {value!r}", "give key: value pairs")
        return build(typing.cast(type, tp), value, field)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise ConfigError(field, f"expected true or false, got {value!r}", "use true/false")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(field, f"expected an integer, got {value!r}", "give a whole number")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(field, f"expected an integer, got {value!r}", "give a whole number") from None
        if not math.isfinite(f) or f != int(f):
            raise ConfigError(field, f"expected an integer, got {value!r}", "give a whole number")
        if abs(f) > 2**63 - 1:   # past any count; beyond int64 numpy and the OS overflow
            raise ConfigError(field, f"{value!r} is too large", "give a number below 2**63")
        return int(f)
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(field, f"expected a number, got {value!r}", "give a number")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(field, f"expected a number, got {value!r}", "give a number") from None
        if not math.isfinite(f):
            raise ConfigError(field, f"{value!r} is not a finite number", "give a number")
        return f
    if tp is str:
        if value is None:
            return ""   # YAML `key:` or `key: null` is "not given", never the string "None" (a directory named None)
        if isinstance(value, (dict, list)):
            raise ConfigError(field, f"expected a string, got {value!r}", "give a single value")
        return str(value)
    return value


def build(cls: type[T], mapping: Mapping[str, Any] | None, section: str = "") -> T:
    """Build the frozen dataclass ``cls`` from ``mapping``; unknown keys are an error."""
    mapping = dict(mapping or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(typing.cast(Any, cls)) if f.init}
    kwargs = {}
    for key, value in mapping.items():
        key_n = str(key).replace("-", "_")
        dotted = f"{section}.{key}" if section else str(key)
        if key_n not in fields:
            raise ConfigError(dotted, "unknown key", nearest(key_n, fields))
        kwargs[key_n] = _convert(dotted, value, hints[key_n])
    for name, f in fields.items():   # named here, not as "__init__() missing 1 required positional argument"
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            dotted = f"{section}.{name}" if section else name
            raise ConfigError(dotted, "is missing", f"add {name}: VALUE" + (f" to {section}" if section else ""))
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as e:
        raise ConfigError(section or cls.__name__, str(e), "check the required keys") from e


def parse_set(items: list[str] | None) -> dict:
    """['a.b=1', 'c=x'] -> {'a': {'b': 1}, 'c': 'x'}; values are parsed as YAML scalars."""
    out: dict = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError("--set", f"{item!r} is not key=value", "use --set section.key=value")
        key, raw = item.split("=", 1)
        if not key.strip():
            raise ConfigError("--set", f"{item!r} has an empty key", "use --set section.key=value")
        import yaml   # here, not at the top: most commands parse no YAML (~20 ms of start-up)

        from .io.inputs import loads_yaml

        try:
            value = loads_yaml(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError("--set", f"{key!r} conflicts with another override", "set each key once")
        node[parts[-1]] = value
    return out


def set_overrides(items: list[str] | None, sections, command: str) -> dict:
    """``--set SECTION.KEY=VALUE`` values, by section, for a command that reads ``sections``.

    A section the command does not read is refused (exit 2) before any work: a key that
    silently never reaches the code (``--set laod.workers=4``) is the config trap DLIO users
    fall into.  Keys inside a section are checked when the section is built (``build``).
    """
    sections = tuple(sections)
    overrides = parse_set(items)
    for key, value in overrides.items():
        if key not in sections:
            hint = nearest(key, sections)
            raise ConfigError("--set", f"section {key!r} is not read by `{command}`",
                              f"{hint}; use --set {sections[0]}.KEY=VALUE")
        if not isinstance(value, Mapping):
            raise ConfigError("--set", f"{key!r} names a section, not a key", f"use --set {key}.KEY=VALUE")
    return overrides


def deep_merge(base: Mapping, override: Mapping) -> dict:
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def command_section(workload: str | None, name: str, flags: Mapping, set_items: list[str] | None,
                    command: str) -> dict:
    """Section ``name`` for one command, by the documented precedence: workload < flags < ``--set``.

    ``flags`` maps section keys to flag values; a flag left at None was not given and keeps the
    workload's value.  Unknown ``--set`` sections are refused here (exit 2) before any work.
    """
    section = dict(load_workload(workload).get(name) or {}) if workload else {}
    section = deep_merge(section, {k: v for k, v in flags.items() if v is not None})
    return deep_merge(section, set_overrides(set_items, (name,), command).get(name, {}))


def workload_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("iobench").joinpath("workloads").iterdir()
                  if p.name.endswith(".yaml"))


def load_workload(name_or_path: str) -> dict:
    """A named workload shipped with iobench, or a YAML file path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and os.path.lexists(p):
        from .io.inputs import read_text

        text = read_text(p, "--workload", what="YAML file")
    else:
        names = workload_names()
        if name_or_path not in names:
            raise ConfigError("--workload", f"unknown workload {name_or_path!r}", nearest(name_or_path, names))
        # One name per joinpath call: several at once need Python 3.11.
        text = resources.files("iobench").joinpath("workloads").joinpath(name_or_path + ".yaml").read_text()
    import yaml

    from .io.inputs import loads_yaml

    try:
        data = loads_yaml(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError("--workload", f"{name_or_path} is not valid YAML: {e}", "fix the file") from e
    if not isinstance(data, dict):
        raise ConfigError("--workload", f"{name_or_path} must be a mapping of sections", "see README: Configuration")
    if not data:
        # an empty file (a truncated copy, `> w.yaml`): asked for a workload, the run would silently use none
        raise ConfigError("--workload", f"{name_or_path} is empty: it holds no section",
                          f"give a workload with a {', '.join(WORKLOAD_SECTIONS)} section")
    for key in data:
        # a mistyped section (`laod:`) would be read by no command: the run would use the defaults silently
        if key not in WORKLOAD_SECTIONS:
            raise ConfigError("--workload", f"{name_or_path}: section {key!r} is read by no command",
                              nearest(str(key), WORKLOAD_SECTIONS))
        if data[key] is not None and not isinstance(data[key], dict):
            raise ConfigError("--workload", f"{name_or_path}: section {key!r} must map keys to values, got a "
                              f"{type(data[key]).__name__}", f"give a mapping, e.g. {key}: {{seed: 0}}")
    return data


# the sections of a workload file: gen (and mlperf's datasets), load, mlperf (an open MLPerf experiment)
WORKLOAD_SECTIONS = ("gen", "load", "mlperf")


def load_yaml_file(path: str, field: str) -> dict:
    from .io.inputs import read_yaml

    if not os.path.lexists(path):
        raise ConfigError(field, f"file {path!r} does not exist", "give the path of a YAML file")
    data = read_yaml(path, field) or {}
    if not isinstance(data, dict):
        raise ConfigError(field, f"{path} must hold a mapping", "see README: Configuration")
    return data


def to_dict(obj: Any) -> Any:
    """A dataclass config as plain JSON-able data (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
