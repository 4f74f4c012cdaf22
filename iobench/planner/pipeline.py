"""Data-pipeline models (the domain models' chapter 4, Eq. 4.1–4.3: docs/design.md) and the loader's CPU and memory sizing.

Every function is pure and takes SI units: bytes, seconds, bytes/s, ratios 0–1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def required_bandwidth(n_accelerators: int, eta_target: float, batch_bytes: float, step_s: float) -> float:
    """Eq. 4.1: bytes/s the pipeline must deliver so N accelerators reach utilization η."""
    return n_accelerators * eta_target * batch_bytes / step_s


@dataclass(frozen=True)
class StallModel:
    step_s: float
    stall_ratio: float


def data_stall(compute_s: float, io_s: float, pipelined: bool) -> StallModel:
    """Eq. 4.2: serial T_step = compute + io; pipelined T_step = max(compute, io)."""
    step = max(compute_s, io_s) if pipelined else compute_s + io_s
    return StallModel(step_s=step, stall_ratio=(step - compute_s) / step if step > 0 else 0.0)


@dataclass(frozen=True)
class PrefetchPlan:
    depth_min: int             # ceil(P99 I/O / compute), at least 1
    depth_recommended: int     # depth_min plus the safety margin
    host_bytes_per_consumer: float
    host_bytes_total: float


def prefetch_depth(p99_io_s: float, compute_s: float, batch_bytes: float = 0.0, consumers: int = 1,
                   margin: int = 2) -> PrefetchPlan:
    """Eq. 4.3: Q_min = ceil(P99 I/O time / compute time); memory = depth × batch bytes × consumers."""
    if compute_s <= 0:
        raise ValueError("compute time must be positive to size a prefetch queue")
    # A hair of tolerance so that 0.4000000001 / 0.2 does not round up to 3.
    q = max(1, math.ceil(p99_io_s / compute_s - 1e-9))
    rec = q + max(0, margin)
    per = rec * batch_bytes
    return PrefetchPlan(depth_min=q, depth_recommended=rec, host_bytes_per_consumer=per,
                        host_bytes_total=per * consumers)


def prefetch_buffer_bytes(depth: int, batch_bytes: float, consumers: int = 1) -> float:
    """Host memory held by ``depth`` prefetched batches for each of ``consumers``."""
    return depth * batch_bytes * consumers


def torch_prefetch_batches(prefetch_factor: int, num_workers: int) -> int:
    """Batches a PyTorch DataLoader keeps in flight: prefetch_factor per worker."""
    return prefetch_factor * num_workers


def decoded_batch_bytes(samples: int, height: int, width: int, channels: int = 3,
                        bytes_per_value: int = 1) -> int:
    """Size of a decoded image batch (uint8 pixels by default)."""
    return samples * height * width * channels * bytes_per_value


def shuffle_buffer_bytes(entries: int, bytes_per_entry: float) -> float:
    """Memory of an in-memory shuffle buffer of ``entries`` decoded samples."""
    return entries * bytes_per_entry


def utilization(compute_s: float, exposed_io_s: float) -> float:
    """Accelerator utilization when ``exposed_io_s`` of each step is not hidden by prefetch."""
    return compute_s / (compute_s + exposed_io_s)


@dataclass(frozen=True)
class CacheGain:
    utilization_remote: float
    utilization_local: float
    gain: float                       # absolute, in utilization (0–1)
    equivalent_accelerators: float    # N × gain: accelerators' worth of work recovered


def local_cache_gain(compute_s: float, io_remote_s: float, io_local_s: float, n_accelerators: int) -> CacheGain:
    """Utilization gained by serving exposed I/O from a local cache instead of remote storage."""
    remote = utilization(compute_s, io_remote_s)
    local = utilization(compute_s, io_local_s)
    return CacheGain(remote, local, local - remote, n_accelerators * (local - remote))


@dataclass(frozen=True)
class LoaderCpu:
    cpu_s_per_s: float        # CPU-seconds of decode work per second of training
    workers: int              # worker processes (workers_per_accelerator × accelerators)
    spare_cores: int          # cores left after one core per worker


def loader_cpu(samples_per_s: float, cpu_s_per_sample: float, accelerators: int = 1,
               workers_per_accelerator: int = 4, cores: int = 0) -> LoaderCpu:
    """How many cores decoding needs at a sample rate, and what the usual worker count leaves."""
    workers = workers_per_accelerator * accelerators
    return LoaderCpu(samples_per_s * cpu_s_per_sample, workers, cores - workers)


@dataclass(frozen=True)
class IopsCap:
    bandwidth_bytes_per_s: float
    iops_required: float
    iops_shortfall: float      # required / device IOPS
    utilization_cap: float     # device IOPS / required, at most 1


def iops_cap(samples_per_s: float, bytes_per_sample: float, device_iops: float,
             reads_per_sample: float = 1.0) -> IopsCap:
    """Random small reads: a device's IOPS, not its bandwidth, caps utilization."""
    need = samples_per_s * reads_per_sample
    return IopsCap(samples_per_s * bytes_per_sample, need, need / device_iops, min(1.0, device_iops / need))


