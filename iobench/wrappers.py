"""Backends that wrap other backends: instrumented, emulated (slower storage) and faulty.

They keep the ``iobench.storage.Backend`` interface (``cat``, ``open``, ``size``,
``exists``, ``ls``, ``open_output``, ``write_bytes``, ``child``...) and compose in any
order, e.g. ``InstrumentedBackend(EmulatedBackend(open_backend(url), PROFILES["pfs"]))``
measures what a reader of an emulated parallel file system would see.

Emulation adds time to real operations; it never makes them faster.  Each request (a
``cat``, an ``open``, each ``read`` on an opened file, a metadata call) first waits a
latency drawn from the spec, then moves its bytes no faster than the bandwidth cap.  A
wrapper instance enforces its own cap (one per worker process in the loader); ``bw:RATE``
is the tier's aggregate, which the loader splits evenly over its W workers
(``EmulationSpec.for_workers``: each reads at most RATE/W, so W busy workers together read
at RATE, and more workers never read a bandwidth-bound tier faster); ``bw:RATE,per=worker``
is a per-stream cap instead (W workers: up to W x RATE).

Spec strings (``parse_emulation``) are terms joined by ``+``::

    const:250ms                      fixed latency
    normal:mean=100ms,std=20ms       truncated at zero
    lognormal:p50=20ms,p99=500ms     the usual shape of storage tails
    spike:p=0.01,extra=2s            with probability p a request takes `extra` longer
    bw:500MB                         the tier's bandwidth in bytes per second ("/s" optional), shared by all workers
    bw:500MB/s,per=worker            a per-worker (per-stream) cap instead
    nvme | pfs | object              named profiles from the domain models' tier table (PROFILES)

e.g. ``pfs+spike:p=0.02,extra=300ms`` or ``const:150ms+bw:1GiB/s``.
"""

from __future__ import annotations

import math
import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import IO, Any, Iterator, cast

from .config import nearest
from .errors import ConfigError
from .io.ratelimit import RateLimiter, parse_rate
from .metrics import LatencyHistogram, now_ns
from .storage import Backend
from .units import parse_duration

Z99 = 2.3263478740408408  # standard normal quantile at 0.99


@dataclass(frozen=True)
class EmulationSpec:
    """A per-request latency distribution, optional spikes and an optional bandwidth cap."""

    kind: str = "none"                # none | const | normal | lognormal
    latency_s: float = 0.0            # const: the latency; normal: the mean
    std_s: float = 0.0                # normal
    p50_s: float = 0.0                # lognormal
    p99_s: float = 0.0                # lognormal
    spike_p: float = 0.0
    spike_s: float = 0.0
    bandwidth_bytes_per_s: float | None = None
    bandwidth_per_worker: bool = False    # bw:...,per=worker: each worker's cap, not the tier's aggregate
    shared_by: int = 1                # for_workers(n): this instance's cap is the aggregate / n
    text: str = "none"                # the spec as the user gave it (or the profile name)

    def for_workers(self, workers: int) -> "EmulationSpec":
        """The spec one of ``workers`` processes enforces: an aggregate bandwidth split evenly."""
        if not self.bandwidth_bytes_per_s or self.bandwidth_per_worker or workers <= 1 or self.shared_by > 1:
            return self
        return replace(self, bandwidth_bytes_per_s=self.bandwidth_bytes_per_s / workers, shared_by=workers)

    @property
    def active(self) -> bool:
        return self.kind != "none" or self.spike_p > 0 or self.bandwidth_bytes_per_s is not None

    def sample_latency(self, rng: random.Random) -> float:
        """One request's added latency in seconds."""
        if self.kind == "const":
            s = self.latency_s
        elif self.kind == "normal":
            s = max(0.0, rng.gauss(self.latency_s, self.std_s))
        elif self.kind == "lognormal":   # p50 > 0 and p99 >= p50: the parser's checks
            s = rng.lognormvariate(math.log(self.p50_s), math.log(self.p99_s / self.p50_s) / Z99)
        else:
            s = 0.0
        if self.spike_p > 0 and rng.random() < self.spike_p:
            s += self.spike_s
        return s

    def transfer_s(self, nbytes: int) -> float:
        """Least time ``nbytes`` may take under the bandwidth cap."""
        return nbytes / self.bandwidth_bytes_per_s if self.bandwidth_bytes_per_s else 0.0

    def describe(self) -> dict:
        by_kind: dict[str, dict[str, float]] = {"const": {"latency_s": self.latency_s},
                                                "normal": {"mean_s": self.latency_s, "std_s": self.std_s},
                                                "lognormal": {"p50_s": self.p50_s, "p99_s": self.p99_s}}
        d: dict[str, Any] = {"spec": self.text, "kind": self.kind, **by_kind.get(self.kind, {})}
        if self.spike_p:
            d["spike_p"], d["spike_s"] = self.spike_p, self.spike_s
        if self.bandwidth_bytes_per_s:
            d["bandwidth_bytes_per_s"] = self.bandwidth_bytes_per_s * self.shared_by
            d["bandwidth_scope"] = "per worker" if self.bandwidth_per_worker else \
                f"tier aggregate, shared by {self.shared_by} worker(s)"
        return d


