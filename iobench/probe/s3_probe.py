"""`iobench probe s3`: an object store's GET/PUT curves, ranged GETs and multipart uploads.

For each object size the probe PUTs a few objects (as many as the footprint cap and the
highest concurrency allow), then sweeps concurrency for PUT and GET, each point running
for ``runtime`` (and at least one request per worker).  Ranged GETs read random aligned
ranges inside the largest objects; multipart uploads send one object with each part size,
parts in parallel.  Every request is timed (GETs also to the first byte) and botocore's
retries and throttling answers are counted.  Objects of one size are deleted before the
next size is written, so the footprint stays under ``--size``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..units import format_bytes, parse_duration, parse_size
from .plots import plot
from .s3ops import OpStats, S3Ops, pool
from .safety import ProbeArea

S3_OPS = ("put", "get", "range", "multipart")
MIN_PART = 5 * 1024 * 1024  # AWS S3's minimum for every part but the last


@dataclass(frozen=True)
class S3ProbeConfig:
    sizes: tuple[str, ...] = ("4KiB", "64KiB", "1MiB", "16MiB", "256MiB")
    concurrency: tuple[int, ...] = (1, 4, 16, 64)
    runtime: str = "1s"
    ops: tuple[str, ...] = S3_OPS
    range_size: str = "64KiB"
    part_sizes: tuple[str, ...] = ("5MiB", "8MiB", "16MiB", "64MiB")
    multipart_size: str = "128MiB"
    multipart_concurrency: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        from ..config import check_choice

        for o in self.ops:
            check_choice("probe.ops", o, S3_OPS)
        for c in self.concurrency:
            if not 1 <= c <= 1024:
                raise ConfigError("probe.concurrency", f"{c} is out of range", "use 1 to 1024, e.g. 1,4,16,64")
        if not self.concurrency or not self.sizes:
            raise ConfigError("probe", "an empty sweep", "give at least one object size and concurrency")
        if self.multipart_concurrency < 1:
            raise ConfigError("probe.multipart_concurrency", "must be at least 1", "e.g. 4")
        self.object_sizes, self.part_bytes, self.runtime_s  # noqa: B018  (validates the sizes)
        parse_size(self.range_size, "probe.range_size")
        parse_size(self.multipart_size, "probe.multipart_size")

    @property
    def object_sizes(self) -> list[int]:
        return sorted({parse_size(s, "probe.sizes") for s in self.sizes})

    @property
    def part_bytes(self) -> list[int]:
        return sorted({parse_size(s, "probe.part_sizes") for s in self.part_sizes})

    @property
    def runtime_s(self) -> float:
        return parse_duration(self.runtime, "probe.runtime", allow_zero=False)


def _schedule(keys: list, min_count: int, deadline_ns: int):
    i = 0
    while i < min_count or time.perf_counter_ns() < deadline_ns:
        yield keys[i % len(keys)]
        i += 1


def _point(op: str, size: int, conc: int, stats: OpStats) -> dict:
    d = stats.to_dict()
    s = d["seconds"]
    return {"op": op, "object_size": size, "concurrency": conc, "requests": d["ops"], "bytes": d["bytes"],
            "seconds": s, "bytes_per_s": d["bytes_per_s"], "objects_per_s": d["ops_per_s"],
            "latency_s": d["latency_s"], "ttfb_s": d.get("ttfb_s"), "retries": d["retries"],
            "throttled": d["throttled"], "errors": d["errors"],
            "latency_cdf": [list(p) for p in stats.latency.cdf(50)] if op != "put" else []}


def run_s3_probe(area: ProbeArea, cfg: S3ProbeConfig, progress=None) -> dict:
    if not area.backend.speaks_s3:
        raise ConfigError("url", f"{area.backend.url} is not an s3:// URL", "give s3://bucket/prefix")
    ops = S3Ops(area.work)
    rng = np.random.default_rng(cfg.seed)
    warnings: list[str] = []
    points: list[dict] = []
    multipart: list[dict] = []
    max_c = max(cfg.concurrency)
    range_bytes = parse_size(cfg.range_size, "probe.range_size")
    sizes = [s for s in cfg.object_sizes if s <= area.size_cap]
    for s in cfg.object_sizes:
        if s not in sizes:
            warnings.append(f"object size {format_bytes(s)} skipped: above the --size cap")
    n_points = len(sizes) * len(cfg.concurrency) * (("put" in cfg.ops) + ("get" in cfg.ops)) + \
        len(cfg.concurrency) * ("range" in cfg.ops) + len(cfg.part_bytes) * ("multipart" in cfg.ops)
    task = progress.add_task("s3 probe", total=n_points) if progress is not None else None

    def advance():
        if task is not None:
            progress.advance(task)

    def sweep(op: str, size: int, keys: list[str], fn) -> None:
        for c in cfg.concurrency:
            stats = OpStats()
            deadline = time.perf_counter_ns() + int(cfg.runtime_s * 1e9)
            ops.run(pool, _schedule(keys, c, deadline), c, lambda k, st=stats: fn(k, st), stats)
            points.append(_point(op, size, c, stats))
            advance()

    async def client():
        return await ops.client()

    s3 = ops.run(client)
    largest = sizes[-1] if sizes else None
    for size in sizes:
        n_obj = max(1, min(max_c, (area.size_cap - area.reserved) // size))
        if not area.fits(size):
            warnings.append(f"object size {format_bytes(size)} skipped: above the --size cap")
            continue
        area.reserve(n_obj * size, f"{n_obj} objects of {format_bytes(size)}")
        data = rng.bytes(size)
        keys = [f"obj-{size}/{i:04d}" for i in range(n_obj)]
        area.track_many(keys)
        seed_stats = OpStats()
        ops.run(pool, keys, min(max_c, n_obj), lambda k: ops.put(s3, k, data, seed_stats), seed_stats)
        if "put" in cfg.ops:
            sweep("put", size, keys, lambda k, st: ops.put(s3, k, data, st))
        if "get" in cfg.ops:
            sweep("get", size, keys, lambda k, st: ops.get(s3, k, st))
        if "range" in cfg.ops and size == largest:
            rb = min(range_bytes, size)
            slots = max(1, size // rb)

            def ranged(k, st):
                return ops.get(s3, k, st, start=int(rng.integers(0, slots)) * rb, length=rb)

            for c in cfg.concurrency:
                stats = OpStats()
                deadline = time.perf_counter_ns() + int(cfg.runtime_s * 1e9)
                ops.run(pool, _schedule(keys, c, deadline), c, lambda k, st=stats: ranged(k, st), stats)
                p = _point("range_get", rb, c, stats)
                p["within_object_size"] = size
                points.append(p)
                advance()
        del_stats = OpStats()
        ops.run(pool, keys, max_c, lambda k: ops.delete(s3, k, del_stats), del_stats)
        for k in keys:
            area.forget(k)
        area.release(n_obj * size)
    if "multipart" in cfg.ops:
        multipart, mp_warn = _multipart(area, ops, s3, cfg, rng, advance)
        warnings += mp_warn
    metrics = {"points": points, "multipart": multipart,
               "retries": sum(p["retries"] for p in points) + sum(m["retries"] for m in multipart),
               "throttled": sum(p["throttled"] for p in points) + sum(m["throttled"] for m in multipart),
               "throttle_answers": ops.throttle_answers,
               "summary": summarize(points), "plots": plots(points, multipart)}
    return {"metrics": metrics, "environment": {"engine": "aiobotocore (one request per operation)",
                                                "endpoint_url": area.backend.endpoint_url},
            "warnings": warnings}


def _multipart(area: ProbeArea, ops: S3Ops, s3, cfg: S3ProbeConfig, rng, advance) -> tuple[list, list]:
    warnings = []
    total = min(parse_size(cfg.multipart_size, "probe.multipart_size"), area.size_cap)
    out = []
    small = [p for p in cfg.part_bytes if p < MIN_PART]
    if small:
        warnings.append(f"part sizes below 5 MiB ({', '.join(format_bytes(p) for p in small)}) are rejected by "
                        "AWS S3 (every part but the last must be at least 5 MiB); measured anyway")
    data = memoryview(rng.bytes(total))
    for part in cfg.part_bytes:
        if part > total:
            warnings.append(f"part size {format_bytes(part)} skipped: above the multipart object size "
                            f"({format_bytes(total)})")
            advance()
            continue
        key = f"multipart/{part}"
        area.reserve(total, "the multipart object")
        area.track(key)
        stats = OpStats()
        bucket, full = ops.bucket, ops.key(key)
        parts = [(i + 1, i * part, min(total, (i + 1) * part)) for i in range((total + part - 1) // part)]
        etags: dict[int, str] = {}

        async def upload():
            resp = await s3.create_multipart_upload(Bucket=bucket, Key=full)
            upload_id = resp["UploadId"]
            t0 = time.perf_counter_ns()
            try:
                async def one(p):
                    n, a, b = p
                    t = time.perf_counter_ns()
                    r = await ops._guard(stats, lambda: s3.upload_part(Bucket=bucket, Key=full, UploadId=upload_id,
                                                                      PartNumber=n, Body=bytes(data[a:b])))
                    stats.latency.record_ns(time.perf_counter_ns() - t)
                    stats.bytes += b - a
                    stats.retries += int((r.get("ResponseMetadata") or {}).get("RetryAttempts", 0) or 0)
                    etags[n] = r["ETag"]

                await pool(parts, cfg.multipart_concurrency, one, OpStats())
                await s3.complete_multipart_upload(
                    Bucket=bucket, Key=full, UploadId=upload_id,
                    MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in sorted(etags)]})
            except BaseException:
                await s3.abort_multipart_upload(Bucket=bucket, Key=full, UploadId=upload_id)
                raise
            return (time.perf_counter_ns() - t0) / 1e9

        seconds = ops.run(upload)
        ops.run(lambda: s3.delete_object(Bucket=bucket, Key=full))
        area.forget(key)
        area.release(total)
        out.append({"part_size": part, "parts": len(parts), "object_size": total,
                    "concurrency": cfg.multipart_concurrency, "seconds": seconds,
                    "bytes_per_s": total / seconds if seconds > 0 else None,
                    "part_latency_s": stats.latency.summary(), "retries": stats.retries,
                    "throttled": stats.throttled})
        advance()
    return out, warnings


def _best(points: list[dict], conc: int) -> dict | None:
    if not points:
        return None
    return min(points, key=lambda p: (abs(p["concurrency"] - conc), -(p["objects_per_s"] or 0)))


def summarize(points: list[dict]) -> dict:
    """The object-store columns of the per-tier table: GET/PUT bandwidth, small-read rate, p99."""
    gets = [p for p in points if p["op"] == "get"]
    puts = [p for p in points if p["op"] == "put"]
    small = [p for p in points if p["op"] == "range_get"] or [
        p for p in gets if p["object_size"] == min((q["object_size"] for q in gets), default=0)]
    out = {"seq_read_bytes_per_s": max((p["bytes_per_s"] or 0 for p in gets), default=None),
           "seq_write_bytes_per_s": max((p["bytes_per_s"] or 0 for p in puts), default=None),
           "rand_read_bs": small[0]["object_size"] if small else None}
    for qd in (1, 32):
        p = _best(small, qd)
        out[f"rand_read_iops_qd{qd}"] = p["objects_per_s"] if p else None
        out[f"rand_read_iops_qd{qd}_actual_qd"] = p["concurrency"] if p else None
    p1 = _best(small, 1)
    out["p99_read_latency_s"] = p1["latency_s"]["p99"] if p1 else None
    first = [p for p in gets if p["concurrency"] == min((q["concurrency"] for q in gets), default=0)]
    out["ttfb_p50_s_by_object_size"] = {str(p["object_size"]): (p["ttfb_s"] or {}).get("p50") for p in first}
    return out


def plots(points: list[dict], multipart: list[dict]) -> dict:
    from collections import defaultdict

    by_conc: dict = defaultdict(list)
    by_size: dict = defaultdict(list)
    ttfb: dict = defaultdict(list)
    cdf = {}
    for p in points:
        size = format_bytes(p["object_size"])
        by_conc[f"{p['op']} {size}"].append([p["concurrency"], p["bytes_per_s"]])
        if p["op"] != "range_get":
            by_size[f"{p['op']} c={p['concurrency']}"].append([p["object_size"], p["bytes_per_s"]])
        if p.get("ttfb_s") and p["ttfb_s"].get("p50") is not None and p["op"] == "get":
            ttfb[f"c={p['concurrency']}"].append([p["object_size"], p["ttfb_s"]["p50"]])
        if p.get("latency_cdf") and p["op"] in ("get", "range_get"):
            cdf[f"{p['op']} {size} c={p['concurrency']}"] = p["latency_cdf"]
    out = {"throughput_vs_concurrency": plot("Object store throughput vs concurrency", "concurrent requests",
                                             "bytes_per_s", dict(by_conc)),
           "throughput_vs_object_size": plot("Object store throughput vs object size", "object size (bytes)",
                                             "bytes_per_s", dict(by_size)),
           "ttfb_vs_object_size": plot("GET time to first byte (p50) vs object size", "object size (bytes)",
                                       "seconds", dict(ttfb)),
           "latency_cdf": plot("GET latency CDF", "latency (s)", "fraction of requests", cdf)}
    if multipart:
        out["multipart_vs_part_size"] = plot("Multipart upload vs part size", "part size (bytes)", "bytes_per_s",
                                             {"multipart": [[m["part_size"], m["bytes_per_s"]] for m in multipart]})
    return out
