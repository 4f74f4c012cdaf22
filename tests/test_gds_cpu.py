"""The cpu read path: correctness at random offsets, unaligned sizes, EOF, O_DIRECT and its fallback."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from iobench.gds import cpu as cpu_mod
from iobench.gds.base import aligned_host, chunks, host_view
from iobench.gds.cpu import CpuReader

SIZE = 3 * (1 << 20) + 12345  # not a multiple of any block size


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("gds") / "data.bin"
    data = np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    p.write_bytes(data)
    return str(p), data


@pytest.mark.parametrize("odirect", [False, True])
@pytest.mark.parametrize("threads,task_size", [(1, 1 << 20), (3, 64 << 10), (4, 100_000)])
def test_random_offsets_and_unaligned_sizes(data_file, odirect, threads, task_size):
    path, data = data_file
    rng = np.random.default_rng(threads * 10 + odirect)
    with CpuReader(path, threads=threads, task_size=task_size, odirect=odirect) as r:
        dst = aligned_host(1 << 20)
        for _ in range(40):
            off = int(rng.integers(0, SIZE))
            n = int(rng.integers(1, 1 << 20))
            got = r.read_into(dst, off, n)
            want = data[off:off + n]
            assert got == len(want)
            assert dst[:got].tobytes() == want
        # an unaligned destination (a slice 1 byte into a buffer) must also work
        odd = aligned_host(200_001)[1:]
        assert r.read_into(odd, 4097, 200_000) == 200_000
        assert odd[:200_000].tobytes() == data[4097:204_097]


def test_eof_and_beyond(data_file):
    path, data = data_file
    with CpuReader(path, threads=2, task_size=4096, odirect=True) as r:
        dst = bytearray(1 << 20)
        got = r.read_into(dst, SIZE - 5000, 1 << 20)
        assert got == 5000 and bytes(dst[:5000]) == data[-5000:]
        assert r.read_into(dst, SIZE, 100) == 0
        assert r.read_into(dst, SIZE + 10_000, 100) == 0
        assert r.read_into(dst, 0, 0) == 0
        assert r.bytes_read == 5000
        assert r.io_bytes >= 5000  # alignment padding counts at the backend


def test_whole_file_in_one_call_counts_bytes(data_file):
    path, data = data_file
    with CpuReader(path, threads=4, task_size=256 << 10) as r:
        dst = np.zeros(SIZE + 100, dtype=np.uint8)
        assert r.read_into(dst, 0, SIZE + 100) == SIZE
        assert dst[:SIZE].tobytes() == data
        assert r.bytes_read == SIZE == r.io_bytes
        assert r.calls == 1
        d = r.describe()
        assert d["path"] == "cpu" and d["threads"] == 4 and d["odirect"] is False


def test_odirect_on_tmpfs_works_or_falls_back_with_reason(data_file):
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path, data = data_file
    shm = f"/dev/shm/iobench-gds-test-{os.getpid()}.bin"
    with open(shm, "wb") as f:
        f.write(data[:100_000])
    try:
        with CpuReader(shm, threads=2, task_size=8192, odirect=True) as r:
            dst = bytearray(100_000)
            assert r.read_into(dst, 3, 99_997) == 99_997
            assert bytes(dst[:99_997]) == data[3:100_000]
            d = r.describe()
            # Linux >= 6.6 lets tmpfs accept O_DIRECT; older kernels refuse it and we fall back, saying so.
            assert d["odirect"] or "O_DIRECT" in d["odirect_reason"]
    finally:
        os.unlink(shm)


def test_odirect_refused_falls_back_to_page_cache(data_file, monkeypatch):
    path, data = data_file

    def refuse(p):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(cpu_mod, "_open_direct", refuse)
    with CpuReader(path, odirect=True) as r:
        assert r.odirect is False
        assert "EINVAL" in r.describe()["odirect_reason"]
        dst = bytearray(10_000)
        assert r.read_into(dst, 1, 10_000) == 10_000 and bytes(dst) == data[1:10_001]
        assert r.evidence()["backend"] == "posix"


def test_other_open_errors_are_not_swallowed(data_file, monkeypatch):
    path, _ = data_file

    def denied(p):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cpu_mod, "_open_direct", denied)
    with pytest.raises(PermissionError):
        CpuReader(path, odirect=True)


def test_destination_checks(data_file):
    path, _ = data_file

    class FakeDeviceArray:
        __cuda_array_interface__ = {"shape": (10,), "typestr": "|u1", "data": (0, False), "version": 3}

    with CpuReader(path) as r:
        with pytest.raises(TypeError, match="host memory"):
            r.read_into(FakeDeviceArray(), 0, 10)
        with pytest.raises(ValueError, match="read-only"):
            r.read_into(b"x" * 10, 0, 10)
        with pytest.raises(ValueError, match="fewer than"):
            r.read_into(bytearray(10), 0, 11)
        with pytest.raises(ValueError):
            r.read_into(bytearray(10), -1, 5)


def test_helpers():
    a = aligned_host(10_000)
    assert a.ctypes.data % 4096 == 0 and a.nbytes == 10_000
    assert aligned_host(0).nbytes == 0
    assert list(chunks(10, 25, 10)) == [(0, 10, 10), (10, 20, 10), (20, 30, 5)]
    v = host_view(np.zeros((4, 4), dtype=np.float32), 64)
    assert v.dtype == np.uint8 and v.nbytes == 64
