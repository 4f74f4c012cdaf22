"""One staging measurement: stage a dataset into a tier, then optionally read it for some epochs.

Shared by ``iobench stage``, the ``iobench run`` stage and the benchmarks.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

from ..manifest import read_manifest
from ..metrics import now_ns
from ..storage import open_backend
from .config import TiersConfig, write_tiers_file


def open_dataset(cfg: TiersConfig, url: str, endpoint_url: str | None = None):
    """(backend, manifest) of a dataset, with the credentials of the tier it lives on, if any."""
    from .manager import TierManager

    origin = TierManager(cfg).origin_tier_of(url)
    backend = open_backend(url, endpoint_url=endpoint_url or (origin.endpoint_url if origin else None),
                           storage_options=(origin.storage_options if origin else None) or None,
                           field_name="DATASET_URL")
    backend.check_reachable("DATASET_URL")
    return backend, read_manifest(backend)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    import numpy as np

    return list(np.random.default_rng(seed + epoch).permutation(n))


def run_stage(cfg: TiersConfig, url: str, *, mode: str = "prestage", to: str | None = None, epochs: int = 0,
              readers: int = 4, seed: int = 0, endpoint_url: str | None = None, trace_path: str | None = None,
              evict_first: bool = False, tiers_file: str | None = None, progress: bool = False,
              results=None, rank: int = 0, world: int = 1) -> dict:
    """Metrics of staging ``url`` into ``to`` in ``mode`` and reading it ``epochs`` times.

    With ``world`` > 1, this rank stages and reads its own assignment: shards rank, rank+world, ...
    """
    from .manager import TierManager
    from .source import TierSource, summarize_trace

    to = to or cfg.tiers[0].name
    cfg.tier(to, "--to")
    backend, manifest = open_dataset(cfg, url, endpoint_url)
    mgr = TierManager(cfg).open()
    ds = mgr.register(url, manifest, backend)
    if evict_first:
        mgr.evict(to, ds)
    mine = list(manifest.shards[rank::world])
    if mode != "stream":
        mgr.check_fits(ds, to, mine, whole=(mode == "prestage"))
    owns_file = tiers_file is None
    if owns_file:
        fd, tiers_file = tempfile.mkstemp(prefix="iobench-tiers-", suffix=".yaml")
        os.close(fd)
        write_tiers_file(cfg, tiers_file, with_secrets=True)
    out: dict = {"to": to, "mode": mode, "dataset_id": ds.id, "dataset_bytes": manifest.total_bytes,
                 "shards": len(manifest.shards), "rank_shards": len(mine)}
    try:
        t0 = now_ns()
        if mode == "prestage":
            rep = mgr.prestage(ds, to, mine, progress=progress)
            out["staging"] = rep.metrics()
        src = TierSource(tiers_file, "ondemand" if mode != "stream" else "stream", manifest, backend, to=to,
                         dataset_url=url, trace_path=trace_path)
        src.config = cfg  # the in-memory config (it may carry overrides the file does not)
        if mode == "prestage":
            src.staging = "prestage"
        src.open()
        per_epoch = []
        try:
            n = len(mine)
            for e in range(epochs):
                order = [mine[i] for i in epoch_order(n, seed, e)]
                hits_before = _count(src.trace_path, "hit")
                te = now_ns()
                with ThreadPoolExecutor(max_workers=readers) as pool:
                    nbytes = sum(len(b) for b in pool.map(src.read_shard, order))
                sec = (now_ns() - te) / 1e9
                hits = _count(src.trace_path, "hit") - hits_before
                per_epoch.append({"epoch": e, "seconds": sec, "bytes": nbytes,
                                  "bytes_per_s": nbytes / sec if sec > 0 else 0.0, "hit_ratio": hits / n if n else 0.0})
        finally:
            src.close()
        out["total_s"] = (now_ns() - t0) / 1e9
        out["epochs"] = per_epoch
        if epochs:
            out["reads"] = summarize_trace(src.trace_path)
        out["tiers"] = mgr.usage()
        out["counters"] = mgr.counters()
        out["trace"] = src.trace_path
        if results is not None:
            results.metrics.update(out)
            results.environment["tiers"] = cfg.describe()["tiers"]
            results.environment["emulation"] = {t.name: t.emulation for t in cfg.tiers if t.emulation != "none"}
            results.environment["source"] = backend.describe()
        return out
    finally:
        mgr.close()
        if owns_file:
            os.unlink(tiers_file)


def _count(path: str, result: str) -> int:
    import json

    n = 0
    try:
        with open(path) as f:
            for line in f:
                if f'"result":"{result}"' in line and json.loads(line).get("result") == result:
                    n += 1
    except FileNotFoundError:
        pass
    return n


def merge_stage_ranks(per_rank: list[dict], hosts: list[str]) -> dict:
    """World view of a multi-rank stage: each rank staged and read its own shards."""
    from ..dist.aggregate import MergeSpec, merge

    spec = MergeSpec(duration="total_s",
                     sums=("rank_shards", "staging.bytes", "staging.staged_shards", "staging.already_present_shards",
                           "staging.evictions", "staging.refetches", "staging.concurrency"),   # copies in flight: all ranks'
                     maxes=("staging.seconds",), spreads=("staging.bytes_per_s", "staging.seconds"))
    out = merge(per_rank, spec, hosts)
    st = out.get("staging")
    if st and st.get("seconds"):
        st["bytes_per_s"] = st["bytes"] / st["seconds"]   # total over the slowest rank's staging time
    epochs = []
    for e in range(min(len(m.get("epochs", [])) for m in per_rank)):
        rows = [m["epochs"][e] for m in per_rank]
        sec = max(r["seconds"] for r in rows)
        nbytes = sum(r["bytes"] for r in rows)
        shards = [m.get("rank_shards", 0) for m in per_rank]
        hits = sum(r["hit_ratio"] * n for r, n in zip(rows, shards))
        epochs.append({"epoch": e, "seconds": sec, "bytes": nbytes, "bytes_per_s": nbytes / sec if sec > 0 else 0.0,
                       "hit_ratio": hits / sum(shards) if sum(shards) else 0.0,
                       "seconds_by_rank": [r["seconds"] for r in rows]})
    out["epochs"] = epochs
    return out
