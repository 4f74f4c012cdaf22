"""Results documents for tests that need a load's results without running a load.

``load_metrics(**fields)`` is a complete ``iobench.schema.LoadMetrics`` dict (so the file
passes docs/results.schema.json) in which only the fields a test gives carry numbers: the
rest are empty (no steps, histograms with count 0), which every reader skips.  Dict fields
given partially are merged into the empty ones (``throughput={"bytes_per_s": 1e8}``).
"""

from __future__ import annotations

from iobench.schema import LoadMetrics


def _empty_hdr() -> dict:
    return {"count": 0, "min": None, "mean": None, "p50": None, "p90": None, "p99": None, "p999": None, "max": None}


def empty_load_metrics() -> dict:
    return LoadMetrics(
        access="map", steps=0, steps_planned=0, stopped_early=None, samples=0, epochs_planned=1,
        first_step_excluded=True, stall_ratio=0.0, accelerator_utilization=1.0,
        steady_window={"from_step": 1, "to_step": 0, "rule": "no steps"},
        stall_ratio_first_step_excluded=0.0, accelerator_utilization_first_step_excluded=1.0,
        wall_clock_utilization=None, wall_s=0.0, wall_s_with_startup=0.0, wait_s_total=0.0, compute_s_total=0.0,
        first_step_s=None, startup_s=0.0, time_to_first_batch_s=None, warmup_s=0.0, warmup_fraction=None,
        fill_io_s_total=0.0, batch_wait_s=_empty_hdr(), batch_io_s=_empty_hdr(), batch_io_hist=None,
        batch_prep_s=_empty_hdr(), batch_service_s=_empty_hdr(), batch_service_hist=None, batch_wait_hist=None,
        compute_hist=None, compute_s=_empty_hdr(), step_s=_empty_hdr(), batch_bytes=0.0, batch_bytes_max=0,
        bytes_read=0, requests=0,
        throughput={"samples_per_s": None, "bytes_per_s": None, "batches_per_s": None, "steady_samples_per_s": None},
        read_latency_s={}, read_calls={}, queue_depth={"mean": 0.0, "max": 0, "slots": 0, "slot_bytes": 0},
        per_worker=[], series={}, system={}, pickled_batches=0, verify_checksums=None, device_io=None,
        intervals={}, stable=True,
        stability={"rule": {}, "until_stable": False, "stopped": "planned steps done", "not_stable_because": []},
    ).to_dict()


def load_metrics(**fields) -> dict:
    """A load's metrics with ``fields`` set (see the module docstring)."""
    m = empty_load_metrics()
    for k, v in fields.items():
        m[k] = m[k] | v if isinstance(v, dict) and isinstance(m.get(k), dict) and k != "intervals" else v
    return m
