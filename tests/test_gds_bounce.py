"""The bounce path's pipelining, on the CPU: copies complete only when their event is waited on.

A host "device" whose copies are deferred until ``synchronize`` makes any reuse of a
pinned buffer before its copy finished show up as wrong bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from iobench.gds.base import aligned_host
from iobench.gds.bounce import BounceReader

SIZE = 5 * (1 << 20) + 999


class _Event:
    def __init__(self, fn):
        self.fn = fn

    def synchronize(self):
        if self.fn is not None:
            self.fn()
            self.fn = None


class DeferredLib:
    name = "deferred"

    def __init__(self):
        self.pending: list[_Event] = []
        self.copies = 0

    def begin(self):
        pass

    def pinned(self, n):
        a = aligned_host(n)
        return a, a

    def flat(self, dst):
        return dst.reshape(-1).view(np.uint8)

    def copy(self, flat, pos, host, n):
        def run():
            flat[pos:pos + n] = host[:n]
            self.copies += 1
        ev = _Event(run)
        self.pending.append(ev)
        return ev

    def sync(self):
        for ev in self.pending:
            ev.synchronize()
        self.pending.clear()

    def alloc(self, n):
        return np.zeros(n, dtype=np.uint8)

    def to_host(self, flat, n):
        return flat[:n]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("bounce") / "d.bin"
    raw = np.random.default_rng(5).integers(0, 256, SIZE, dtype=np.uint8)
    p.write_bytes(raw.tobytes())
    return str(p), raw


@pytest.mark.parametrize("threads,task,buffers", [(1, 1 << 20, 2), (3, 300_000, 2), (4, 64 << 10, 8)])
def test_bounce_pipeline_delivers_exact_bytes(data_file, threads, task, buffers):
    path, raw = data_file
    lib = DeferredLib()
    r = BounceReader(path, threads=threads, task_size=task, buffers=buffers, lib=lib)
    try:
        dst = lib.alloc(SIZE + 4096)
        assert r.read_into(dst, 0, SIZE + 4096) == SIZE  # EOF inside the request
        assert np.array_equal(dst[:SIZE], raw)
        rng = np.random.default_rng(threads)
        for _ in range(10):
            off = int(rng.integers(0, SIZE))
            n = int(rng.integers(1, 2 << 20))
            dst[:] = 0
            got = r.read_into(dst, off, n)
            assert got == min(n, SIZE - off)
            assert np.array_equal(dst[:got], raw[off:off + got])
        assert r.read_into(dst, SIZE, 10) == 0
        d = r.describe()
        assert d["path"] == "bounce" and d["pinned_buffers"] == buffers and d["array_library"] == "deferred"
        assert not lib.pending  # every copy was waited for before read_into returned
    finally:
        r.close()


def test_bounce_rejects_short_destination(data_file):
    path, _ = data_file
    lib = DeferredLib()
    with BounceReader(path, lib=lib) as r, pytest.raises(ValueError, match="fewer than"):
        r.read_into(lib.alloc(10), 0, 11)
