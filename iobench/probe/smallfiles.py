"""`iobench probe smallfiles`: the same N samples as one file each and as a few shards.

The probe generates one dataset per format from the same seed (so the samples are the
same bytes: ``files`` = one file per sample, the baseline the domain models warn about; ``tar`` and
``raw`` = shards), then reads each back cold with W workers in shuffled shard order,
through the loader's shard source (``iobench.loader.source.BackendSource``, which counts
bytes at the backend) and the format's reader.  Reported per format: samples/s, bytes/s,
per-sample worker time, opens (files touched) and per-open latency; and the small-file
penalty = the best shard format's samples/s over the files format's.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..config import check_choice
from ..errors import ConfigError
from ..manifest import MANIFEST_NAME, Manifest
from ..metrics import LatencyHistogram
from ..units import format_bytes, parse_size
from ..io import pagecache
from .threads import Released
from .safety import ProbeArea

SHARD_FORMATS = ("tar", "raw", "tfrecord", "parquet")


@dataclass(frozen=True)
class SmallFilesConfig:
    samples: int = 1000
    modality: str = "images"
    shard_formats: tuple[str, ...] = ("tar", "raw")
    shard_size: str = "64MiB"
    workers: int = 4
    cache: str = "cold"
    seq_len: int = 2048
    image_width: int = 500            # ~150 KB JPEGs, the size class of ImageNet samples
    image_height: int = 375
    seed: int = 0
    reader: str = "loader"            # loader (iobench's loader: worker processes, prefetch) | threads
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ConfigError("probe.samples", f"must be at least 2, got {self.samples}", "e.g. --samples 1000")
        check_choice("probe.modality", self.modality, ("tokens", "images"))
        check_choice("probe.cache", self.cache, ("cold", "warm"))
        check_choice("probe.reader", self.reader, ("loader", "threads"))
        if self.batch_size < 1:
            raise ConfigError("probe.batch_size", f"must be at least 1, got {self.batch_size}", "e.g. 32")
        if not self.shard_formats:
            raise ConfigError("probe.shard_formats", "is empty", "give at least one of: " + ", ".join(SHARD_FORMATS))
        for f in self.shard_formats:
            check_choice("probe.shard_formats", f, SHARD_FORMATS)
        if not 1 <= self.workers <= 256:
            raise ConfigError("probe.workers", f"{self.workers} is out of range", "use 1 to 256")
        if not re.fullmatch(r"\s*\d+\s*samples?\s*", str(self.shard_size), flags=re.I):
            parse_size(self.shard_size, "probe.shard_size")

    def gen_spec(self, fmt: str):
        from ..generate import GenSpec

        return GenSpec.from_mapping({
            "format": fmt, "modality": self.modality, "num_samples": self.samples, "seed": self.seed,
            "shard_size": "1 samples" if fmt == "files" else self.shard_size, "seq_len": self.seq_len,
            "image_width": self.image_width, "image_height": self.image_height})


def _estimate(cfg: SmallFilesConfig) -> int:
    from ..generate import make_synth

    per = make_synth(cfg.gen_spec("raw")).nominal_bytes()
    # tar pads every member to 512 bytes and adds headers; 2 KiB a sample covers it
    return int(cfg.samples * (per + 2048) * (1 + len(cfg.shard_formats)) * 1.1)


def _generate(area: ProbeArea, cfg: SmallFilesConfig, fmt: str, storage_options, endpoint_url) -> Manifest:
    from ..generate import generate

    rel = f"smallfiles/{fmt}"
    area.makedirs(rel)
    url = area.work.child(rel).url
    manifest = generate(cfg.gen_spec(fmt), url, endpoint_url=endpoint_url, storage_options=storage_options,
                        progress=False)
    names = [MANIFEST_NAME] + [s.path for s in manifest.shards] + [s.index_path for s in manifest.shards
                                                                   if s.index_path]
    area.track_many(f"{rel}/{n}" for n in names)
    return manifest


def _set_cache(area: ProbeArea, rel: str, manifest: Manifest, state: str) -> float | None:
    if not area.backend.is_local:
        return None
    paths = [area.work.path(f"{rel}/{s.path}") for s in manifest.shards]
    res = []
    for p in paths:
        r = pagecache.set_file_state(p, state)
        res.append((r or 0.0) * os.path.getsize(p))
    total = sum(os.path.getsize(p) for p in paths)
    return sum(res) / total if total else None


def read_dataset(url: str, manifest: Manifest, workers: int, seed: int, storage_options=None,
                 endpoint_url=None) -> dict:
    """Read every sample once with ``workers`` threads, each with its own shard source."""
    from ..formats import get_format
    from ..loader.source import backend_source

    reader = get_format(manifest.format).reader(manifest)
    order = np.random.default_rng(seed).permutation(len(manifest.shards)).tolist()
    shards = [manifest.shards[i] for i in order]
    it = iter(shards)
    lock = threading.Lock()
    hists = [LatencyHistogram() for _ in range(workers)]
    counts = [[0, 0] for _ in range(workers)]     # samples, bytes
    pool = Released(workers)
    now_ns = time.perf_counter_ns

    def work(w: int) -> None:
        src = backend_source(url, endpoint_url=endpoint_url, storage_options=storage_options or {})
        try:
            src.open(worker_id=w)
            pool.go(w)
            while True:
                with lock:
                    shard = next(it, None)
                if shard is None:
                    break
                t0 = now_ns()
                data = src.read_shard(shard)
                hists[w].record_ns(now_ns() - t0)
                n = 0
                for _ in reader.iter_samples(data, shard):
                    n += 1
                counts[w][0] += n
                counts[w][1] += len(data)
        finally:
            src.close()

    pool.run(work)
    seconds = pool.seconds
    samples = sum(c[0] for c in counts)
    nbytes = sum(c[1] for c in counts)
    h = LatencyHistogram()
    for x in hists:
        h.merge(x)
    return {"samples": samples, "bytes": nbytes, "seconds": seconds, "opens": len(shards),
            "samples_per_s": samples / seconds if seconds > 0 else None,
            "bytes_per_s": nbytes / seconds if seconds > 0 else None,
            "per_sample_s": seconds * workers / samples if samples else None,
            "open_read_latency_s": h.summary()}


def read_with_loader(url: str, manifest: Manifest, cfg: SmallFilesConfig, storage_options=None,
                     endpoint_url=None) -> dict:
    """Read every sample once through iobench's loader (W worker processes, prefetch, no compute)."""
    from ..loader.core import LoadConfig, run_load

    # block: whole files/shards read once each, so the formats differ only by how many objects
    # hold the samples (the small-file penalty), not by the access pattern; a small dataset still
    # fills one whole batch (the loader measures whole batches only)
    lc = LoadConfig(dataset=url, workers=cfg.workers, prefetch=4,
                    batch_size=min(cfg.batch_size, manifest.total_samples), epochs=1, shuffle=True,
                    seed=cfg.seed, cache="as-is", endpoint_url=endpoint_url, access="block")
    m = run_load(lc, storage_options=storage_options, manifest=manifest).metrics
    tp = m["throughput"]
    # Worker busy time (read + parse + collate, without waiting for free slots) per sample is the
    # per-sample cost; wall-clock rates also carry the workers' start-up, the same for every format.
    busy = sum(w.get("busy_s") or 0.0 for w in m.get("per_worker") or [])
    per_sample = busy / m["samples"] if busy > 0 and m["samples"] else None
    return {"samples": m["samples"], "bytes": m["bytes_read"], "seconds": m["wall_s"],
            "opens": len(manifest.shards),
            "samples_per_s": cfg.workers / per_sample if per_sample else tp["samples_per_s"],
            "samples_per_s_wall": tp["samples_per_s"], "bytes_per_s": tp["bytes_per_s"],
            "per_sample_s": per_sample, "worker_busy_s": busy,
            "read_latency_s": m["read_latency_s"], "read_calls": m["read_calls"]}


