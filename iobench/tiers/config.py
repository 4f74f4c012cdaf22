"""Tier configuration: an ordered list of tiers (hottest first) read from YAML or built in code.

A tiers file looks like::

    catalog: /var/tmp/iobench/catalog.sqlite   # optional; default: <first local tier>/.iobench/catalog.sqlite
    concurrency: 8                             # parallel copies when staging
    retries: 3                                 # attempts per shard copy before a clear error
    tiers:
      - {name: nvme, url: /mnt/nvme/iobench, capacity: 2TB, policy: lru}
      - {name: pfs, url: /lustre/iobench, capacity: 50TB, policy: lru, emulation: pfs}
      - {name: object, url: s3://bucket/datasets, endpoint_url: http://minio:9000}

A tier without ``capacity`` is unbounded and is never evicted from (the source of truth).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..config import build, check_choice, load_yaml_file, nearest
from ..errors import ConfigError
from ..units import parse_duration, parse_size

POLICIES = ("lru", "fifo", "pin-once-full")
TIERS_FILE_MARK = "# iobench tiers file"   # first line of what `tiers init` writes (the output guard knows it)
EMULATION_PROFILES = ("none", "nvme", "pfs", "object")


@dataclass(frozen=True)
class TierSpec:
    name: str
    url: str
    capacity: str | int | None = None      # bytes or "64GiB"; None = unbounded
    policy: str = "lru"
    emulation: str = "none"                # a profile (nvme, pfs, object) or spec, e.g. pfs+bw:1GB/s
    endpoint_url: str | None = None
    storage_options: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        field_ = f"tiers.{self.name or '?'}"
        if not self.name or not str(self.name).replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"{field_}.name", f"{self.name!r} is not a usable tier name",
                              "use letters, digits, '-' or '_'")
        if not self.url:
            raise ConfigError(f"{field_}.url", "is empty", "give a local path, s3://bucket/prefix or memory://name")
        scheme = str(self.url).split("://", 1)[0].lower() if "://" in str(self.url) else "file"
        from fsspec.registry import known_implementations, registry

        if scheme not in registry and scheme not in known_implementations:
            raise ConfigError(f"{field_}.url", f"unknown URL scheme {scheme!r}",
                              "use a local path, s3://, memory:// or a protocol an installed fsspec package provides")
        check_choice(f"{field_}.policy", self.policy, POLICIES)
        if self.emulation not in EMULATION_PROFILES:   # a spec in --emulate's vocabulary, e.g. bw:1GB/s
            from ..wrappers import parse_emulation

            try:
                parse_emulation(self.emulation)
            except ConfigError as e:
                raise ConfigError(f"{field_}.emulation", e.problem,
                                  f"use a profile ({', '.join(p for p in EMULATION_PROFILES if p != 'none')}) "
                                  "or a spec such as pfs+bw:1GB/s") from None
        if self.endpoint_url:
            from ..storage import check_endpoint_url

            check_endpoint_url(str(self.endpoint_url), f"{field_}.endpoint_url")   # no user:password@, a port, a host
        if self.capacity is not None and str(self.capacity).lower() not in ("unbounded", "none", "inf"):
            object.__setattr__(self, "capacity", parse_size(self.capacity, f"{field_}.capacity"))
        else:
            object.__setattr__(self, "capacity", None)

    @property
    def capacity_bytes(self) -> int | None:
        return self.capacity  # type: ignore[return-value]

    @property
    def bounded(self) -> bool:
        return self.capacity is not None

    def describe(self) -> dict:
        return {"name": self.name, "url": self.url, "capacity_bytes": self.capacity, "policy": self.policy,
                "emulation": self.emulation, "endpoint_url": self.endpoint_url}


@dataclass(frozen=True)
class TiersConfig:
    tiers: tuple[TierSpec, ...]
    catalog: str = ""                      # SQLite file; default <first local tier>/.iobench/catalog.sqlite
    concurrency: int = 0                   # parallel copies; 0: one per core, at most one per shard
    retries: int = 3
    retry_backoff: str | float = "0.2s"    # first back-off; doubles each attempt
    verify: bool = True                    # check each copy's checksum on arrival
    trace_dir: str = ""                    # where loader sources write access traces; default beside the catalog

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError("tiers", "no tiers given", "list at least one tier (hottest first)")
        names = [t.name for t in self.tiers]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError("tiers", f"tier name {sorted(dup)[0]!r} is used twice", "give each tier its own name")
        if self.concurrency < 0:
            raise ConfigError("concurrency", f"must be 0 (one per core) or more, got {self.concurrency}", "use e.g. 4")
        from ..bounds import THREADS, Bound

        # the same bounds as the flags' (iobench.bounds): a tiers file is typed input too
        if self.concurrency:
            THREADS.check("concurrency", self.concurrency)
        Bound(1, 100).check("retries", self.retries)
        from ..paths import Held, check_disjoint, root_key

        # One root per tier: an evict of one of two overlapping tiers would delete the other's copies.
        check_disjoint((Held(f"tiers.{t.name}.url", "tiers", root_key(t.url), t.url) for t in self.tiers),
                       "give each tier its own directory or prefix, neither inside another")
        if self.retries < 1:
            raise ConfigError("retries", f"must be at least 1, got {self.retries}", "use e.g. 3")
        object.__setattr__(self, "retry_backoff", parse_duration(self.retry_backoff, "retry_backoff"))
        if not self.catalog:
            local = [t for t in self.tiers if "://" not in t.url or t.url.startswith("file://")]
            if not local:
                raise ConfigError("catalog", "no local tier to keep the catalog beside",
                                  "set catalog: /path/to/catalog.sqlite")
            object.__setattr__(self, "catalog", default_catalog(local))
        cat = os.path.abspath(self.catalog)
        for t in self.tiers:
            if t.bounded and ("://" not in t.url or t.url.startswith("file://")):
                root = _local_root(t)
                if cat.startswith(root.rstrip(os.sep) + os.sep):
                    raise ConfigError("catalog", f"{self.catalog} is inside tier {t.name!r}, whose capacity "
                                      "would not count it", "put the catalog outside every bounded tier "
                                      "(or omit it: the default is outside)")
        if not self.trace_dir:
            object.__setattr__(self, "trace_dir", os.path.join(os.path.dirname(self.catalog), "traces"))

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tiers]

    def tier(self, name: str, field_name: str = "--to") -> TierSpec:
        for t in self.tiers:
            if t.name == name:
                return t
        raise ConfigError(field_name, f"no tier named {name!r}", nearest(name, self.names))

    def describe(self) -> dict:
        return {"catalog": self.catalog, "concurrency": self.concurrency, "retries": self.retries,
                "verify": self.verify, "tiers": [t.describe() for t in self.tiers]}


def _local_root(t: TierSpec) -> str:
    return os.path.abspath(t.url[len("file://"):] if t.url.startswith("file://") else t.url)


def default_catalog(local: list[TierSpec]) -> str:
    """Where the catalog lives when the tiers file names none: never inside a bounded tier.

    A catalog (SQLite + WAL) inside a tier with a capacity is bytes the capacity does not
    see.  So it goes into the first *unbounded* local tier (``<tier>/.iobench/``), or, when
    every local tier is bounded, into a hidden sibling of the first one
    (``<parent>/.<name>.iobench/``), outside every tier."""
    for t in local:
        if not t.bounded:
            return os.path.join(_local_root(t), ".iobench", "catalog.sqlite")
    root = _local_root(local[0])
    parent, name = os.path.split(root.rstrip(os.sep))
    return os.path.join(parent, f".{name}.iobench", "catalog.sqlite")


def tiers_from_mapping(data: dict, section: str = "") -> TiersConfig:
    data = dict(data)
    raw = data.get("tiers")
    if isinstance(raw, dict):  # also accept {name: {url: ...}, ...}
        data["tiers"] = [{"name": k, **(v or {})} for k, v in raw.items()]
    elif raw is not None and not isinstance(raw, (list, tuple)):
        raise ConfigError("tiers", f"expected a list of tiers, got {raw!r}", "see README: Tiers")
    return build(TiersConfig, data, section)


def load_tiers(path: str, field_name: str = "--tiers") -> TiersConfig:
    """The tiers file at ``path``; a file holding a ``tiers:`` section inside a bigger config also works."""
    data = load_yaml_file(path, field_name)
    if "tiers" not in data:
        raise ConfigError(field_name, f"{path} has no 'tiers' list", "see README: Tiers")
    return tiers_from_mapping(data)


def default_tiers(nvme_dir: str, pfs_dir: str | None = None, object_url: str | None = None, *,
                  nvme_capacity: str | int | None = None, pfs_capacity: str | int | None = None,
                  endpoint_url: str | None = None, storage_options: dict | None = None,
                  catalog: str = "", policy: str = "lru", concurrency: int = 0) -> TiersConfig:
    """The embedded default: nvme (local dir), pfs (local dir, `pfs` emulation), object (S3 bucket)."""
    tiers = [TierSpec(name="nvme", url=str(nvme_dir), capacity=nvme_capacity, policy=policy)]
    if pfs_dir:
        tiers.append(TierSpec(name="pfs", url=str(pfs_dir), capacity=pfs_capacity, policy=policy, emulation="pfs"))
    if object_url:
        tiers.append(TierSpec(name="object", url=object_url, endpoint_url=endpoint_url,
                              storage_options=dict(storage_options or {})))
    return TiersConfig(tiers=tuple(tiers), catalog=catalog, concurrency=concurrency)


def tiers_to_yaml_dict(cfg: TiersConfig, with_secrets: bool = False) -> dict:
    out: dict = {"catalog": cfg.catalog, "concurrency": cfg.concurrency, "retries": cfg.retries,
                 "verify": cfg.verify, "tiers": []}
    for t in cfg.tiers:
        d: dict = {"name": t.name, "url": t.url, "policy": t.policy}
        if t.capacity is not None:
            d["capacity"] = t.capacity
        if t.emulation != "none":
            d["emulation"] = t.emulation
        if t.endpoint_url:
            d["endpoint_url"] = t.endpoint_url
        if t.storage_options and with_secrets:
            d["storage_options"] = dict(t.storage_options)
        out["tiers"].append(d)
    return out


def write_tiers_file(cfg: TiersConfig, path: str, with_secrets: bool = False) -> str:
    """Write ``cfg`` as YAML (mode 0600 when it holds credentials)."""
    import yaml

    from ..io.atomic import atomic_write_bytes

    text = f"{TIERS_FILE_MARK} (written by `iobench tiers init`; edit freely)\n" + \
        yaml.safe_dump(tiers_to_yaml_dict(cfg, with_secrets), sort_keys=False)
    atomic_write_bytes(path, text.encode())
    if with_secrets:
        os.chmod(path, 0o600)
    return path
