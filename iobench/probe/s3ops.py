"""Timed S3 requests with exact concurrency, on s3fs's own event loop and client.

Requests go straight to the aiobotocore client behind the backend's s3fs filesystem, so
each one is one HTTP request, timed from send to last byte (and to the first byte for
GETs).  botocore's own retries are counted from ``ResponseMetadata.RetryAttempts``;
throttling answers (503 SlowDown, 429) are counted whether or not a retry then succeeded.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable

from ..errors import StorageError
from ..metrics import LatencyHistogram
from ..storage import Backend

THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
                  "ServiceUnavailable", "503", "429"}
_CHUNK = 1 << 20


def probe_storage_options(storage_options: dict | None, max_concurrency: int) -> dict:
    """Options for open_backend with a connection pool wide enough for the sweep's concurrency."""
    opts = dict(storage_options or {})
    ck = {"connect_timeout": 5, "read_timeout": 120, "retries": {"max_attempts": 3, "mode": "standard"}}
    ck.update(opts.get("config_kwargs") or {})
    ck["max_pool_connections"] = max(int(ck.get("max_pool_connections", 10)), max_concurrency)
    opts["config_kwargs"] = ck
    return opts


@dataclass
class OpStats:
    """Latencies, bytes and retry counts of one kind of request."""

    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    ttfb: LatencyHistogram = field(default_factory=LatencyHistogram)
    bytes: int = 0
    retries: int = 0
    throttled: int = 0
    errors: int = 0
    started_ns: int = 0
    finished_ns: int = 0

    @property
    def ops(self) -> int:
        return self.latency.count

    @property
    def seconds(self) -> float:
        return max(0.0, (self.finished_ns - self.started_ns) / 1e9)

    def to_dict(self) -> dict:
        s = self.seconds
        d = {"ops": self.ops, "seconds": s, "ops_per_s": self.ops / s if s > 0 else None,
             "bytes": self.bytes, "bytes_per_s": self.bytes / s if s > 0 else None,
             "latency_s": self.latency.summary(), "retries": self.retries, "throttled": self.throttled,
             "errors": self.errors}
        if self.ttfb.count:
            d["ttfb_s"] = self.ttfb.summary()
        return d


def _meta(resp: dict, stats: OpStats) -> None:
    md = resp.get("ResponseMetadata") or {}
    stats.retries += int(md.get("RetryAttempts", 0) or 0)


class S3Ops:
    def __init__(self, backend: Backend):
        if not backend.speaks_s3:
            raise ValueError("S3Ops needs an s3:// backend")
        self.backend = backend
        self.fs = backend.fs
        self.bucket, _, self.prefix = backend.root.partition("/")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def run(self, coro_fn: Callable[..., Awaitable], *args, **kwargs) -> Any:
        from fsspec.asyn import sync

        return sync(self.fs.loop, coro_fn, *args, **kwargs)

    async def client(self):
        s3 = await self.fs.set_session()
        if not getattr(self, "_watching", False):
            # Counts every throttling answer, including those botocore then retried successfully.
            s3.meta.events.register("needs-retry.s3", self._on_attempt)
            self._watching = True
        return s3

    throttle_answers = 0

    def _on_attempt(self, response=None, **_kw) -> None:
        if not response:
            return None
        http, parsed = response
        code = str(((parsed or {}).get("Error") or {}).get("Code", ""))
        if getattr(http, "status_code", 0) in (429, 503) or code in THROTTLE_CODES:
            self.throttle_answers += 1
        return None  # never changes botocore's retry decision

    # -- one request each --------------------------------------------------------------------
    async def _guard(self, stats: OpStats, call: Callable[[], Awaitable]) -> Any:
        try:
            return await call()
        except Exception as e:
            resp = getattr(e, "response", None) or {}
            code = str((resp.get("Error") or {}).get("Code", ""))
            status = str((resp.get("ResponseMetadata") or {}).get("HTTPStatusCode", ""))
            _meta(resp, stats)
            if code in THROTTLE_CODES or status in ("503", "429"):
                stats.throttled += 1
            stats.errors += 1
            raise StorageError(f"S3 request failed ({code or type(e).__name__}) at s3://{self.bucket}") from e

    async def put(self, s3, rel: str, data: bytes, stats: OpStats) -> None:
        t0 = time.perf_counter_ns()
        resp = await self._guard(stats, lambda: s3.put_object(Bucket=self.bucket, Key=self.key(rel), Body=data))
        stats.latency.record_ns(time.perf_counter_ns() - t0)
        stats.bytes += len(data)
        _meta(resp, stats)

    async def head(self, s3, rel: str, stats: OpStats) -> int:
        t0 = time.perf_counter_ns()
        resp = await self._guard(stats, lambda: s3.head_object(Bucket=self.bucket, Key=self.key(rel)))
        stats.latency.record_ns(time.perf_counter_ns() - t0)
        _meta(resp, stats)
        return int(resp.get("ContentLength", 0))

    async def get(self, s3, rel: str, stats: OpStats, start: int | None = None, length: int | None = None) -> int:
        kw = {"Bucket": self.bucket, "Key": self.key(rel)}
        if start is not None:
            kw["Range"] = f"bytes={start}-{start + length - 1}"
        t0 = time.perf_counter_ns()
        resp = await self._guard(stats, lambda: s3.get_object(**kw))
        body = resp["Body"]
        n = 0
        try:
            chunk = await body.read(_CHUNK)
            stats.ttfb.record_ns(time.perf_counter_ns() - t0)
            while chunk:
                n += len(chunk)
                chunk = await body.read(_CHUNK)
        finally:
            body.close()
        stats.latency.record_ns(time.perf_counter_ns() - t0)
        stats.bytes += n
        _meta(resp, stats)
        return n

    async def list_prefix(self, s3, rel: str, stats: OpStats) -> int:
        """Every key under rel/, one timed request per page; returns the number of keys."""
        token = None
        keys = 0
        while True:
            kw = {"Bucket": self.bucket, "Prefix": self.key(rel).rstrip("/") + "/", "MaxKeys": 1000}
            if token:
                kw["ContinuationToken"] = token
            t0 = time.perf_counter_ns()
            resp = await self._guard(stats, lambda: s3.list_objects_v2(**kw))
            stats.latency.record_ns(time.perf_counter_ns() - t0)
            _meta(resp, stats)
            keys += len(resp.get("Contents") or [])
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token:
                return keys

    async def delete(self, s3, rel: str, stats: OpStats) -> None:
        t0 = time.perf_counter_ns()
        resp = await self._guard(stats, lambda: s3.delete_object(Bucket=self.bucket, Key=self.key(rel)))
        stats.latency.record_ns(time.perf_counter_ns() - t0)
        _meta(resp, stats)


async def pool(items: Iterable, concurrency: int, fn: Callable[[Any], Awaitable], stats: OpStats,
               deadline_ns: int | None = None) -> None:
    """Run ``fn(item)`` for each item with exactly ``concurrency`` requests in flight.

    With a deadline, workers stop taking new items once it has passed.
    """
    it = iter(items)

    async def worker():
        for item in it:
            if deadline_ns is not None and time.perf_counter_ns() >= deadline_ns:
                return
            await fn(item)

    stats.started_ns = time.perf_counter_ns()
    try:
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    finally:
        stats.finished_ns = time.perf_counter_ns()