def run_smallfiles_probe(area: ProbeArea, cfg: SmallFilesConfig, progress=None, storage_options=None,
                         endpoint_url=None) -> dict:
    estimate = _estimate(cfg)
    area.reserve(estimate, f"{cfg.samples} samples in {1 + len(cfg.shard_formats)} formats")
    formats = ["files", *cfg.shard_formats]
    task = progress.add_task("small files", total=2 * len(formats)) if progress is not None else None
    manifests = {}
    for fmt in formats:
        manifests[fmt] = _generate(area, cfg, fmt, storage_options, endpoint_url)
        if task is not None:
            progress.advance(task)
    actual = sum(m.total_bytes for m in manifests.values())
    area.release(estimate)
    area.reserve(actual, "the small-file datasets")
    per_format = {}
    for fmt in formats:
        rel = f"smallfiles/{fmt}"
        residency = _set_cache(area, rel, manifests[fmt], cfg.cache)
        if cfg.reader == "loader":
            r = read_with_loader(area.work.child(rel).url, manifests[fmt], cfg, storage_options=storage_options,
                                 endpoint_url=endpoint_url)
        else:
            r = read_dataset(area.work.child(rel).url, manifests[fmt], cfg.workers, cfg.seed,
                             storage_options=storage_options, endpoint_url=endpoint_url)
        m = manifests[fmt]
        r.update({"format": fmt, "files": len(m.shards), "dataset_bytes": m.total_bytes,
                  "residency_before": residency, "samples_per_open": m.total_samples / len(m.shards)})
        per_format[fmt] = r
        if r["samples"] != cfg.samples:
            from ..errors import IntegrityError

            raise IntegrityError(f"{fmt}: read {r['samples']} samples of the {cfg.samples} written "
                                 "(the storage returned a different dataset than was written)")
        if task is not None:
            progress.advance(task)
    best = max(cfg.shard_formats, key=lambda f: per_format[f]["samples_per_s"] or 0)
    base = per_format["files"]["samples_per_s"]
    penalty = (per_format[best]["samples_per_s"] / base) if base else None
    metrics = {"formats": per_format, "best_shard_format": best, "penalty": penalty,
               "per_sample_overhead_s": (per_format["files"]["per_sample_s"] - per_format[best]["per_sample_s"])
               if per_format["files"]["per_sample_s"] and per_format[best]["per_sample_s"] else None,
               "opens_ratio": per_format["files"]["opens"] / per_format[best]["opens"],
               "samples": cfg.samples, "modality": cfg.modality,
               "mean_sample_bytes": per_format["files"]["dataset_bytes"] / cfg.samples}
    warnings = []
    if area.backend.is_local and cfg.cache == "cold":
        warm = [f for f, r in per_format.items() if (r["residency_before"] or 0) > 0.05]
        if warm:
            warnings.append(f"cold read not fully cold for {', '.join(warm)} (page cache residency above 5%)")
    environment = {"reader": "iobench loader (worker processes, prefetch 4, no compute; first step excluded)"
                   if cfg.reader == "loader" else
                   "format reader + iobench.loader.source.BackendSource, one per worker thread",
                   "workers": cfg.workers, "cache": {"declared": cfg.cache if area.backend.is_local else "n/a",
                                                     "measured": {f: r["residency_before"]
                                                                  for f, r in per_format.items()}},
                   "dataset_bytes": actual, "footprint": format_bytes(actual)}
    return {"metrics": metrics, "environment": environment, "warnings": warnings}
