"""The loader's shard source over tiers (``iobench.tiers.loader_source``) and its access trace.

Trace format (JSON lines, one file per load run, appended to by every worker process):

- a header, written by the parent::

    {"type": "header", "version": 1, "dataset": ID, "url": URL, "mode": "ondemand", "tier": "nvme",
     "capacity_bytes": N | null, "policy": "lru", "shards": N, "dataset_bytes": N, "t0_ns": N}

- one record per shard read::

    {"type": "read", "t": SECONDS_SINCE_T0, "pid": PID, "shard": PATH, "bytes": N,
     "result": "hit" | "miss" | "bypass" | "stream", "tier": "nvme", "from": "object",
     "latency_s": S, "evicted": N, "refetches": N}

``t`` comes from the monotonic clock (``CLOCK_MONOTONIC`` is shared by processes on one host),
so records from different workers order correctly.  ``iobench tiers simulate TRACE`` replays
the reads against each policy.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter

from ..errors import ConfigError
from ..manifest import Manifest, ShardEntry
from ..metrics import LatencyHistogram, now_ns
from ..loader.source import ShardSource
from ..storage import Backend
from .config import load_tiers

TRACE_VERSION = 1
_ACCOUNT_LOCK = threading.Lock()


class TierSource(ShardSource):
    """A ``ShardSource`` that reads whole shards through the tiers (the base class's defaults
    slice them for ranges and pieces); picklable, opens the catalog in ``open``."""

    def __init__(self, tiers_file: str, staging: str, manifest: Manifest, dataset_backend: Backend, *,
                 to: str | None = None, dataset_url: str | None = None, trace_path: str | None = None,
                 shards=None):
        from .manager import STAGING_MODES, TierManager

        if staging not in STAGING_MODES:
            from ..config import nearest

            raise ConfigError("--staging", f"unknown staging mode {staging!r}", nearest(staging, STAGING_MODES))
        self.tiers_file = tiers_file
        self.staging = staging
        self.manifest = manifest
        self.dataset_backend = dataset_backend
        self.config = load_tiers(tiers_file)
        self.to = to or self.config.tiers[0].name
        self.config.tier(self.to, "--to")
        self.dataset_url = dataset_url or dataset_backend.url
        self.t0_ns = now_ns()
        self.stage_report: dict | None = None
        mgr = TierManager(self.config).open()
        self.dataset = mgr.register(self.dataset_url, manifest, dataset_backend)
        if staging != "stream":
            mgr.check_fits(self.dataset, self.to, whole=False)
        os.makedirs(self.config.trace_dir, exist_ok=True)
        self.trace_path = trace_path or os.path.join(
            self.config.trace_dir, f"trace-{self.dataset.id}-{os.getpid()}-{time.time_ns()}.jsonl")
        spec = self.config.tier(self.to)
        self._append({"type": "header", "version": TRACE_VERSION, "dataset": self.dataset.id, "url": self.dataset_url,
                      "mode": staging, "tier": self.to, "capacity_bytes": spec.capacity_bytes, "policy": spec.policy,
                      "shards": len(manifest.shards), "dataset_bytes": manifest.total_bytes, "t0_ns": self.t0_ns},
                     truncate=True)  # one trace per run: a reused path starts afresh
        if staging == "prestage":
            sel = None
            if shards is not None:
                wanted = {getattr(s, "path", s) for s in shards}
                sel = [s for s in manifest.shards if s.path in wanted]
            rep = mgr.prestage(self.dataset, self.to, sel)
            self.stage_report = rep.metrics()
        mgr.close()
        self._mgr = None
        self._trace_fd: int | None = None
        self._hist: dict[str, LatencyHistogram] = {}
        self._calls: dict[str, int] = {}
        self._bytes = {"read": 0, "written": 0}

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_mgr"] = None
        d["_trace_fd"] = None
        return d

    def _account(self, info) -> None:
        with _ACCOUNT_LOCK:  # `iobench stage --readers N` reads from threads
            for op in ("read", f"read_{info.result}"):
                self._hist.setdefault(op, LatencyHistogram()).record_s(info.seconds)
                self._calls[op] = self._calls.get(op, 0) + 1
            self._bytes["read"] += info.bytes
            if info.result == "miss":
                self._bytes["written"] += info.bytes

    def stats(self) -> dict:
        """This worker's counters in the loader's form (bytes read, mergeable HDR histograms per op)."""
        return {"bytes_read": self._bytes["read"], "bytes_written": self._bytes["written"],
                "calls": dict(self._calls), "hist": {op: h.encode() for op, h in self._hist.items() if h.count}}

    # ---- ShardSource ---------------------------------------------------------------------
    def open(self, worker_id: int = 0) -> None:
        from .manager import TierManager

        if self._mgr is None:
            self._mgr = TierManager(self.config).open()
            self._mgr.register(self.dataset_url, self.manifest, self.dataset_backend)
        if self._trace_fd is None:
            self._trace_fd = os.open(self.trace_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def read_shard(self, shard: ShardEntry) -> bytes:
        data, info = self._mgr.read(self.dataset, shard, self.to, self.staging)
        rec = {"type": "read", "t": (now_ns() - self.t0_ns) / 1e9, "pid": os.getpid(), "shard": shard.path,
               "bytes": info.bytes, "result": info.result, "tier": info.tier, "from": info.source,
               "latency_s": info.seconds, "evicted": info.evicted, "refetches": info.refetches}
        os.write(self._trace_fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())
        self._account(info)
        return data

    def close(self) -> None:
        if self._trace_fd is not None:
            os.close(self._trace_fd)
            self._trace_fd = None
        if self._mgr is not None:
            self._mgr.close()
            self._mgr = None

    def describe(self) -> dict:
        return {"kind": "tiers", "staging": self.staging, "tier": self.to, "tiers_file": self.tiers_file,
                "dataset_id": self.dataset.id, "trace": self.trace_path, "tiers": self.config.describe()["tiers"]}

    # ---- after the run (in the parent) ---------------------------------------------------
    def metrics(self) -> dict:
        """Hit ratios, bytes moved per tier pair, evictions, re-fetches, latency: from the trace and catalog."""
        from .catalog import Catalog

        out = summarize_trace(self.trace_path)
        if self.stage_report is not None:
            out["prestage"] = self.stage_report
            for pair, n in self.stage_report["bytes_by_tier_pair"].items():
                out["bytes_by_tier_pair"][pair] = out["bytes_by_tier_pair"].get(pair, 0) + n
        cat = Catalog(self.config.catalog)
        try:
            out["tiers"] = {t.name: cat.usage(t.name) for t in self.config.tiers}
        finally:
            cat.close()
        return out

    def _append(self, rec: dict, truncate: bool = False) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_TRUNC if truncate else 0)
        fd = os.open(self.trace_path, flags, 0o644)
        try:
            os.write(fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())
        finally:
            os.close(fd)


def summarize_trace(path: str) -> dict:
    """The tier metrics of one trace: per-tier hit ratio, bytes per tier pair, first-read time, latencies."""
    from .simulate import read_trace

    headers, reads = read_trace(path)
    results = Counter(r["result"] for r in reads)
    pairs: Counter = Counter()
    by_tier: dict[str, Counter] = {}
    lat: dict[str, LatencyHistogram] = {}
    for r in reads:
        if r["result"] != "hit":
            pairs[f"{r['from']}->{r['tier']}" if r["result"] == "miss" else f"{r['from']}->reader"] += r["bytes"]
        else:
            pairs[f"{r['tier']}->reader"] += r["bytes"]
        c = by_tier.setdefault(r["tier"], Counter())
        c["reads"] += 1
        c["hits"] += r["result"] == "hit"
        lat.setdefault(r["result"], LatencyHistogram()).record_s(r["latency_s"])
    n = len(reads)
    first = min(r["t"] - r["latency_s"] for r in reads)
    return {
        "trace": path,
        "mode": headers[0]["mode"] if headers else None,
        "reads": n,
        "hits": results["hit"], "misses": results["miss"], "bypassed": results["bypass"], "streamed": results["stream"],
        "hit_ratio": results["hit"] / n if n else 0.0,
        "hit_ratio_by_tier": {t: c["hits"] / c["reads"] for t, c in by_tier.items() if c["reads"]},
        "bytes_by_tier_pair": dict(pairs),
        "evictions": sum(r.get("evicted", 0) for r in reads),
        "refetches": sum(r.get("refetches", 0) for r in reads),
        "time_to_first_shard_s": min(r["t"] for r in reads),
        "first_read_start_s": first,
        "read_latency_s": {k: h.summary() for k, h in lat.items()},
    }


def loader_source(tiers_file: str, staging: str, manifest: Manifest, dataset_backend: Backend, **kw) -> TierSource:
    """The ShardSource the loader uses with ``--tiers FILE --staging MODE`` (see iobench.loader.source).

    ``prestage`` copies the dataset (or ``shards=``, this rank's assignment) before returning.
    Optional keywords: ``to`` (the hot tier; default the first), ``dataset_url``, ``trace_path``.
    """
    return TierSource(tiers_file, staging, manifest, dataset_backend, **kw)
