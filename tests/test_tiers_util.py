"""Helpers for the tiers tests: small real datasets (shards + manifest.json) on any backend."""

from __future__ import annotations

import os

import xxhash

from iobench.manifest import Manifest, ShardEntry, write_manifest
from iobench.storage import open_backend
from iobench.tiers.config import TiersConfig, TierSpec


def make_dataset(url: str, shards: int = 8, shard_bytes: int = 64 * 1024, seed: int = 0,
                 storage_options: dict | None = None, endpoint_url: str | None = None) -> Manifest:
    """Write ``shards`` random shards and a manifest at ``url``; returns the manifest."""
    import numpy as np

    b = open_backend(url, endpoint_url=endpoint_url, storage_options=storage_options)
    b.makedirs()
    rng = np.random.default_rng(seed)
    entries = []
    for i in range(shards):
        data = rng.integers(0, 256, shard_bytes, dtype=np.uint8).tobytes()
        path = f"shard-{i:05d}.bin"
        b.write_bytes(path, data, fsync=False)
        entries.append(ShardEntry(path=path, bytes=len(data), samples=1, checksum="xxh64:" + xxhash.xxh64(data).hexdigest(),
                                  first_sample=i))
    m = Manifest(format="raw", modality="tokens", compression="none", seed=seed, spec={}, shards=tuple(entries))
    write_manifest(b, m)
    return m


def local_tiers(tmp_path, nvme_capacity=None, policy="lru", pfs: bool = False, pfs_capacity=None,
                source_dir=None, **kw) -> TiersConfig:
    tiers = [TierSpec(name="nvme", url=str(tmp_path / "nvme"), capacity=nvme_capacity, policy=policy)]
    if pfs:
        tiers.append(TierSpec(name="pfs", url=str(tmp_path / "pfs"), capacity=pfs_capacity, policy=policy))
    if source_dir is not None:
        tiers.append(TierSpec(name="object", url=str(source_dir)))
    return TiersConfig(tiers=tuple(tiers), catalog=str(tmp_path / "catalog.sqlite"), **kw)


def tier_files(root) -> dict[str, int]:
    """Every file under a tier directory (temp files included), catalog excluded: rel -> size."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if rel.startswith(".iobench"):
                continue
            try:
                out[rel] = os.path.getsize(full)
            except FileNotFoundError:
                pass
    return out