# The domain models' tier table (docs/design.md: chapter 4, Table 4.2, access latency per tier) and the
# per-node bandwidth shares of §4.2 (one 7 GB/s NVMe drive; a 1 TB/s PFS shared by 256 nodes ≈ 4 GB/s; object stores
# 10x below the PFS).  The P99s follow the prefetch-depth example (P99 of a 40 MB batch:
# NVMe ~50 ms, PFS ~200 ms, object store ~500 ms): the per-request tails below give about
# those batch P99s at those bandwidths.
PROFILES: dict[str, EmulationSpec] = {
    "nvme": EmulationSpec(kind="lognormal", p50_s=100e-6, p99_s=2e-3, bandwidth_bytes_per_s=7e9, text="nvme"),
    "pfs": EmulationSpec(kind="lognormal", p50_s=1e-3, p99_s=150e-3, bandwidth_bytes_per_s=4e9, text="pfs"),
    "object": EmulationSpec(kind="lognormal", p50_s=50e-3, p99_s=500e-3, bandwidth_bytes_per_s=400e6,
                            text="object"),
}

_FIELD = "--emulate"
_FIX = "use e.g. const:250ms, lognormal:p50=20ms,p99=500ms, spike:p=0.01,extra=2s, bw:1GB/s or " \
       "a profile (nvme, pfs, object), joined with +"


def parse_params(term: str, body: str, allowed: tuple[str, ...], field: str = _FIELD, fix: str = _FIX) -> dict[str, str]:
    """``k=v,k=v`` of a distribution term (``normal:mean=..,std=..``): every key of ``allowed`` once, no other."""
    out = {}
    for part in body.split(","):
        if "=" not in part:
            raise ConfigError(field, f"{term!r}: expected key=value, got {part!r}", fix)
        k, v = (s.strip() for s in part.split("=", 1))
        if k not in allowed:
            raise ConfigError(field, f"{term!r}: unknown parameter {k!r}", nearest(k, allowed))
        if k in out:
            raise ConfigError(field, f"{term!r}: {k} is given twice", "give each parameter once")
        out[k] = v
    missing = [k for k in allowed if k not in out]
    if missing:
        raise ConfigError(field, f"{term!r}: missing {', '.join(missing)}", fix)
    return out


def _duration(v: str) -> float:
    return parse_duration(v, _FIELD)


