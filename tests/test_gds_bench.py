"""`iobench gds bench|probe`, the suite stage and the CPU-cost model."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from iobench.cli import main
from iobench.config import build
from iobench.errors import ConfigError
from iobench.gds import GdsFallbackWarning, make_reader
from iobench.gds.bench import GdsBenchConfig, create_file, run_bench, run_cell
from iobench.planner.gds import cores_needed, cpu_cost
from iobench.results import read_results

SIZE = 2 * (1 << 20) + 777


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("gdsb") / "data.bin"
    create_file(str(p), SIZE, seed=3)
    return str(p)


def cfg(target, **kw):
    base = {"target": target, "paths": ["cpu"], "io_sizes": ["64KiB", "1MiB"], "threads": [1, 2],
            "qd1_samples": 20, "qd1_max_seconds": 0.3}
    return build(GdsBenchConfig, base | kw, "gds")


def test_create_file_is_seeded_and_exact(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    create_file(str(a), 100_000, seed=1)
    create_file(str(b), 100_000, seed=1)
    assert a.stat().st_size == 100_000 and a.read_bytes() == b.read_bytes()


def test_bench_cells_are_complete_and_verified(data_file):
    out = run_bench(cfg(data_file))
    cells = out["metrics"]["cells"]
    assert len(cells) == 2 * 2 * 2  # io sizes × threads × cache states
    for c in cells:
        assert c["path_effective"] == "cpu" and c["requested"] == ["cpu"]
        assert c["bytes"] == SIZE and c["verified"] is True
        assert c["throughput"]["bytes_per_s"] > 0 and c["cpu_s_per_gb"] is not None and c["cpu_s_per_gb"] >= 0
        assert c["setup_s"] > 0 and c["first_io_s"] > 0
        assert c["calls"] == -(-SIZE // (c["io_size_bytes"] * c["threads"]))
        lat = c["latency_qd1_s"]
        assert 1 <= lat["count"] <= 20 and lat["p50"] <= lat["p99"]
        assert c["cache"]["declared"] in ("cold", "warm") and c["cache"]["resident_ratio"] is not None
    warm = [c for c in cells if c["cache"]["declared"] == "warm"]
    assert all(c["cache"]["verified"] and c["cache"]["resident_ratio"] >= 0.95 for c in warm)
    assert out["metrics"]["all_verified"] is True
    assert out["environment"]["effective_gds_path"] == {"cpu": {"effective": "cpu", "fallback_reason": None}}


def test_gpu_paths_fall_back_into_one_row_per_effective_path(data_file):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GdsFallbackWarning)
        out = run_bench(cfg(data_file, paths=["cufile", "bounce", "cpu"], io_sizes=["1MiB"], threads=[1],
                            cache=["warm"], qd1_samples=0))
    eff = out["environment"]["effective_gds_path"]
    probe = out["environment"]["gds"]
    if probe["paths"]["bounce"]["available"]:
        pytest.skip("this machine has a GPU path")
    assert eff["cufile"]["effective"] == "cpu" and eff["cufile"]["fallback_reason"]
    cells = out["metrics"]["cells"]
    assert len(cells) == 1 and cells[0]["requested"] == ["cufile", "bounce", "cpu"]
    assert "latency_qd1_s" not in cells[0]


def test_max_bytes_and_odirect(data_file):
    out = run_bench(cfg(data_file, max_bytes="1MiB", odirect=True, io_sizes=["256KiB"], threads=[2],
                        cache=["cold"], qd1_samples=5))
    c = out["metrics"]["cells"][0]
    assert c["bytes"] == 1 << 20 and c["verified"] is True
    assert c["reader"]["odirect_requested"] is True


def test_corruption_is_caught_by_the_checksum(data_file):
    class Corrupting:
        def __init__(self, inner):
            self.inner = inner

        def read_into(self, dst, offset, nbytes):
            got = self.inner.read_into(dst, offset, nbytes)
            if offset == 0:
                dst[0] ^= 0xFF
            return got

        def __getattr__(self, name):
            return getattr(self.inner, name)

    def make(name, path, **opts):
        return Corrupting(make_reader(name, path, **opts))

    c = run_cell("cpu", [data_file], 1 << 20, 1, "warm", cfg(data_file, qd1_samples=0), {}, make)
    assert c["verified"] is False


def test_dataset_directory_uses_the_manifest(tmp_path):
    from iobench.manifest import Manifest, ShardEntry, write_manifest
    from iobench.storage import open_backend

    entries = []
    for i in range(2):
        create_file(str(tmp_path / f"shard-{i}.bin"), 300_000 + i, seed=i)
        entries.append(ShardEntry(path=f"shard-{i}.bin", bytes=300_000 + i, samples=1, first_sample=i, checksum="xxh64:0"))
    write_manifest(open_backend(str(tmp_path)), Manifest(format="raw", modality="tokens", compression="none",
                                                         seed=0, spec={}, shards=tuple(entries)))
    out = run_bench(cfg(str(tmp_path), io_sizes=["128KiB"], threads=[1], cache=["warm"], qd1_samples=3))
    assert out["metrics"]["files"] == 2 and out["metrics"]["cells"][0]["bytes"] == 600_001
    assert out["metrics"]["cells"][0]["verified"] is True


@pytest.mark.parametrize("kw,field", [
    ({"paths": ["cufil"]}, "gds.paths"),
    ({"io_sizes": ["12 parsecs"]}, "gds.io_sizes"),
    ({"threads": [0]}, "gds.threads"),
    ({"cache": ["tepid"]}, "gds.cache"),
    ({"qd1_samples": -1}, "gds.qd1_samples"),
    ({"bogus": 1}, "gds.bogus"),
])
def test_bad_config(data_file, kw, field):
    with pytest.raises(ConfigError) as e:
        cfg(data_file, **kw)
    assert str(e.value).startswith(field)


def test_cli_bench_writes_results(tmp_path, capsys):
    target = tmp_path / "new.bin"
    out = tmp_path / "gds.json"
    rc = main(["gds", "bench", str(target), "--create", "1MiB", "--paths", "cpu,kvikio-compat", "--io-size", "256KiB",
               "--threads", "1", "--cache", "warm", "--qd1-samples", "5", "--json", str(out)])
    assert rc == 0
    res = read_results(out)
    assert res["command"] == "gds bench" and res["schema_version"] == 1
    assert res["config"]["paths"] == ["cpu", "kvikio-compat"]
    assert res["metrics"]["cells"][0]["bytes"] == 1 << 20
    assert "effective_gds_path" in res["environment"] and "gds" in res["environment"]
    if not res["environment"]["gds"]["paths"]["kvikio-compat"]["available"]:
        assert any("kvikio-compat" in w for w in res["warnings"])


def test_cli_probe_writes_results(tmp_path, capsys):
    out = tmp_path / "probe.json"
    assert main(["gds", "probe", str(tmp_path), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["command"] == "gds probe" and "cpu" in res["metrics"]["paths_available"]
    assert set(res["environment"]["gds"]["paths"]) == {"cufile", "kvikio-compat", "bounce", "cpu"}


@pytest.mark.parametrize("argv,needle", [
    (["gds", "bench", "{f}", "--paths", "cpu,gds"], "unknown GPU read path 'gds'"),
    (["gds", "bench", "{f}", "--io-size", "lots"], "gds.io_sizes"),
    (["gds", "bench", "{d}/missing.bin"], "does not exist"),
    (["gds", "bench", "s3://bucket/data"], "not local"),
    (["gds", "bench", "{f}", "--set", "gds.nope=1"], "gds.nope"),
    (["gds", "probe", "{d}/missing.bin"], "does not exist"),
    (["gds", "probe", "--timeout", "-1"], "--timeout"),
])
def test_cli_bad_input_exits_2(data_file, tmp_path, capsys, argv, needle):
    argv = [a.format(f=data_file, d=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_cli_strict_on_unavailable_path_exits_2(data_file, capsys):
    from iobench.gds import detect

    if detect.probe(data_file).capabilities["cufile"].available:
        pytest.skip("this machine has cuFile")
    assert main(["gds", "bench", data_file, "--paths", "cufile", "--strict", "--qd1-samples", "0"]) == 2
    err = capsys.readouterr().err
    assert "unavailable here" in err and len(err.strip().splitlines()) == 1


def test_suite_stage(tmp_path):
    from iobench.suite.gds import suite_stage
    from iobench.suite import SuiteContext

    ctx = SuiteContext(out_dir=tmp_path / "out", work_dir=tmp_path / "work")
    ctx.out_dir.mkdir()
    m = suite_stage(ctx)
    assert "cpu" in m["paths_available"] and m["all_verified"] is True
    assert set(m["cpu"]) == {"cold", "warm"} and m["cpu"]["warm"]["bytes_per_s"] > 0
    assert ctx.results_files == [ctx.out_dir / "gds.json"]
    assert read_results(ctx.results_files[0])["command"] == "gds bench"
    assert any(r[1] == "path cpu" for r in ctx.rows) and any("warm cache" in r[1] for r in ctx.rows)


def test_cpu_cost_model_matches_the_seed_example():
    # seed-examples G40: 8 GPUs × 8,000 img/s, 120 µs vs 30 µs of CPU per image.
    c = cpu_cost(8 * 8000, 120e-6, 30e-6)
    assert c.host_cpu_s_per_s == pytest.approx(7.68)
    assert c.direct_cpu_s_per_s == pytest.approx(1.92)
    assert c.cores_freed == pytest.approx(5.76) and round(c.cores_freed) == 6
    assert c.per_transfer_reduction == pytest.approx(0.75) and c.speedup == pytest.approx(4.0)
    assert cores_needed(7e9, 0.5) == pytest.approx(3.5)
    with pytest.raises(ValueError):
        cpu_cost(1, 0, 1)


def test_qd1_offsets_stay_in_file(data_file):
    out = run_bench(cfg(data_file, io_sizes=["1MiB"], threads=[1], cache=["warm"], qd1_samples=50,
                        qd1_max_seconds=5))
    assert out["metrics"]["cells"][0]["latency_qd1_s"]["count"] >= 1
    assert np.isfinite(out["metrics"]["cells"][0]["latency_qd1_s"]["max"])
