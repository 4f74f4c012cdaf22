"""CPU cost of moving data to accelerators, host-mediated vs GPU-direct (seed ch. 4, GDS worked example).

Lives in the planner, the one home of the domain models' formulas (it was gds/model.py).
CPU-seconds per wall-second = transfers per second × CPU time per transfer; the cores a
GPU-direct path frees are the difference.  ``cores_needed`` applies the same arithmetic to a
measured ``cpu_s_per_gb`` from ``iobench gds bench``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CpuCost:
    host_cpu_s_per_s: float       # CPU-seconds per second on the host-mediated path
    direct_cpu_s_per_s: float     # the same on the GPU-direct path
    cores_freed: float
    per_transfer_reduction: float  # ratio 0-1
    speedup: float                 # host CPU time per transfer / direct CPU time per transfer


def cpu_cost(transfers_per_s: float, host_cpu_s_per_transfer: float, direct_cpu_s_per_transfer: float) -> CpuCost:
    if transfers_per_s < 0 or host_cpu_s_per_transfer <= 0 or direct_cpu_s_per_transfer <= 0:
        raise ValueError("rates must be non-negative and CPU times per transfer positive")
    host = transfers_per_s * host_cpu_s_per_transfer
    direct = transfers_per_s * direct_cpu_s_per_transfer
    return CpuCost(host_cpu_s_per_s=host, direct_cpu_s_per_s=direct, cores_freed=host - direct,
                   per_transfer_reduction=1 - direct_cpu_s_per_transfer / host_cpu_s_per_transfer,
                   speedup=host_cpu_s_per_transfer / direct_cpu_s_per_transfer)


def cores_needed(bytes_per_s: float, cpu_s_per_gb: float) -> float:
    """Cores a path keeps busy to sustain ``bytes_per_s``, from a measured CPU-seconds per GB (1e9 bytes)."""
    return bytes_per_s / 1e9 * cpu_s_per_gb
