"""`iobench check`: "will my storage stall training?" in one command.

1. The dataset: the user's own (``--dataset URL``; one without a manifest is indexed into the
   cache directory, never into the data), or a synthetic one generated under TARGET in a fresh
   ``iobench-check-XXXX`` prefix that is removed at the end (nothing else is touched).
2. The load the user trains with — their step time, workers, batch and prefetch depth — from
   cold storage (the dataset's pages dropped, residency measured before and after), until the
   stall and P99 intervals are narrow or ``--max-time`` passes, through the one measurement
   driver (``iobench.driver``): what storage delivered counts every byte read, buffer fills
   included; beside it, this host's ceiling (the same pipeline on data in memory).
3. The verdict first: ``at 180 ms/step, batch 256, 8 workers: stall 0.4% (±0.2 pp), storage
   delivers 2.1 GiB/s of the 0.6 GiB/s you need; prefetch depth 2 is enough (...); cold: 0.2%
   of the dataset resident; host ceiling 3.0 GiB/s``.
"""

from __future__ import annotations

from .schema import STALL_RATIO
from dataclasses import dataclass

from .errors import ConfigError
from .units import format_bytes, format_rate, format_seconds

@dataclass(frozen=True)
class CheckConfig:
    step_s: float
    batch_size: int = 32
    workers: int = 2
    prefetch: int = 2
    steps: int | None = None           # fixed steps; None: until the intervals are narrow or max_time_s
    until_stable: bool | None = None   # None: unless steps is given; with steps: stop early once stable
    min_steps: int = 50
    max_time_s: float = 60.0
    target: str | None = None          # where to generate a synthetic dataset
    dataset: str | None = None         # the user's dataset (indexed into the cache directory if it has no manifest)
    sample_bytes: int = 128 * 1024     # synthetic samples (tokens: sample_bytes / 2 uint16 tokens)
    samples: int | None = None         # synthetic dataset size (default: enough for the time cap, within 1 GiB)
    format: str = "raw"
    cache: str = "cold"                # cold: storage numbers; warm: page-cache numbers, said so; as-is
    max_stall: float | None = None
    emulate: str = "none"              # storage emulation (iobench.wrappers), e.g. "bw:400MiB/s": a known ceiling
    host_ceiling: str = "cached"       # cached | measure | off (iobench.driver.host_ceiling)

    def __post_init__(self) -> None:
        if (self.target is None) == (self.dataset is None):
            raise ConfigError("TARGET/--dataset", "give exactly one", "a directory/URL to test, or --dataset URL")
        if self.step_s <= 0:
            raise ConfigError("--step-time", f"must be above zero, got {self.step_s}", "e.g. --step-time 180ms")
        for name in ("batch_size", "workers", "prefetch", "sample_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')}", f"must be positive, got {getattr(self, name)}",
                                  "give a number above zero")
        if self.steps is not None and self.steps <= 0:
            raise ConfigError("--steps", f"must be positive, got {self.steps}", "give a number above zero")
        if self.min_steps < 2:
            raise ConfigError("--min-steps", f"must be at least 2, got {self.min_steps}", "e.g. --min-steps 50")
        if self.max_time_s <= 0:
            raise ConfigError("--max-time", f"must be above zero, got {self.max_time_s}", "e.g. --max-time 60s")
        if self.max_stall is not None and not 0 <= self.max_stall <= 1:
            raise ConfigError("--max-stall", f"must be between 0 and 1, got {self.max_stall}", "e.g. 0.05")
        from .wrappers import parse_emulation

        parse_emulation(self.emulate)   # a bad spec is refused before anything is generated

    def drive_config(self):
        """The driver's config for this check (``iobench.driver.DriveConfig``)."""
        from .config import build
        from .driver import DriveConfig, Synthetic
        from .loader.core import LoadConfig

        fixed = self.steps is not None
        load = build(LoadConfig, {"dataset": self.dataset or self.target, "workers": self.workers,
                                  "batch_size": self.batch_size, "prefetch": self.prefetch, "cache": self.cache,
                                  "emulate": self.emulate, "compute": f"{self.step_s * 1e3}ms",
                                  "steps": self.steps or 0,
                                  "until_stable": not fixed if self.until_stable is None else self.until_stable,
                                  "min_steps": self.min_steps, "max_time_s": self.max_time_s}, "load")
        syn = None if self.target is None else Synthetic(target=self.target, format=self.format,
                                                         sample_bytes=self.sample_bytes, samples=self.samples)
        return DriveConfig(load=load, synthetic=syn, host_ceiling=self.host_ceiling)


def _stall_text(metrics: dict) -> str:
    stall = metrics[STALL_RATIO]
    hw = ((metrics.get("intervals") or {}).get(STALL_RATIO) or {}).get("half_width")
    return f"{stall:.1%}" + (f" (±{hw * 100:.1f} pp)" if isinstance(hw, (int, float)) else " (no interval: too few steps)")


