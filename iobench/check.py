"""`iobench check`: "will my storage stall training?" in one command.

1. The dataset: the user's own (``--dataset URL``, with an iobench manifest — ``iobench index``
   makes one), or a synthetic one generated under TARGET in a fresh ``iobench-check-XXXX``
   prefix that is removed at the end (nothing else is touched).
2. The load the user trains with: their step time, workers, batch and prefetch depth; the
   loader's stall with its interval, and its workers/depth advice (``recommend``).
   What storage + loader can deliver is W x batch bytes / median batch service time (storage +
   prep per batch, measured at the workers); what training needs is batch bytes / step time.
3. The verdict first: ``at 180 ms/step, batch 256, 8 workers: stall 0.4% (±0.2 pp), storage
   delivers 2.1 GiB/s of the 0.6 GiB/s you need; prefetch depth 3 is enough (host memory 1.5 GiB)``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from .errors import ConfigError
from .units import format_bytes, format_rate, format_seconds


@dataclass(frozen=True)
class CheckConfig:
    step_s: float
    batch_size: int = 32
    workers: int = 2
    prefetch: int = 2
    steps: int = 60
    target: str | None = None          # where to generate a synthetic dataset
    dataset: str | None = None         # the user's dataset (has a manifest)
    sample_bytes: int = 128 * 1024     # synthetic samples (tokens: sample_bytes / 2 uint16 tokens)
    samples: int | None = None         # synthetic dataset size (default: enough for `steps` batches, capped)
    format: str = "raw"
    cache: str = "as-is"
    max_stall: float | None = None

    def __post_init__(self) -> None:
        if (self.target is None) == (self.dataset is None):
            raise ConfigError("TARGET/--dataset", "give exactly one", "a directory/URL to test, or --dataset URL")
        if self.step_s <= 0:
            raise ConfigError("--step-time", f"must be above zero, got {self.step_s}", "e.g. --step-time 180ms")
        for name in ("batch_size", "workers", "prefetch", "steps", "sample_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')}", f"must be positive, got {getattr(self, name)}",
                                  "give a number above zero")
        if self.max_stall is not None and not 0 <= self.max_stall <= 1:
            raise ConfigError("--max-stall", f"must be between 0 and 1, got {self.max_stall}", "e.g. 0.05")


def verdict_line(cfg: CheckConfig, metrics: dict, capacity_bps: float | None) -> str:
    """The sentence a user acts on (see module docstring)."""
    stall = metrics["stall_ratio"]
    iv = (metrics.get("intervals") or {}).get("stall_ratio") or {}
    hw = iv.get("half_width")
    stall_s = f"{stall:.1%}" + (f" (±{hw * 100:.1f} pp)" if isinstance(hw, (int, float)) else " (no interval: too few steps)")
    need = (metrics.get("batch_bytes") or 0) / cfg.step_s
    line = (f"at {format_seconds(cfg.step_s)}/step, batch {cfg.batch_size}, {cfg.workers} "
            f"worker{'s' if cfg.workers > 1 else ''}: stall {stall_s}")
    if capacity_bps:
        line += f", storage delivers {format_rate(capacity_bps)} of the {format_rate(need)} you need"
    rec = metrics.get("prefetch_recommendation") or {}
    depth = rec.get("depth_total") or rec.get("depth_min")
    mem = format_bytes(rec.get("host_bytes_loader") or rec.get("host_bytes_total") or 0)
    if depth and stall <= 0.01:
        line += f"; prefetch depth {cfg.prefetch} is enough (the P99 tail asks for {depth}, host memory {mem})"
    elif depth:
        line += f"; prefetch depth {depth} is needed (host memory {mem})"
        w = rec.get("workers_recommended")
        if w and w != cfg.workers:
            line += f"; {w} worker{'s' if w > 1 else ''} would do"
    return line


def run_check(cfg: CheckConfig, *, endpoint_url: str | None = None, storage_options: dict | None = None,
              progress: bool = False, say=print) -> dict:
    """Run the check; returns the results' metrics (``verdict`` first)."""
    from .config import build
    from .generate import GenSpec, generate
    from .loader.analysis import recommend
    from .loader.core import LoadConfig, run_load
    from .storage import open_backend

    created = None
    url = cfg.dataset
    try:
        if url is None:
            base = open_backend(cfg.target, endpoint_url=endpoint_url, storage_options=storage_options,
                                field_name="TARGET", check=True)
            name = f"iobench-check-{secrets.token_hex(4)}"
            url = f"{cfg.target.rstrip('/')}/{name}"
            created = (base, name)
            n = cfg.samples or min(cfg.batch_size * (cfg.steps + 2), max(cfg.batch_size * 4, (1 << 30) // cfg.sample_bytes))
            spec = GenSpec.from_mapping({"format": cfg.format, "modality": "tokens", "num_samples": n,
                                         "seq_len": max(1, cfg.sample_bytes // 2), "token_dtype": "uint16",
                                         "vocab_size": 50257})
            say(f"generating {n} samples ({format_bytes(n * cfg.sample_bytes)}) under {url} (removed afterwards)")
            generate(spec, url, endpoint_url=endpoint_url, storage_options=storage_options, progress=progress)
        common = {"dataset": url, "workers": cfg.workers, "batch_size": cfg.batch_size, "cache": cfg.cache,
                  "endpoint_url": endpoint_url}
        load_cfg = build(LoadConfig, {**common, "prefetch": cfg.prefetch, "steps": cfg.steps,
                                      "compute": f"{cfg.step_s * 1e3}ms"}, "load")
        run = run_load(load_cfg, storage_options, progress=progress)
        metrics = dict(run.metrics)
        metrics["prefetch_recommendation"] = recommend(metrics, cfg.step_s)
        # What storage + loader can deliver: each worker produces a batch per median service time
        # (storage + prep, measured at the worker), all workers in parallel.  The median, not the
        # mean: one slow batch in a short run (a page-fault storm, an epoch boundary) would halve
        # a mean; the tail is what the prefetch depth below is for.
        svc = (metrics.get("batch_service_s") or metrics.get("batch_io_s") or {}).get("p50")
        capacity = cfg.workers * (metrics.get("batch_bytes") or 0) / svc if svc else None
        need = (metrics.get("batch_bytes") or 0) / cfg.step_s
        out = {"verdict": verdict_line(cfg, metrics, capacity), "stall_ratio": metrics["stall_ratio"],
               "stall_interval": (metrics.get("intervals") or {}).get("stall_ratio"),
               "capacity_bytes_per_s": capacity, "need_bytes_per_s": need,
               "prefetch_recommendation": metrics["prefetch_recommendation"],
               "passed": None if cfg.max_stall is None else metrics["stall_ratio"] <= cfg.max_stall,
               "load": {k: v for k, v in metrics.items() if k not in ("series", "system")},
               "dataset": {"url": url, "generated": created is not None}}
        return out | {"warnings": list(run.warnings)}
    finally:
        if created is not None:
            base, name = created
            try:
                if base.fs.exists(base.path(name)):
                    base.fs.rm(base.path(name), recursive=True)
            except Exception as e:  # noqa: BLE001 - say what is left; do not hide the check's own error
                say(f"warning: could not remove {url} ({type(e).__name__}); remove it by hand")