def parse_emulation(spec: str | None) -> EmulationSpec:
    """Parse an emulation spec string (see the module docstring); bad specs raise ConfigError."""
    text = (spec or "").strip()
    if spec is not None and not text:
        raise ConfigError(_FIELD, "is empty", "give 'none' for no emulation, or e.g. pfs, const:5ms+bw:1GB/s")
    if not text or text == "none":
        return EmulationSpec()
    out = EmulationSpec(text=text)
    kinds = ("const", "normal", "lognormal", "spike", "bw")
    seen: dict[str | None, str] = {}   # what each term sets: a second latency model or bandwidth would silently win
    for term in (t.strip() for t in text.split("+")):
        if not term:
            raise ConfigError(_FIELD, f"empty term in {text!r}", _FIX)
        name, _, body = term.partition(":")
        name = name.strip().lower()
        what = "latency" if name in kinds[:3] or (name in PROFILES and not body) else name if name in kinds else None
        if what in seen:   # (None, a term that sets nothing known, is refused below)
            raise ConfigError(_FIELD, f"{term!r} and {seen[what]!r} both set the {what}",
                              "give one latency model, one bw and one spike at most")
        seen[what] = term
        if name in PROFILES and not body:
            prof = PROFILES[name]
            out = replace(out, kind=prof.kind, latency_s=prof.latency_s, std_s=prof.std_s, p50_s=prof.p50_s,
                          p99_s=prof.p99_s, bandwidth_bytes_per_s=out.bandwidth_bytes_per_s or prof.bandwidth_bytes_per_s)
            continue
        if name not in kinds:
            raise ConfigError(_FIELD, f"unknown emulation {name!r}", nearest(name, kinds + tuple(PROFILES)))
        if not body:
            raise ConfigError(_FIELD, f"{term!r} needs parameters", _FIX)
        if name == "const":
            out = replace(out, kind="const", latency_s=_duration(body))
        elif name == "normal":
            p = parse_params(term, body, ("mean", "std"))
            out = replace(out, kind="normal", latency_s=_duration(p["mean"]), std_s=_duration(p["std"]))
        elif name == "lognormal":
            p = parse_params(term, body, ("p50", "p99"))
            p50, p99 = _duration(p["p50"]), _duration(p["p99"])
            if p50 <= 0 or p99 < p50:
                raise ConfigError(_FIELD, f"{term!r}: need 0 < p50 <= p99", "e.g. lognormal:p50=20ms,p99=500ms")
            out = replace(out, kind="lognormal", p50_s=p50, p99_s=p99)
        elif name == "spike":
            p = parse_params(term, body, ("p", "extra"))
            try:
                prob = float(p["p"])
            except ValueError:
                raise ConfigError(_FIELD, f"{term!r}: p={p['p']!r} is not a number", "give 0 <= p <= 1") from None
            if not 0 <= prob <= 1:
                raise ConfigError(_FIELD, f"{term!r}: p must be within 0..1", "give 0 <= p <= 1")
            out = replace(out, spike_p=prob, spike_s=_duration(p["extra"]))
        else:  # bw: the rate vocabulary of iobench.io.ratelimit; ",per=worker" makes it a per-worker cap
            rate, _, scope = body.partition(",")
            if scope and scope.replace(" ", "") not in ("per=worker", "per=tier"):
                raise ConfigError(_FIELD, f"{term!r}: unknown option {scope!r}",
                                  "bw:RATE is the tier's aggregate; bw:RATE,per=worker caps each worker")
            out = replace(out, bandwidth_bytes_per_s=parse_rate(rate, _FIELD),
                          bandwidth_per_worker=scope.replace(" ", "") == "per=worker")
    return out


def resolve_emulation(spec: "str | EmulationSpec | None") -> EmulationSpec:
    return spec if isinstance(spec, EmulationSpec) else parse_emulation(spec)


# ---------------------------------------------------------------------------------------
# Wrapper base: a Backend whose I/O goes through ``inner``.


def _inner_flag(name: str) -> property:
    return property(lambda self: getattr(self.inner, name), doc=f"The wrapped backend's ``{name}``.")


