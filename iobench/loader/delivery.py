"""How a batch reaches the consumer's device: one function per device, swappable.

The consumer loop calls ``get_delivery(device)(batch)`` once per step and counts its
time as data wait (a batch that is not yet on the device stalls the step).  ``cpu``
hands the shared-memory view over as is.  Other packages add devices with
``register_delivery`` (the GPU-direct package plugs ``cuda`` here).
"""

from __future__ import annotations

from typing import Any, Callable

from ..config import nearest
from ..errors import ConfigError
from .slots import Batch

_DELIVERY: dict[str, Callable[[Batch], Any]] = {}


def register_delivery(device: str, fn: Callable[[Batch], Any]) -> None:
    _DELIVERY[device] = fn


def deliver_cpu(batch: Batch) -> Batch:
    return batch


register_delivery("cpu", deliver_cpu)


def get_delivery(device: str) -> Callable[[Batch], Any]:
    if device not in _DELIVERY and device.startswith("cuda"):
        try:  # the GPU package registers its delivery on import
            import importlib

            importlib.import_module("iobench.gds.delivery")
        except ImportError:
            pass
    if device not in _DELIVERY:
        raise ConfigError("--device", f"no delivery for device {device!r}", nearest(device, _DELIVERY))
    return _DELIVERY[device]