@dataclass(frozen=True)
class DecompressionCpu:
    effective_bytes_per_s: float
    cores: float


def decompression_cpu(raw_bytes_per_s: float, ratio: float, decompress_bytes_per_s_per_core: float
                      ) -> DecompressionCpu:
    """Compressed data multiplies delivered bandwidth, and costs cores to decompress."""
    eff = raw_bytes_per_s * ratio
    return DecompressionCpu(eff, eff / decompress_bytes_per_s_per_core)


@dataclass(frozen=True)
class RunBudget:
    tokens_per_step: int
    iterations: int
    step_budget_s: float
    tokens_per_s: float


def run_budget(total_tokens: float, sequences_per_step: int, seq_len: int, train_s: float) -> RunBudget:
    """The per-step time a run may take to see ``total_tokens`` within ``train_s``."""
    tps = sequences_per_step * seq_len
    it = math.ceil(total_tokens / tps)
    return RunBudget(tps, it, train_s / it, total_tokens / train_s)


@dataclass(frozen=True)
class TokenLoader:
    sequences_per_s: float
    wire_bytes_per_s: float
    workers_min: int


def token_loader(tokens_per_s: float, seq_len: int, bytes_per_token: int, sequences_per_s_per_worker: float
                 ) -> TokenLoader:
    """Sequences per second a text loader must produce, the bytes on the wire and the workers needed."""
    seq = tokens_per_s / seq_len
    return TokenLoader(seq, tokens_per_s * bytes_per_token, math.ceil(seq / sequences_per_s_per_worker - 1e-9))


@dataclass(frozen=True)
class LoaderPlan:
    """DataLoader settings for a measured per-batch service time (``loader_plan``)."""

    workers_min: int           # throughput floor: ceil(E[S] / C)
    workers: int               # num_workers: ceil(E[S] / (rho_max × C)), capped by max_workers
    depth_total: int           # batches in flight W·Q: at least ceil(P99[S] / C) (Eq. 4.3, one producer)
    prefetch_factor: int       # per worker: ceil(depth_total / W)
    host_bytes: float          # (W·Q + 1) batches: in flight, plus the one the step holds
    stall_floor: float         # when capped below workers_min: 1 − W·C / E[S] (no depth helps)
    utilization_per_worker: float   # rho = E[S] / (W·C)


def loader_plan(mean_service_s: float, p99_service_s: float, compute_s: float, batch_bytes: float = 0.0,
                max_workers: int | None = None, rho_max: float = 0.8) -> LoaderPlan:
    """Workers and prefetch depth for a loader whose worker spends ``S`` seconds per batch.

    Model (one consumer, step time C; W workers each making whole batches, batches dealt
    round-robin; PyTorch hands a worker batch k's index once batch k − W·Q was taken):

    - **workers** — throughput: W workers supply W / E[S] batches per second, the step takes
      1 / C, so W ≥ E[S] / C; a worker busy all the time (rho = E[S]/(W·C) → 1) queues, so
      W = ceil(E[S] / (rho_max · C)).  Below E[S] / C the stall is at least 1 − W·C / E[S],
      whatever the depth.
    - **depth** — the tail: a batch whose index arrives W·Q steps before it is needed has
      W·Q·C seconds; to hide a P99 batch, W·Q ≥ ceil(P99[S] / C) — the domain models' Eq. 4.3 for
      one producer (W = 1: Q = ceil(P99 / C)); W producers divide it: Q = ceil(that / W).
    - **memory** — (W·Q + 1) batches of host memory (in flight plus the one in use).

    It assumes S does not grow with W (storage not saturated: a shared bandwidth cap makes
    S grow with W, and then no setting beats 1 − C / (batch bytes / bandwidth)); ``iobench
    load --recommend --validate`` measures the neighbourhood to check.
    """
    if compute_s <= 0:
        raise ValueError("compute time must be positive to size a loader")
    mean_service_s = max(0.0, mean_service_s)
    need = mean_service_s / compute_s
    w_min = max(1, math.ceil(need - 1e-9))
    w = max(1, math.ceil(need / rho_max - 1e-9))
    if max_workers:
        w = min(w, max_workers)
    depth = max(1, math.ceil(p99_service_s / compute_s - 1e-9))
    q = max(1, math.ceil(depth / w - 1e-9))
    floor = max(0.0, 1.0 - w * compute_s / mean_service_s) if mean_service_s > 0 else 0.0
    return LoaderPlan(workers_min=w_min, workers=w, depth_total=w * q, prefetch_factor=q,
                      host_bytes=(w * q + 1) * batch_bytes, stall_floor=floor,
                      utilization_per_worker=mean_service_s / (w * compute_s))
