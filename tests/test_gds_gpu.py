"""GPU read paths on a real GPU (marker ``gpu``: skipped in CI; run with ``pytest -m gpu``)."""

from __future__ import annotations

import numpy as np
import pytest

from iobench.gds import detect, make_reader, open_reader

pytestmark = pytest.mark.gpu
SIZE = 24 * (1 << 20) + 4321


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    p = tmp_path_factory.mktemp("gdsgpu") / "data.bin"
    raw = np.random.default_rng(11).integers(0, 256, SIZE, dtype=np.uint8)
    p.write_bytes(raw.tobytes())
    return str(p), raw


@pytest.fixture(scope="module")
def probe(data):
    return detect.probe(data[0])


def _check(reader, raw, lib):
    buf = lib.alloc(8 << 20)
    rng = np.random.default_rng(1)
    for _ in range(10):
        off = int(rng.integers(0, SIZE))
        n = int(rng.integers(1, 8 << 20))
        got = reader.read_into(buf, off, n)
        assert got == min(n, SIZE - off)
        assert np.array_equal(lib.to_host(buf, got), raw[off:off + got])


@pytest.mark.parametrize("name", ["bounce", "kvikio-compat", "cufile"])
def test_device_path_reads_correct_bytes(name, data, probe):
    from iobench.gds.bounce import device_lib

    if not probe.capabilities[name].available:
        pytest.skip(f"{name}: {probe.capabilities[name].reason}")
    path, raw = data
    reader, eff, why = open_reader(name, path, strict=True, probe=probe, threads=4, task_size=1 << 20)
    try:
        _check(reader, raw, device_lib())
        d = reader.describe()
        assert d["bytes_read"] > 0
        if name != "bounce":
            ev = reader.evidence()
            assert "kvikio_version" in ev
            if "bytes_by_backend" in ev:
                assert sum(ev["bytes_by_backend"].values()) >= d["bytes_read"]
            assert reader.effective_path() in ("cufile", "kvikio-compat", "cufile+posix")
    finally:
        reader.close()


@pytest.mark.parametrize("lib", ["torch", "cupy"])
def test_bounce_with_each_array_library(lib, data, probe):
    pytest.importorskip(lib)
    if not probe.capabilities["bounce"].available:
        pytest.skip(probe.capabilities["bounce"].reason)
    from iobench.gds.bounce import device_lib

    path, raw = data
    reader = make_reader("bounce", path, threads=3, task_size=512 << 10, buffers=4, lib=lib)
    try:
        _check(reader, raw, device_lib(lib))
        assert reader.describe()["array_library"] == lib
    finally:
        reader.close()


def test_cuda_delivery_direct_route(tmp_path, probe):
    from iobench.gds.delivery import CudaDelivery
    from iobench.generate import GenSpec, generate
    from iobench.loader.slots import Batch

    if not any(probe.capabilities[n].available for n in ("cufile", "kvikio-compat", "bounce")):
        pytest.skip("no GPU read path")
    manifest = generate(GenSpec(num_samples=64, seq_len=256, vocab_size=1000, shard_size="20 samples", fsync=False),
                        str(tmp_path), progress=False)
    d = CudaDelivery("cuda").bind(manifest, str(tmp_path))
    assert d.route == "direct"
    idx = [0, 1, 19, 20, 63, 7]
    from iobench.formats import get_format

    reader = get_format("raw").reader(manifest)
    rows = []
    for i in idx:
        s = next(s for s in manifest.shards if s.first_sample <= i < s.first_sample + s.samples)
        off, ln = reader.sample_range(s, i - s.first_sample)
        rows.append(np.frombuffer((tmp_path / s.path).read_bytes()[off:off + ln], dtype=np.uint8))
    host = np.stack(rows)
    b = Batch(index=0, epoch=0, indices=np.array(idx), labels=None, data=host, layout="array", nbytes=host.nbytes)
    out = d(b)
    assert np.array_equal(d._lib.to_host(out.data, host.nbytes), host.reshape(-1))
    assert d.describe()["effective_path"] in ("cufile", "kvikio-compat", "bounce")
    d.close()