class BackendWrapper(Backend):
    """Forwards every call to ``inner``; subclasses hook the requests they care about.

    Capability flags are the wrapped backend's (zarr's wrapper-store pattern); a wrapper whose
    hooks a capability would go round says so by overriding that flag (``EmulatedBackend``)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(url=inner.url, protocol=inner.protocol, root=inner.root, fs=inner.fs,
                         endpoint_url=inner.endpoint_url)
        self.inner = inner

    is_local = _inner_flag("is_local")
    speaks_s3 = _inner_flag("speaks_s3")
    supports_bulk_transfer = _inner_flag("supports_bulk_transfer")
    shared_between_processes = _inner_flag("shared_between_processes")
    supports_odirect = _inner_flag("supports_odirect")
    parallel_ranged_reads = _inner_flag("parallel_ranged_reads")
    zero_copy_reads = _inner_flag("zero_copy_reads")
    read_client = _inner_flag("read_client")

    _settings: tuple = ()   # the constructor's arguments after ``inner`` (what a child is wrapped with)

    def child(self, rel: str) -> Backend:
        """The same wrapper, with its settings (not its state: counters, RNG), around the inner's child."""
        return type(self)(self.inner.child(rel), *self._settings)

    def describe(self) -> dict:
        return self.inner.describe()

    def local_path(self, rel: str = "") -> str:
        return self.inner.local_path(rel)

    def relative(self, full: str) -> str | None:
        return self.inner.relative(full)

    def connect(self) -> None:
        self.inner.connect()

    def check_reachable(self, field_name: str = "url") -> None:
        self.inner.check_reachable(field_name)

    def _meta(self, fn, *args):
        """Every metadata request (``exists``, ``size``, ``ls``) passes here: the hook for subclasses."""
        return fn(*args)

    def _read(self, fn, rel: str, *args, first: bool | None = None):
        """Every read request (``cat``, ``cat_into``, ``cat_buffer``, ``cat_stream``) passes here: the
        hook for subclasses.  ``first``: a stream's first piece (True), a later one (False), not a
        stream (None).  Its bytes are ``_nbytes(result)``."""
        return fn(rel, *args)

    def exists(self, rel: str) -> bool:
        return self._meta(self.inner.exists, rel)

    def size(self, rel: str) -> int:
        return self._meta(self.inner.size, rel)

    def ls(self, rel: str = "", detail: bool = False) -> list:
        return self._meta(self.inner.ls, rel, detail)

    def cat(self, rel: str, start: int | None = None, end: int | None = None) -> bytes:
        return self._read(self.inner.cat, rel, start, end)

    def cat_into(self, rel: str, start: int, end: int, out) -> int:
        return self._read(self.inner.cat_into, rel, start, end, out)

    def cat_buffer(self, rel: str, start: int | None, end: int | None):
        return self._read(self.inner.cat_buffer, rel, start, end)

    def cat_stream(self, rel: str, start: int, end: int, first: bool = True) -> bytes:
        return self._read(self.inner.cat_stream, rel, start, end, first, first=first)

    def open(self, rel: str, mode: str = "rb", **kw) -> IO:
        return self.inner.open(rel, mode, **kw)

    def rm(self, rel: str, recursive: bool = False) -> None:
        self.inner.rm(rel, recursive)

    def makedirs(self, rel: str = "") -> None:
        self.inner.makedirs(rel)

    def _written(self, nbytes: int, t0_ns: int) -> None:
        """Every ``open_output`` block, once it has published ``nbytes`` written from ``t0_ns`` on,
        passes here: the hook for subclasses."""

    @contextmanager
    def open_output(self, rel: str, fsync: bool = True) -> Iterator[IO]:
        t0 = now_ns()
        written = [0]

        def on_write(fn, data):
            written[0] += len(data)
            return fn(data)

        with self.inner.open_output(rel, fsync=fsync) as f:
            yield cast(IO, _FileProxy(f, lambda fn, a: fn(a), on_write))
        self._written(written[0], t0)

    @property
    def base(self) -> Backend:
        """The innermost real backend."""
        return self.inner.base


