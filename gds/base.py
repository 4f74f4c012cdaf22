"""What every GPU-direct read path implements, and the host-memory helpers they share.

A reader fills ``dst`` (host or device memory, depending on the path) with ``nbytes``
from ``offset`` of one file and returns how many bytes it delivered: fewer than asked
only at end of file.  ``describe()`` says what was requested and what really ran.
"""

from __future__ import annotations

import mmap
from abc import ABC, abstractmethod
from typing import Any

PAGE = mmap.PAGESIZE

#: The paths, fastest first; each falls back to the ones after it.
PATH_NAMES = ("cufile", "kvikio-compat", "bounce", "cpu")
#: Paths whose destination is GPU memory.
DEVICE_PATHS = ("cufile", "kvikio-compat", "bounce")


class GdsReader(ABC):
    """One open file, read by one path."""

    name: str = ""
    #: True when ``dst`` is GPU memory (torch/cupy arrays); False for host buffers.
    device_memory: bool = False

    def __init__(self, path: str) -> None:
        self.path = str(path)
        self.bytes_read = 0          # bytes delivered to callers
        self.io_bytes = 0            # bytes the storage calls returned (alignment padding included)
        self.calls = 0

    @abstractmethod
    def read_into(self, dst: Any, offset: int, nbytes: int) -> int:
        """Read ``nbytes`` at ``offset`` into the start of ``dst``; return the bytes delivered."""

    def describe(self) -> dict:
        return {"path": self.name, "file": self.path, "device_memory": self.device_memory,
                "bytes_read": self.bytes_read, "io_bytes": self.io_bytes, "calls": self.calls}

    def evidence(self) -> dict:
        """Which path the bytes really took (e.g. KvikIO's bytes by backend)."""
        return {}

    def effective_path(self) -> str:
        """The path the bytes really took, judged from ``evidence()``."""
        return self.name

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def __enter__(self) -> "GdsReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def aligned_host(nbytes: int, alignment: int = PAGE):
    """A zeroed uint8 numpy array whose address is a multiple of ``alignment`` (page-aligned mmap)."""
    import numpy as np

    if alignment > PAGE or PAGE % alignment:
        raise ValueError(f"alignment {alignment} must divide the page size {PAGE}")
    if nbytes <= 0:
        return np.empty(0, dtype=np.uint8)
    # Anonymous mappings start on a page boundary; numpy keeps the mmap alive through .base.
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


def host_view(dst: Any, nbytes: int):
    """``dst`` as a writable 1-D uint8 numpy array of at least ``nbytes``; rejects GPU memory."""
    import numpy as np

    if hasattr(dst, "__cuda_array_interface__") or getattr(dst, "is_cuda", False):
        raise TypeError("this path reads into host memory; got a GPU array (use bounce, kvikio-compat or cufile)")
    if hasattr(dst, "numpy") and not isinstance(dst, np.ndarray):  # a CPU torch tensor
        dst = dst.numpy()
    if isinstance(dst, np.ndarray):
        if not dst.flags.c_contiguous:
            raise ValueError("dst must be C-contiguous")
        arr = dst.reshape(-1).view(np.uint8)
    else:
        arr = np.frombuffer(memoryview(dst).cast("B"), dtype=np.uint8)
    if not arr.flags.writeable:
        raise ValueError("dst is read-only")
    if arr.nbytes < nbytes:
        raise ValueError(f"dst holds {arr.nbytes} bytes, fewer than the {nbytes} asked for")
    return arr


def chunks(offset: int, nbytes: int, task_size: int):
    """(dst position, file offset, length) pieces of at most ``task_size`` bytes."""
    pos = 0
    while pos < nbytes:
        n = min(task_size, nbytes - pos)
        yield pos, offset + pos, n
        pos += n
