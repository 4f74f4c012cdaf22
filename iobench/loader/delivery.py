"""How a batch reaches the consumer's device: one function per device, swappable.

The consumer loop calls ``get_delivery(device)(batch)`` once per step and counts its
time as data wait (a batch that is not yet on the device stalls the step).  ``cpu``
hands the shared-memory view over as is.  Other packages add devices with
``register_delivery`` (the GPU-direct package plugs ``cuda`` here).
"""

from __future__ import annotations

import importlib
from contextlib import suppress
from typing import Any, Callable

from ..config import nearest
from ..errors import ConfigError
from .slots import Batch


class Delivery:
    """Hands one batch to the consumer's device; ``__call__`` is the one required method.

    ``bind`` (called once before the first batch: a GPU delivery picks its route for the
    dataset), ``reasons`` (fallbacks the results should show) and ``describe`` (the effective
    path) have defaults.  A plain function given as ``run_load(deliver=...)`` is wrapped in
    ``FunctionDelivery``.
    """

    reasons: list[str] = []   # why the effective path is not the requested one (none by default)

    def __call__(self, batch: Batch) -> Any:
        raise NotImplementedError

    def bind(self, manifest: Any = None, dataset_url: str | None = None) -> Delivery:
        return self

    def describe(self) -> dict:
        return {"device": "cpu", "path": "host (zero-copy view of the slot)"}


class CpuDelivery(Delivery):
    """``cpu``: the shared-memory view, handed over as is."""

    def __call__(self, batch: Batch) -> Batch:
        return batch


class FunctionDelivery(Delivery):
    """A delivery that is a plain function (tests, a user's own device copy)."""

    def __init__(self, fn: Callable[[Batch], Any], device: str = "cpu") -> None:
        self.fn, self.device = fn, device

    def __call__(self, batch: Batch) -> Any:
        return self.fn(batch)

    def describe(self) -> dict:
        return {"device": self.device, "path": "host (zero-copy view of the slot)" if self.device == "cpu" else "custom"}


_DELIVERY: dict[str, Delivery] = {}


def as_delivery(d: "Delivery | Callable[[Batch], Any]", device: str = "cpu") -> Delivery:
    return d if isinstance(d, Delivery) else FunctionDelivery(d, device)


def register_delivery(device: str, d: "Delivery | Callable[[Batch], Any]") -> None:
    _DELIVERY[device] = as_delivery(d, device)


register_delivery("cpu", CpuDelivery())


def get_delivery(device: str) -> Delivery:
    if device not in _DELIVERY and device.startswith("cuda"):
        with suppress(ImportError):  # the GPU package registers its delivery on import
            importlib.import_module("iobench.gds.delivery")
    if device not in _DELIVERY:
        raise ConfigError("--device", f"no delivery for device {device!r}", nearest(device, _DELIVERY))
    return _DELIVERY[device]
