"""The ``bounce`` path: preads into pinned host buffers, then asynchronous host-to-device copies.

A thread pool fills several pinned buffers at once while a CUDA stream copies the filled
ones to the destination; a buffer is refilled only after the event recorded behind its
copy has completed.  Works with torch or cupy (whichever is installed; torch first).
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from iobench.io.inputs import pread_full

from .base import GdsReader, chunks

DEFAULT_TASK_SIZE = 4 << 20


class _Torch:
    name = "torch"

    def __init__(self, device: int) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cuda", device)
        self.stream = torch.cuda.Stream(device=self.device)

    def pinned(self, n: int):
        t = self.torch.empty(n, dtype=self.torch.uint8, pin_memory=True)
        return t, t.numpy()

    def flat(self, dst: Any):
        torch = self.torch
        t = dst if isinstance(dst, torch.Tensor) else torch.as_tensor(dst, device=self.device)
        if not t.is_cuda:
            raise TypeError("bounce reads into GPU memory; got a host tensor (use the cpu path)")
        return t.reshape(-1).view(torch.uint8)

    def begin(self) -> None:
        # Our side stream must not overtake work already queued on the caller's stream (e.g. dst's allocation).
        self.stream.wait_stream(self.torch.cuda.current_stream(self.device))

    def copy(self, flat, pos: int, host, n: int):
        with self.torch.cuda.stream(self.stream):
            flat[pos:pos + n].copy_(host[:n], non_blocking=True)
            ev = self.torch.cuda.Event()
            ev.record(self.stream)
        return ev

    def sync(self) -> None:
        self.stream.synchronize()

    def alloc(self, n: int):
        return self.torch.empty(n, dtype=self.torch.uint8, device=self.device)

    def to_host(self, flat, n: int):
        return flat[:n].cpu().numpy()

    def from_host(self, arr):
        return self.torch.from_numpy(arr.reshape(-1).view("uint8")).to(self.device)


class _Cupy:
    name = "cupy"

    def __init__(self, device: int) -> None:
        import cupy

        self.cupy = cupy
        self.device_id = device
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)

    def pinned(self, n: int):
        import numpy as np

        mem = self.cupy.cuda.alloc_pinned_memory(n)
        return mem, np.frombuffer(mem, dtype=np.uint8, count=n)

    def flat(self, dst: Any):
        arr = self.cupy.asarray(dst)
        return arr.reshape(-1).view(self.cupy.uint8)

    def begin(self) -> None:
        self.stream.wait_event(self.cupy.cuda.get_current_stream().record())

    def copy(self, flat, pos: int, host, n: int):
        flat[pos:pos + n].set(host[1][:n], stream=self.stream)
        ev = self.cupy.cuda.Event()
        ev.record(self.stream)
        return ev

    def sync(self) -> None:
        self.stream.synchronize()

    def alloc(self, n: int):
        with self.cupy.cuda.Device(self.device_id):
            return self.cupy.empty(n, dtype=self.cupy.uint8)

    def to_host(self, flat, n: int):
        return self.cupy.asnumpy(flat[:n])

    def from_host(self, arr):
        with self.cupy.cuda.Device(self.device_id):
            return self.cupy.asarray(arr.reshape(-1).view("uint8"))


def device_lib(prefer: str | None = None, device: int = 0):
    """torch or cupy adapter; ``prefer`` picks one; ImportError when neither is installed."""
    order = [prefer] if prefer else ["torch", "cupy"]
    last: Exception | None = None
    for name in order:
        try:
            return (_Torch if name == "torch" else _Cupy)(device)
        except ImportError as e:
            last = e
    raise ImportError(f"the bounce path needs torch or cupy ({last})")


class BounceReader(GdsReader):
    name = "bounce"
    device_memory = True

    def __init__(self, path: str, *, threads: int = 4, task_size: int = DEFAULT_TASK_SIZE,
                 buffers: int | None = None, device: int = 0, lib: Any = None) -> None:
        super().__init__(path)
        self.threads = max(1, threads)
        self.task_size = task_size
        # ``lib`` names torch or cupy, or is an adapter object with the same methods (tests use a host one).
        self.lib = lib if lib is not None and not isinstance(lib, str) else device_lib(lib, device)
        self.nbuf = max(2, buffers or 2 * self.threads)
        self._pinned = [self.lib.pinned(task_size) for _ in range(self.nbuf)]
        self._events: list[Any] = [None] * self.nbuf
        self._fd = os.open(self.path, os.O_RDONLY)
        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="gds-bounce")

    def _host(self, slot: int):
        return self._pinned[slot][1]

    def read_into(self, dst: Any, offset: int, nbytes: int) -> int:
        flat = self.lib.flat(dst)
        size = flat.numel() if hasattr(flat, "numel") else flat.size
        if size < nbytes:
            raise ValueError(f"dst holds fewer than the {nbytes} bytes asked for")
        pieces = iter(enumerate(chunks(offset, nbytes, self.task_size)))
        pending: deque = deque()
        self.lib.begin()

        def submit() -> bool:
            nxt = next(pieces, None)
            if nxt is None:
                return False
            k, (pos, off, n) = nxt
            slot = k % self.nbuf
            if self._events[slot] is not None:  # its previous copy must finish before we overwrite it
                self._events[slot].synchronize()
                self._events[slot] = None
            fut = self._pool.submit(pread_full, self._fd, memoryview(self._host(slot)[:n]), off)
            pending.append((slot, pos, n, fut))
            return True

        for _ in range(self.nbuf):
            if not submit():
                break
        delivered = 0
        eof = False
        while pending:
            slot, pos, n, fut = pending.popleft()
            got = fut.result()
            if eof:
                continue
            if got:
                host = self._pinned[slot] if self.lib.name == "cupy" else self._pinned[slot][0]
                self._events[slot] = self.lib.copy(flat, pos, host, got)
            delivered += got
            if got < n:
                eof = True
                continue
            submit()
        self.lib.sync()
        self.bytes_read += delivered
        self.io_bytes += delivered
        self.calls += 1
        return delivered

    def describe(self) -> dict:
        d = super().describe()
        d.update({"threads": self.threads, "task_size": self.task_size, "pinned_buffers": self.nbuf,
                  "array_library": self.lib.name})
        return d

    def evidence(self) -> dict:
        return {"backend": "posix+pinned-h2d", "bytes": self.io_bytes}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self.lib.sync()
        except Exception:  # noqa: BLE001 - closing must not mask the caller's error
            pass