def _prefetch_text(cfg: CheckConfig, metrics: dict, stalled: bool) -> str:
    """The prefetch advice, only where the run measured enough batches for it; else the interval."""
    rec = metrics.get("prefetch_recommendation") or {}
    depth = rec.get("depth_total") or rec.get("depth_min")
    if not depth:
        return ""
    p99 = (metrics.get("intervals") or {}).get("batch_service_p99_s") or {}
    if p99 and p99.get("high") is None:
        n = metrics.get("steps", 0)
        if not stalled:
            return f"prefetch depth {cfg.prefetch} kept up over {n} batches (too few for a P99 bound)"
        low = p99.get("low")
        return (f"P99 batch time ≥ {format_seconds(low)}" if low else "P99 batch time unknown") + \
            f" ({n} batches: too few for its upper bound, so no prefetch advice)"
    mem = format_bytes(rec.get("host_bytes_loader") or rec.get("host_bytes_total") or 0)
    if not stalled:
        return f"prefetch depth {cfg.prefetch} is enough (the P99 tail asks for {depth}, host memory {mem})"
    return f"prefetch depth {depth} is needed (host memory {mem})"


def verdict_line(cfg: CheckConfig, outcome) -> str:
    """The sentence a user acts on (see module docstring).

    When the loop stalled and received clearly less than storage + loader can deliver, the line
    says so; when the host, not the storage, was the limit, it says the answer is a lower bound;
    the cause named is the one a remedy must address (``iobench.driver.judge``); the cache state
    and a material warm-up are stated, never left implicit."""
    from .driver import cache_phrase, ceiling_phrase, warmup_phrase

    m, r, j = outcome.metrics, outcome.rates, outcome.judgement
    stall = m[STALL_RATIO]
    line = (f"at {format_seconds(cfg.step_s)}/step, batch {cfg.batch_size}, {cfg.workers} "
            f"worker{'s' if cfg.workers > 1 else ''}: stall {_stall_text(m)}")
    if r.capacity_bytes_per_s:
        line += f", storage delivers {format_rate(r.capacity_bytes_per_s)}"
        amp = r.read_amplification
        if amp and amp > 1.2 and r.payload_bytes_per_s:
            # like with like: the need is in samples' bytes, and this format reads each sample's more than once
            line += f" ({format_rate(r.payload_bytes_per_s)} of samples: {amp:.1f}x read per sample byte)"
        line += f" of the {format_rate(r.need_bytes_per_s)} you need"
        feed = r.payload_bytes_per_s or r.capacity_bytes_per_s
        if r.delivered_bytes_per_s and stall > 0.01 and r.delivered_bytes_per_s < 0.9 * feed:
            line += f", but the loop received {format_rate(r.delivered_bytes_per_s)}"
    parts = []
    if j.cause not in ("none", "the host's read path"):
        parts.append(f"limit: {j.cause} ({j.advice})")
    pf = _prefetch_text(cfg, m, stall > 0.01)
    if pf and j.cause in ("none", "slow tail"):
        parts.append(pf)
    rec = m.get("prefetch_recommendation") or {}
    w = rec.get("workers_recommended")
    if stall > 0.01 and w and w != cfg.workers and j.cause in ("per-request latency", "CPU preparation", "slow tail"):
        parts.append(f"{w} worker{'s' if w > 1 else ''} would do")
    for extra in (warmup_phrase(outcome.warmup, m.get("access", "")), ceiling_phrase(outcome),
                  cache_phrase(outcome.cache)):
        if extra:
            parts.append(extra)
    return "; ".join([line] + parts)


def run_check(cfg: CheckConfig, *, endpoint_url: str | None = None, storage_options: dict | None = None,
              progress: bool = False, say=print) -> tuple[dict, dict]:
    """Run the check; returns the results' metrics (``verdict`` first) and environment."""
    from dataclasses import replace

    from .driver import drive
    from .loader.analysis import recommend

    dc = cfg.drive_config()
    dc = replace(dc, load=replace(dc.load, endpoint_url=endpoint_url))
    o = drive(dc, storage_options, progress, say)
    metrics = dict(o.metrics)
    metrics["prefetch_recommendation"] = recommend(metrics, cfg.step_s)
    o = replace(o, run=replace(o.run, metrics=metrics))
    r = o.rates
    out = {"verdict": verdict_line(cfg, o), STALL_RATIO: metrics[STALL_RATIO],
           "stall_interval": (metrics.get("intervals") or {}).get(STALL_RATIO),
           "capacity_bytes_per_s": r.capacity_bytes_per_s, "need_bytes_per_s": r.need_bytes_per_s,
           "delivered_bytes_per_s": r.delivered_bytes_per_s, "payload_bytes_per_s": r.payload_bytes_per_s,
           "bound": o.judgement.bound, "cause": o.judgement.cause,
           "host_ceiling_bytes_per_s": o.ceiling.bytes_per_s if o.ceiling else None,
           "prefetch_recommendation": metrics["prefetch_recommendation"],
           "passed": None if cfg.max_stall is None else metrics[STALL_RATIO] <= cfg.max_stall,
           "drive": o.to_dict(),
           "load": {k: v for k, v in metrics.items() if k not in ("series", "system")},
           "dataset": {"url": o.dataset.url, "generated": o.dataset.generated, "format": o.dataset.format,
                       "indexed_to": o.dataset.indexed_to}}
    warnings = list(o.warnings)
    if r.compute_s is not None and r.compute_s > 1.2 * cfg.step_s:
        # a sleep overshoots on a busy host: the stall is then judged against a longer step than yours
        warnings.append(f"the emulated {format_seconds(cfg.step_s)} step took {format_seconds(r.compute_s)} on "
                        "average (busy host?): the stall is judged against that longer step, so yours "
                        "may stall more")
    return out | {"warnings": warnings}, o.environment
