"""Moving data to where it is read: staging datasets, loading models, fanning weights out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Staging:
    bytes_per_node: float
    stage_s: float


def staging_time(dataset_bytes: float, nodes: int, bytes_per_s_per_node: float) -> Staging:
    """Pre-stage a dataset split across nodes, each pulling its part at its own rate."""
    per = dataset_bytes / nodes
    return Staging(per, per / bytes_per_s_per_node)


def stream_time(dataset_bytes: float, drives: int, bytes_per_s_per_drive: float) -> float:
    """Read a dataset once from a RAID-0 of ``drives``."""
    return dataset_bytes / (drives * bytes_per_s_per_drive)


@dataclass(frozen=True)
class ColdStart:
    load_s: float
    bytes_per_drive: float


def cold_start(model_bytes: float, bytes_per_s: float, drives: int = 1) -> ColdStart:
    """Time to load model weights from a tier; striping over ``drives`` divides the bytes per drive."""
    per = model_bytes / drives
    return ColdStart(per / bytes_per_s, per)


def fan_out_bytes(replicas: int, model_bytes: float) -> float:
    """Bytes moved when every replica pulls the full model."""
    return replicas * model_bytes


@dataclass(frozen=True)
class Capacity:
    local_bytes: float
    overflow_bytes: float         # what does not fit locally (0 when it fits)


def local_capacity(drives: int, bytes_per_drive: float, dataset_bytes: float) -> Capacity:
    local = drives * bytes_per_drive
    return Capacity(local, max(0.0, dataset_bytes - local))
