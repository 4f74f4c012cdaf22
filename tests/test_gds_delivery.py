"""`--device cuda` delivery: direct reads of raw token batches, host-to-device copy, CPU fallback."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from iobench.gds import GdsFallbackWarning, detect
from iobench.gds.delivery import CudaDelivery, DeviceBatch, _HostLib


def probe_with(available):
    caps = {n: detect.Capability(n, n in available, () if n in available else (f"{n} missing here",))
            for n in ("cufile", "kvikio-compat", "bounce", "cpu")}
    return detect.Probe({"host": {}, "file": {}, "runtime": {}}, caps)


def make_dataset(path, compression="none"):
    from iobench.generate import GenSpec, generate

    spec = GenSpec(num_samples=96, seq_len=64, vocab_size=1000, shard_size="40 samples", compression=compression,
                   fsync=False)
    return generate(spec, str(path), progress=False)


def batch_of(manifest, root, indices):
    """The batch the loader would hand over: the samples' tokens, in order, in host memory."""
    from iobench.formats import get_format
    from iobench.loader.slots import Batch

    reader = get_format(manifest.format).reader(manifest)
    rows = []
    for i in indices:
        shard = next(s for s in manifest.shards if s.first_sample <= i < s.first_sample + s.samples)
        data = (root / shard.path).read_bytes()
        sample = list(reader.iter_samples(data, shard))[i - shard.first_sample]
        rows.append(np.asarray(sample.data))
    data = np.stack(rows)
    return Batch(index=0, epoch=0, indices=np.array(indices), labels=None, data=data, layout="array",
                 nbytes=data.nbytes)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    return make_dataset(root), root


def test_direct_route_reads_the_same_tokens(dataset):
    manifest, root = dataset
    d = CudaDelivery("cuda", path="cpu", lib=_HostLib(), probe=probe_with({"cpu"})).bind(manifest, str(root))
    assert d.route == "direct"
    # contiguous runs, a shard boundary (40), out-of-order and repeated samples
    for idx in ([0, 1, 2, 3], [38, 39, 40, 41], [90, 5, 60, 5, 95]):
        b = batch_of(manifest, root, idx)
        out = d(b)
        assert isinstance(out, DeviceBatch) and out.path == "cpu"
        got = np.asarray(out.data[:b.nbytes]).view(b.data.dtype).reshape(out.shape)
        assert np.array_equal(got, b.data)
    desc = d.describe()
    assert desc["route"] == "direct" and desc["batches"] == 3 and desc["fallback_reasons"] == []
    d.close()


def test_compressed_dataset_is_copied_with_reason(tmp_path):
    manifest = make_dataset(tmp_path, compression="zstd:1")
    with pytest.warns(GdsFallbackWarning, match="compressed"):
        d = CudaDelivery("cuda", lib=_HostLib(), probe=probe_with({"cpu"})).bind(manifest, str(tmp_path))
    assert d.route == "copy"
    b = batch_of(manifest, tmp_path, [3, 50])
    out = d(b)
    assert np.array_equal(np.asarray(out.data).view(b.data.dtype).reshape(out.shape), b.data)
    assert "compressed" in d.describe()["fallback_reasons"][0]


def test_no_gpu_keeps_batches_on_the_host(dataset):
    manifest, root = dataset
    pr = detect.probe(str(root))
    if pr.capabilities["bounce"].available or pr.capabilities["kvikio-compat"].available:
        pytest.skip("this machine has a GPU path")
    with pytest.warns(GdsFallbackWarning, match="batches stay in host memory"):
        d = CudaDelivery("cuda").bind(manifest, str(root))
    b = batch_of(manifest, root, [1, 2])
    assert d(b) is b
    desc = d.describe()
    assert desc["route"] == "cpu" and desc["effective_path"] == "cpu" and desc["fallback_reasons"]


def test_registered_with_the_loader():
    from iobench.loader.delivery import get_delivery

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GdsFallbackWarning)
        fn = get_delivery("cuda")
    assert isinstance(fn, CudaDelivery)


def test_loader_runs_batches_through_the_direct_route(dataset):
    """A real load (worker processes, shared-memory slots) whose delivery re-reads each batch directly."""
    from iobench.config import build
    from iobench.loader.core import LoadConfig, run_load

    manifest, root = dataset

    class Checking(CudaDelivery):
        checked = 0

        def __call__(self, batch):
            out = super().__call__(batch)
            got = np.asarray(out.data[:batch.nbytes]).view(batch.data.dtype).reshape(batch.data.shape)
            assert np.array_equal(got, batch.data)
            Checking.checked += 1
            return out

    deliver = Checking("cuda", path="cpu", lib=_HostLib(), probe=probe_with({"cpu"}))
    cfg = build(LoadConfig, {"dataset": str(root), "workers": 1, "batch_size": 8, "device": "cuda",
                             "shuffle_buffer": 16}, "load")
    run = run_load(cfg, deliver=deliver)
    assert Checking.checked == 96 // 8
    d = run.environment["delivery"]
    assert d["route"] == "direct" and d["effective_path"] == "cpu" and d["batches"] == 12
    assert not [w for w in run.warnings if w.startswith("--device")]
    deliver.close()
