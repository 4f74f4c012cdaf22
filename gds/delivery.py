"""`--device cuda` for the loader: each batch lands in GPU memory through the GDS readers.

Imported by ``iobench.loader.delivery.get_delivery`` on first use of a ``cuda`` device;
it registers one ``CudaDelivery`` per device name.  Routes, chosen once (``bind``):

- ``direct``: raw, uncompressed token datasets on a local file system — each batch's
  samples are read (contiguous ones coalesced) from their shard files straight into a GPU
  buffer by ``open_reader`` (cufile → kvikio-compat → bounce);
- ``copy``: any other dataset — the batch the workers loaded is copied host → device;
- ``cpu``: no GPU path on this node — the batch stays in host memory.

Every fallback is recorded (``describe()``, which the loader puts in its results) and
warned about once.  A delivered batch is a ``DeviceBatch``: the loader's ``Batch`` (host
metadata) plus the device buffer.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import GdsFallbackWarning, open_reader
from .base import aligned_host
from iobench.loader.delivery import Delivery


@dataclass
class DeviceBatch:
    batch: Any            # the loader's Batch (indices, labels, host data view)
    data: Any             # device buffer (flat uint8; ``view``/``reshape`` with shape and dtype)
    shape: tuple
    dtype: str
    path: str             # the read path that filled it

    def __len__(self) -> int:
        return len(self.batch)


class _HostLib:
    """Host memory in place of a GPU (tests, and the `cpu` path of the direct route)."""

    name = "host"

    def alloc(self, n: int):
        return aligned_host(n)

    def to_host(self, buf, n: int):
        return np.asarray(buf[:n])

    def from_host(self, arr: np.ndarray):
        out = aligned_host(arr.nbytes)
        out[:] = arr.reshape(-1).view(np.uint8)
        return out


class CudaDelivery(Delivery):
    def __init__(self, device: str = "cuda", path: str = "cufile", lib: Any = None, probe: Any = None) -> None:
        self.device = device
        self.requested = path
        self.route: str | None = None
        self.effective: str | None = None
        self.reasons: list[str] = []
        self._lib = lib
        self._probe_given = probe
        self._probe = probe
        self._manifest = None
        self._root: str | None = None
        self._fmt_reader = None
        self._firsts: np.ndarray | None = None
        self._readers: dict[str, Any] = {}
        self.batches = 0
        self.bytes = 0

    # -- set-up ---------------------------------------------------------------------------------
    def bind(self, manifest: Any = None, dataset_url: str | None = None) -> "CudaDelivery":
        """Choose the route for this dataset; called once by the loader before the first batch."""
        from . import detect

        self.close()
        self.route = self.effective = None
        self.reasons = []
        self.batches = self.bytes = 0
        self._manifest = manifest
        local = None
        if dataset_url and ("://" not in dataset_url or dataset_url.startswith("file://")):
            local = os.path.abspath(dataset_url[len("file://"):] if dataset_url.startswith("file://") else dataset_url)
        pr = self._probe_given or detect.probe(local)
        self._probe = pr
        gpu_paths = [n for n in ("cufile", "kvikio-compat", "bounce") if pr.capabilities[n].available]
        if self._lib is None and not gpu_paths:
            self.route, self.effective = "cpu", "cpu"
            self._note(f"no GPU read path on this node ({pr.capabilities['bounce'].reason}); "
                       "batches stay in host memory")
            return self
        if self._lib is None:
            from .bounce import device_lib

            try:
                self._lib = device_lib()
            except ImportError as e:
                self.route, self.effective = "cpu", "cpu"
                self._note(f"no torch or cupy to hold device buffers ({e}); batches stay in host memory")
                return self
        why_not = self._direct_blocker(manifest, local)
        if why_not is None:
            self.route = "direct"
            self._root = local
            from iobench.formats import get_format

            self._fmt_reader = get_format(manifest.format).reader(manifest)
            self._firsts = np.array([s.first_sample for s in manifest.shards], dtype=np.int64)
        else:
            self.route, self.effective = "copy", "h2d-copy"
            self._note(f"direct reads not possible ({why_not}); the loaded batch is copied host to device")
        return self

    @staticmethod
    def _direct_blocker(manifest: Any, local: str | None) -> str | None:
        if manifest is None:
            return "no manifest was bound"
        if local is None:
            return "the dataset is not on a local file system"
        if manifest.modality != "tokens":
            return f"{manifest.modality} need decoding on the CPU first"
        if manifest.compression != "none":
            return f"{manifest.compression}-compressed shards need decompressing first"
        if not manifest.shards:
            return "the manifest lists no shards"
        return None

    def _note(self, reason: str) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)
            warnings.warn(f"--device {self.device}: {reason}", GdsFallbackWarning, stacklevel=3)

    def _reader(self, shard_path: str):
        r = self._readers.get(shard_path)
        if r is None:
            full = os.path.join(self._root, shard_path)
            r, eff, why = open_reader(self.requested, full, probe=self._probe, task_size=4 << 20, threads=4)
            if eff == "cpu" and getattr(self._lib, "name", None) != "host":
                r.close()
                self.route, self.effective = "copy", "h2d-copy"
                self._note(f"no GPU read path opened {shard_path} ({why}); the loaded batch is copied host to device")
                return None
            if why:
                self._note(f"read path {self.requested!r} ran as {eff!r}: {why}")
            self.effective = eff
            self._readers[shard_path] = r
        return r

    # -- per batch --------------------------------------------------------------------------------
    def __call__(self, batch: Any) -> Any:
        if self.route is None:
            self.bind()
        if self.route == "cpu":
            return batch
        data = batch.data
        buf = None
        if self.route == "direct":
            buf = self._lib.alloc(max(int(batch.nbytes), 1))
            if not self._read_direct(batch, buf):  # the route fell back to copy on the way
                buf = None
        if buf is None:
            buf = self._from_host(np.ascontiguousarray(data))
        self.batches += 1
        self.bytes += int(batch.nbytes)
        return DeviceBatch(batch=batch, data=buf, shape=tuple(data.shape), dtype=str(data.dtype),
                           path=self.effective or "h2d-copy")

    def _from_host(self, arr: np.ndarray):
        return self._lib.from_host(arr)

    def _runs(self, indices: np.ndarray):
        """(shard, file offset, length) for the batch's samples in order, adjacent ones merged."""
        shards = self._manifest.shards
        pos = np.searchsorted(self._firsts, indices, side="right") - 1
        run = None
        for idx, si in zip(indices.tolist(), pos.tolist()):
            shard = shards[si]
            rng = self._fmt_reader.sample_range(shard, idx - shard.first_sample)
            if rng is None:
                raise ValueError(f"sample {idx} has no byte range in {shard.path}")
            off, ln = rng
            if run is not None and run[0] is shard and run[1] + run[2] == off:
                run[2] += ln
            else:
                if run is not None:
                    yield tuple(run)
                run = [shard, off, ln]
        if run is not None:
            yield tuple(run)

    def _read_direct(self, batch: Any, buf: Any) -> bool:
        pos = 0
        for shard, off, ln in self._runs(np.asarray(batch.indices)):
            reader = self._reader(shard.path)
            if reader is None:
                return False
            got = reader.read_into(buf[pos:], off, ln)
            if got != ln:
                raise OSError(f"{shard.path}: read {got} of {ln} bytes at offset {off}")
            pos += ln
        return True

    def describe(self) -> dict:
        return {"device": self.device, "requested_path": self.requested, "route": self.route,
                "effective_path": self.effective, "fallback_reasons": list(self.reasons),
                "array_library": getattr(self._lib, "name", None), "batches": self.batches, "bytes": self.bytes,
                "note": ("direct reads re-read each batch from its shard files into GPU memory; the loader's workers "
                         "still read it into host memory too") if self.route == "direct" else None}

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()


def register() -> None:
    from iobench.loader.delivery import register_delivery

    register_delivery("cuda", CudaDelivery("cuda"))
    register_delivery("cuda:0", CudaDelivery("cuda:0"))


register()
