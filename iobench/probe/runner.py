"""Run a set of probes on one or more tiers and gather them into one results object.

Every probe writes ``metrics.tiers.<tier>.<probe>`` and the per-tier table goes to
``metrics.summary.<tier>``; this one layout serves ``iobench probe <probe>``, ``iobench
probe all`` and the suite stage, so the report and planner read any of them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import build, to_dict
from ..errors import ConfigError
from ..results import Results
from .summary import tier_row

PROBES = ("file", "metadata", "smallfiles", "s3")


def config_class(probe: str):
    if probe == "file":
        from .file_probe import FileProbeConfig

        return FileProbeConfig
    if probe == "metadata":
        from .metadata import MetadataConfig

        return MetadataConfig
    if probe == "smallfiles":
        from .smallfiles import SmallFilesConfig

        return SmallFilesConfig
    if probe == "s3":
        from .s3_probe import S3ProbeConfig

        return S3ProbeConfig
    raise ConfigError("probe", f"unknown probe {probe!r}", "use one of: " + ", ".join(PROBES))


# A few seconds per probe: what `iobench run` and `iobench probe all --quick` use.
QUICK = {
    "file": {"rw": ["read", "write", "randread"], "bs": ["4KiB", "1MiB"], "qd": [1, 16], "io": ["direct"],
             "runtime": "0.1s", "file_size": "32MiB"},
    "metadata": {"files": 1000, "workers": 4, "dirs": 4},
    "smallfiles": {"samples": 200, "modality": "images", "image_width": 160, "image_height": 120,
                   "shard_formats": ["tar", "raw"], "shard_size": "1MiB", "workers": 4},
    "s3": {"sizes": ["4KiB", "1MiB", "4MiB"], "concurrency": [1, 4], "runtime": "0.2s",
           "ops": ["put", "get", "range"], "range_size": "64KiB"},
}
QUICK_S3_METADATA = {"files": 60, "workers": 4, "dirs": 2}


def build_config(probe: str, mapping: dict | None, quick: bool = False, protocol: str = "file"):
    base = dict(QUICK_S3_METADATA if (quick and probe == "metadata" and protocol == "s3") else
                QUICK.get(probe, {}) if quick else {})
    base.update(mapping or {})
    return build(config_class(probe), base, probe)


def default_probes(protocol: str) -> list[str]:
    return ["s3", "metadata", "smallfiles"] if protocol == "s3" else ["file", "metadata", "smallfiles"]


@dataclass(frozen=True)
class Target:
    tier: str
    url: str


def parse_target(text: str, index: int = 0) -> Target:
    """'nvme=/mnt/nvme/probe' or a bare URL (tier 'local' / 'object' by scheme)."""
    name, sep, url = text.partition("=")
    if sep and "://" not in name and "/" not in name:
        if not name.strip():
            raise ConfigError("URL", f"{text!r} has an empty tier name", "use NAME=URL, e.g. nvme=/mnt/nvme/p")
        return Target(name.strip(), url)
    url = text
    base = "object" if url.startswith("s3://") else "local"
    return Target(base if index == 0 else f"{base}{index + 1}", url)


def check_target(target: Target, probes: list[str]) -> None:
    is_s3 = target.url.startswith("s3://")
    if is_s3 and "file" in probes:
        raise ConfigError("probe file", f"{target.url} is an object store", "use `iobench probe s3` for s3:// URLs")
    if not is_s3 and "s3" in probes:
        raise ConfigError("probe s3", f"{target.url} is not an s3:// URL", "give s3://bucket/prefix")


def run_tier(results: Results, target: Target, probes: list[str], configs: dict, size_cap: int, force: bool,
             endpoint_url: str | None = None, storage_options: dict | None = None, progress=None) -> dict:
    """Run ``probes`` on one tier; fills results.metrics.tiers/summary and environment; returns the tier's metrics."""
    from .file_probe import run_file_probe
    from .metadata import run_metadata_probe
    from .s3_probe import run_s3_probe
    from .s3ops import probe_storage_options
    from .safety import ProbeArea
    from .smallfiles import run_smallfiles_probe

    check_target(target, probes)
    is_s3 = target.url.startswith("s3://")
    opts = None
    if is_s3:
        conc = [1]
        if "s3" in configs:
            conc += list(configs["s3"].concurrency)
        if "metadata" in configs:
            conc.append(configs["metadata"].workers)
        opts = probe_storage_options(storage_options, max(conc))
    tier_metrics: dict = {}
    tier_env: dict = {}
    with ProbeArea.open(target.url, size_cap, force=force, endpoint_url=endpoint_url, storage_options=opts) as area:
        tier_env["area"] = area.describe()
        for probe in probes:
            cfg = configs[probe]
            if probe == "file":
                out = run_file_probe(area, cfg, progress)
            elif probe == "metadata":
                out = run_metadata_probe(area, cfg)
            elif probe == "smallfiles":
                out = run_smallfiles_probe(area, cfg, progress, storage_options=opts, endpoint_url=endpoint_url)
            else:
                out = run_s3_probe(area, cfg, progress)
            tier_metrics[probe] = out["metrics"]
            tier_env[probe] = out["environment"]
            for w in out["warnings"]:
                results.warn(f"{target.tier}: {w}")
    results.metrics.setdefault("tiers", {})[target.tier] = tier_metrics
    results.metrics.setdefault("summary", {})[target.tier] = tier_row(tier_metrics)
    # A tier-independent path for the planner (`iobench plan --from probe.json`): the first tier probed.
    results.metrics.setdefault("headline", {"tier": target.tier, **tier_row(tier_metrics)})
    results.environment.setdefault("tiers", {})[target.tier] = tier_env
    results.config.setdefault("tiers", {})[target.tier] = {
        "url": target.url, "probes": {p: to_dict(configs[p]) for p in probes}}
    return tier_metrics