class _FileProxy:
    """A file object whose reads and writes go through hooks; everything else is forwarded."""

    def __init__(self, f: IO, on_read, on_write=None) -> None:
        self._f: Any = f
        self._on_read = on_read
        self._on_write = on_write

    def read(self, n: int = -1) -> bytes:
        return self._on_read(self._f.read, n)

    def readinto(self, buf) -> int:
        return self._on_read(self._f.readinto, buf)

    def write(self, data) -> int:
        if self._on_write is None:
            return self._f.write(data)
        return self._on_write(self._f.write, data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _nbytes(result: Any) -> int:
    """The bytes a read moved: the count ``readinto``/``cat_into`` returned, else its result's length."""
    if isinstance(result, int):
        return result
    return len(result) if result is not None else 0


# ---------------------------------------------------------------------------------------
# Emulated: slower storage.


# A streamed GET's bytes keep arriving into the client's socket receive buffer while the client
# parses the piece it has (Linux starts a TCP receive buffer at tcp_rmem's 128 KiB and autotunes
# it upward): an emulated stream keeps transferring during those gaps, up to this much.  Without
# it a one-worker stream delivered the cap less the worker's own time between pieces (0.78-0.86x
# of an emulated 20 MiB/s on a host at load 5-8, reports/reference/front_door.md), which a real
# tier at that bandwidth would not have lost.
STREAM_BUFFER_BYTES = 1 << 20


class EmulatedBackend(BackendWrapper):
    """Adds a latency per request and caps bandwidth; results should say "emulated"."""

    # O_DIRECT on the files underneath would skip the added latency.
    supports_odirect = False

    def __init__(self, inner: Backend, spec: "EmulationSpec | str", seed: int = 0) -> None:
        super().__init__(inner)
        self.spec = resolve_emulation(spec)
        self.seed = seed
        self._settings = (self.spec, seed)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._limit = RateLimiter(self.spec.bandwidth_bytes_per_s)

    def describe(self) -> dict:
        return {**self.inner.describe(), "emulated": self.spec.describe()}

    def _latency(self) -> None:
        with self._lock:
            s = self.spec.sample_latency(self._rng)
        if s > 0:
            time.sleep(s)

    def _request(self, fn, *args, nbytes_in: int | None = None, latency: bool = True, carry_bytes: int = 0):
        if latency:
            self._latency()
        t0 = now_ns()
        result = fn(*args)
        self._limit.hold(nbytes_in if nbytes_in is not None else _nbytes(result), t0, carry_bytes=carry_bytes)
        return result

    def _meta(self, fn, *args):
        return self._request(fn, *args, nbytes_in=0)

    def _read(self, fn, rel: str, *args, first: bool | None = None):
        """A stream (one GET) pays its latency on its first piece; every piece moves at the bandwidth cap."""
        later_piece = first is False
        # paced: the pieces of one GET move back to back, and keep moving while the caller parses
        # the last one, up to a receive buffer (STREAM_BUFFER_BYTES)
        return self._request(fn, rel, *args, latency=not later_piece,
                             carry_bytes=STREAM_BUFFER_BYTES if later_piece else 0)

    def open(self, rel: str, mode: str = "rb", **kw) -> IO:
        f = self._request(lambda: self.inner.open(rel, mode, **kw), nbytes_in=0)
        return cast(IO, _FileProxy(f, self._request))

    def _written(self, nbytes: int, t0_ns: int) -> None:
        self._latency()
        self._limit.hold(nbytes, t0_ns)


# ---------------------------------------------------------------------------------------
# Instrumented: counts real bytes and times every operation.


class InstrumentedBackend(BackendWrapper):
    """Counts calls and bytes actually moved, and times each operation into HDR histograms.

    Operations: ``open``, ``read`` (a ``cat`` — one GET — or one ``read`` on an opened file),
    ``ttfb`` (first read after an open), ``metadata`` (size/exists/ls), ``write``
    (a whole ``open_output`` block, from open to publish).
    """

    OPS = ("open", "read", "ttfb", "metadata", "write")

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self.hist = {op: LatencyHistogram() for op in self.OPS}
        self.calls = {op: 0 for op in self.OPS}
        self.failed: dict[str, int] = {}    # attempts that raised (not in calls or latency)
        self.bytes_read = 0
        self.bytes_written = 0

    def record(self, op: str, ns: int, nread: int = 0, nwritten: int = 0) -> None:
        """Count an operation (also one done on this backend's files by other means, e.g. O_DIRECT preads)."""
        with self._lock:
            self.hist[op].record_ns(ns)
            self.calls[op] += 1
            self.bytes_read += nread
            self.bytes_written += nwritten

    def record_many(self, op: str, ns_values, nread: int = 0) -> None:
        """Count ``len(ns_values)`` operations done by other means, in one call (a hot path's log)."""
        with self._lock:
            self.hist[op].record_many_ns(ns_values)
            self.calls[op] += len(ns_values)
            self.bytes_read += nread

    def _timed(self, op: str, fn, *args, reads: bool = False, ttfb: bool = False):
        t0 = now_ns()
        try:
            result = fn(*args)
        except Exception:
            # A failed attempt is an attempt: the retry policy above makes another, and both count.
            with self._lock:
                self.failed[op] = self.failed.get(op, 0) + 1
            raise
        ns = now_ns() - t0
        self.record(op, ns, nread=_nbytes(result) if reads else 0)
        if ttfb:   # a stream's first piece: its latency is the time to first byte as well
            self.record("ttfb", ns)
        return result

    def _meta(self, fn, *args):
        return self._timed("metadata", fn, *args)

    def _read(self, fn, rel: str, *args, first: bool | None = None):
        return self._timed("read", fn, rel, *args, reads=True, ttfb=bool(first))

    def open(self, rel: str, mode: str = "rb", **kw) -> IO:
        f = self._timed("open", lambda: self.inner.open(rel, mode, **kw))
        first = [True]

        def on_read(fn, arg):
            result = self._timed("read", fn, arg, reads=True, ttfb=first[0])
            first[0] = False   # the first read after the open (that succeeded) is its time to first byte
            return result

        def on_write(fn, data):
            n = fn(data)
            with self._lock:
                self.bytes_written += len(data)
            return n

        return cast(IO, _FileProxy(f, on_read, on_write))

    def _written(self, nbytes: int, t0_ns: int) -> None:
        self.record("write", now_ns() - t0_ns, nwritten=nbytes)

    def stats(self, encode: bool = False) -> dict:
        """Counters and per-op latency; ``encode=True`` keeps histograms mergeable across processes."""
        with self._lock:
            out = {"bytes_read": self.bytes_read, "bytes_written": self.bytes_written, "calls": dict(self.calls)}
            if self.failed:
                out["failed_calls"] = dict(self.failed)
            if encode:
                out["hist"] = {op: h.encode() for op, h in self.hist.items() if h.count}
            else:
                out["latency_s"] = {op: h.summary() for op, h in self.hist.items() if h.count}
        return out


# ---------------------------------------------------------------------------------------
# Faulty: injected errors and timeouts, reproducible with a seed.


class InjectedFault(OSError):
    """An I/O error injected by FaultyBackend."""


class InjectedTimeout(TimeoutError):
    """A timeout injected by FaultyBackend (after waiting ``timeout_s``)."""


class FaultyBackend(BackendWrapper):
    """Fails read requests with probability ``error_rate`` and times them out with ``timeout_rate``."""

    # O_DIRECT on the files underneath would skip the injected faults.
    supports_odirect = False

    def __init__(self, inner: Backend, error_rate: float = 0.0, timeout_rate: float = 0.0, seed: int = 0,
                 timeout_s: float = 0.05) -> None:
        for name, v in (("error_rate", error_rate), ("timeout_rate", timeout_rate)):
            if not 0 <= v <= 1:
                raise ConfigError(name, f"must be within 0..1, got {v!r}", "give a probability")
        if error_rate + timeout_rate > 1:
            raise ConfigError("error_rate", "error_rate + timeout_rate exceeds 1", "lower one of them")
        super().__init__(inner)
        self.error_rate, self.timeout_rate, self.seed, self.timeout_s = error_rate, timeout_rate, seed, timeout_s
        self._settings = (error_rate, timeout_rate, seed, timeout_s)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def describe(self) -> dict:
        return {**self.inner.describe(), "faults": {"error_rate": self.error_rate,
                                                     "timeout_rate": self.timeout_rate, "seed": self.seed}}

    def _maybe_fail(self, what: str) -> None:
        with self._lock:
            u = self._rng.random()
        if u < self.error_rate:
            raise InjectedFault(f"injected I/O error reading {self.path(what)}")
        if u < self.error_rate + self.timeout_rate:
            time.sleep(self.timeout_s)
            raise InjectedTimeout(f"injected timeout reading {self.path(what)}")

    def _read(self, fn, rel: str, *args, first: bool | None = None):
        self._maybe_fail(rel)
        return fn(rel, *args)

    def open(self, rel: str, mode: str = "rb", **kw) -> IO:
        self._maybe_fail(rel)
        f = self.inner.open(rel, mode, **kw)
        if "r" not in mode:
            return f

        def on_read(fn, arg):
            self._maybe_fail(rel)
            return fn(arg)

        return cast(IO, _FileProxy(f, on_read))

    @contextmanager
    def open_output(self, rel: str, fsync: bool = True) -> Iterator[IO]:
        with self.inner.open_output(rel, fsync=fsync) as f:   # writes are not faulted: the file as is
            yield f
