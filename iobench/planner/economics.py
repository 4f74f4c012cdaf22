"""Storage economics: what storing, streaming, staging and idle accelerators cost.

Prices use the units providers quote: USD per decimal GB per month for storage, USD per
GB for egress and retrieval, USD per 1,000 requests, USD per accelerator-hour.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


def storage_cost(nbytes: float, usd_per_gb_month: float, months: float = 12) -> float:
    return nbytes / GB * usd_per_gb_month * months


def per_gb_cost(nbytes: float, usd_per_gb: float) -> float:
    """A one-off price per GB (retrieval fees, hardware priced per GB)."""
    return nbytes / GB * usd_per_gb


def egress_cost(nbytes: float, usd_per_gb: float, reads: float = 1) -> float:
    return per_gb_cost(nbytes, usd_per_gb) * reads


def request_cost(requests: float, usd_per_1000: float) -> float:
    return requests / 1000 * usd_per_1000


@dataclass(frozen=True)
class StreamVsStage:
    stream_usd_per_year: float             # object storage + every epoch of every run read remotely
    stage_usd_per_year: float              # object storage + local NVMe + one staging read per run
    savings_usd_per_year: float            # stream − stage
    break_even_epochs: float               # stage when epochs per run exceed this
    first_cheaper_epoch: int
    nvme_usd_per_year: float
    object_usd_per_year: float
    egress_per_run_streaming: float
    staging_egress_usd_per_year: float


def stream_vs_stage(dataset_bytes: float, epochs: float, runs_per_year: float, object_usd_gb_month: float,
                    nvme_usd_gb_month: float, egress_usd_gb: float) -> StreamVsStage:
    """Stream every epoch from the object store, or stage once per run onto local NVMe."""
    obj = storage_cost(dataset_bytes, object_usd_gb_month)
    nvme = storage_cost(dataset_bytes, nvme_usd_gb_month)
    per_epoch = egress_cost(dataset_bytes, egress_usd_gb)
    stream = obj + runs_per_year * epochs * per_epoch
    stage = obj + nvme + runs_per_year * per_epoch
    # The object-store cost appears on both sides and cancels.
    e_star = (nvme + runs_per_year * per_epoch) / (runs_per_year * per_epoch)
    first = int(e_star) + 1
    return StreamVsStage(stream, stage, stream - stage, e_star, first, nvme, obj, epochs * per_epoch,
                         runs_per_year * per_epoch)


def idle_cost(accelerators: int, usd_per_hour: float, duration_s: float, lost_fraction: float = 1.0) -> float:
    """Spend wasted while accelerators wait (``lost_fraction`` of ``duration_s``)."""
    return accelerators * usd_per_hour * duration_s / 3600 * lost_fraction


@dataclass(frozen=True)
class BuildVsBuy:
    cloud_usd_per_year: float
    net_savings_usd_per_year: float
    payback_years: float


def build_vs_buy(data_bytes: float, object_usd_gb_month: float, reads_per_year: float, egress_usd_gb: float,
                 onprem_opex_usd_per_year: float, capex_usd: float) -> BuildVsBuy:
    cloud = storage_cost(data_bytes, object_usd_gb_month) + egress_cost(data_bytes, egress_usd_gb, reads_per_year)
    net = cloud - onprem_opex_usd_per_year
    return BuildVsBuy(cloud, net, capex_usd / net if net > 0 else float("inf"))
