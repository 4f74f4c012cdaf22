"""Ground-truth drivers for the loader: the discrete-event grid (``iobench.planner.loader_sim``).

``run_cell`` runs the real loader on emulated storage (``iobench.wrappers``) for one cell
of the grid pattern × W × Q × storage × compute and replays the run's recorded per-batch
worker times and consumer times through the model; ``tests/test_loader_sim.py`` and
``benchmarks/bench_fidelity.py`` assert or report measured − predicted.

Storage latencies are scaled so every cell stalls: a batch costs its worker about
``1.25 × W × compute`` (W producers together ~25% short of the consumer), split over the
requests the pattern issues for one batch.
"""

from __future__ import annotations

from ..schema import STALL_RATIO
import itertools
from dataclasses import dataclass
from typing import Any

PATTERNS = ("map", "stream", "block")
WORKERS = (1, 2, 4)
PREFETCH = (1, 2, 4)
STORAGE = ("const", "lognormal", "spike", "bw")
COMPUTE = ("const", "normal")


@dataclass(frozen=True)
class Cell:
    pattern: str
    workers: int
    prefetch: int
    storage: str
    compute: str

    @property
    def name(self) -> str:
        return f"{self.pattern}-W{self.workers}-Q{self.prefetch}-{self.storage}-{self.compute}"


def grid(patterns=PATTERNS, workers=WORKERS, prefetch=PREFETCH, storage=STORAGE, compute=COMPUTE) -> list[Cell]:
    return [Cell(*c) for c in itertools.product(patterns, workers, prefetch, storage, compute)]


def storage_spec(kind: str, batch_io_s: float, requests_per_batch: int, request_bytes: int) -> str:
    """An ``--emulate`` spec whose requests for one batch take about ``batch_io_s`` in all."""
    per = batch_io_s / max(1, requests_per_batch)
    ms = lambda s: f"{s * 1000:.3f}ms"  # noqa: E731
    if kind == "const":
        return f"const:{ms(per)}"
    if kind == "lognormal":
        return f"lognormal:p50={ms(per * 0.8)},p99={ms(per * 2.5)}"
    if kind == "spike":
        return f"const:{ms(per * 0.7)}+spike:p=0.15,extra={ms(per * 2)}"
    if kind == "bw":
        # per worker: the model (planner.loader_sim.draw_io) gives each worker this cap of its own
        return f"bw:{max(1, int(request_bytes / per))}B/s,per=worker"
    raise ValueError(f"unknown storage kind {kind!r}")


def compute_spec(kind: str, compute_s: float) -> str:
    ms = compute_s * 1000
    if kind == "const":
        return f"{ms:.3f}ms"
    if kind == "normal":
        return f"normal:mean={ms:.3f}ms,std={ms / 4:.3f}ms"
    raise ValueError(f"unknown compute kind {kind!r}")


def _requests_per_batch(pattern: str, batch_size: int, shard_samples: int) -> int:
    if pattern == "map":
        return batch_size            # one ranged read per sample
    return max(1, batch_size // max(1, shard_samples)) if shard_samples < batch_size else 1


def load_config(url: str, cell: Cell, *, batch_size: int, shard_samples: int, sample_bytes: int, steps: int,
                compute_s: float, seed: int = 0):
    """The LoadConfig of one grid cell on a dataset of ``shard_samples``-sample shards."""
    from .core import LoadConfig

    nreq = _requests_per_batch(cell.pattern, batch_size, shard_samples)
    req_bytes = sample_bytes if cell.pattern == "map" else sample_bytes * shard_samples
    kw: dict[str, Any] = dict(dataset=url, workers=cell.workers, prefetch=cell.prefetch, batch_size=batch_size, steps=steps,
              compute=compute_spec(cell.compute, compute_s), seed=seed, monitor_interval_s=1.0,
              emulate=storage_spec(cell.storage, 1.25 * cell.workers * compute_s, nreq, req_bytes), access=cell.pattern)
    if cell.pattern == "block":
        kw["shuffle_buffer"] = 0  # one shard per block: a block read is one request
    elif cell.pattern == "stream":
        kw["shuffle_buffer"] = batch_size  # one batch of fill: then each batch out takes its shard in
    return LoadConfig(**kw)


def run_cell(url: str, cell: Cell, **kw) -> dict:
    """Run the loader for one cell and compare its stall with the model's replay of the same run."""
    from ..planner.loader_sim import predict_from_run
    from .core import run_load

    cfg = load_config(url, cell, **kw)
    run = run_load(cfg)
    pred = predict_from_run(run.metrics, cell.pattern, cell.workers, cell.prefetch)
    measured = run.metrics[STALL_RATIO]
    return {"cell": cell.name, "pattern": cell.pattern, "workers": cell.workers, "prefetch": cell.prefetch,
            "storage": cell.storage, "compute": cell.compute, "emulate": cfg.emulate, "compute_spec": cfg.compute,
            "steps": run.metrics["steps"], "measured_stall": measured, "predicted_stall": pred.stall_ratio,
            "diff_pp": 100 * (measured - pred.stall_ratio)}
