"""open_reader: unknown names, --strict, fallbacks with recorded reasons; KvikIO without libcuda."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types

import pytest

from iobench.errors import ConfigError
from iobench.gds import GdsFallbackWarning, detect, open_reader


def probe_with(available: set[str]) -> detect.Probe:
    caps = {n: detect.Capability(n, n in available, () if n in available else (f"{n} missing here",))
            for n in ("cufile", "kvikio-compat", "bounce", "cpu")}
    return detect.Probe({"host": {}, "file": {}, "runtime": {}}, caps)


@pytest.fixture
def small_file(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(range(256)) * 64)
    return str(p)


def test_unknown_path_name(small_file):
    with pytest.raises(ConfigError, match="did you mean 'cufile'"):
        open_reader("cufil", small_file)
    with pytest.raises(ConfigError, match="unknown GPU read path"):
        open_reader("nvme", small_file)


def test_cpu_needs_no_probe(small_file):
    r, eff, why = open_reader("cpu", small_file, probe=object())  # never consulted
    assert (eff, why) == ("cpu", None)
    r.close()


def test_strict_unavailable_is_a_usage_error(small_file):
    with pytest.raises(ConfigError) as e:
        open_reader("cufile", small_file, strict=True, probe=probe_with({"cpu"}), field="--paths")
    assert e.value.exit_code == 2
    assert "--paths" in str(e.value) and "cufile missing here" in str(e.value) and "--strict" in str(e.value)


def test_fallback_warns_and_records_reason(small_file):
    with pytest.warns(GdsFallbackWarning, match="fell back to 'cpu'"):
        r, eff, why = open_reader("bounce", small_file, probe=probe_with({"cpu"}))
    assert eff == "cpu" and "bounce missing here" in why
    buf = bytearray(10)
    assert r.read_into(buf, 256, 10) == 10 and bytes(buf) == bytes(range(10))
    r.close()


def test_fallback_on_the_real_probe(small_file):
    pr = detect.probe(small_file)
    if pr.capabilities["cufile"].available:
        pytest.skip("this machine has cuFile")
    with pytest.warns(GdsFallbackWarning):
        r, eff, why = open_reader("cufile", small_file, probe=pr)
    assert eff == pr.best() and why.startswith("cufile: ")
    r.close()


@pytest.fixture
def fake_kvikio_without_libcuda(monkeypatch, tmp_path):
    """A kvikio that imports (as the real wheel does with no driver) but fails on first use, as it does."""
    import tempfile

    import iobench.gds.kvikio_paths as kvikio_paths

    # the strict cuFile config the cufile path writes lives until the process exits: this test's
    # goes to its own directory, and neither the file nor the variable naming it outlives the test
    monkeypatch.setattr(kvikio_paths, "_strict_config_path", None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("CUFILE_ENV_PATH_JSON", "")
    kv = types.ModuleType("kvikio")
    kv.__version__ = "26.10.00"
    kv.CompatMode = types.SimpleNamespace(ON=1, OFF=0, AUTO=2)
    defaults = types.ModuleType("kvikio.defaults")
    defaults.set = lambda cfg: None
    defaults.is_compat_mode_preferred = lambda: True
    kv.defaults = defaults

    class CuFile:
        def __init__(self, path, flags="r"):
            raise RuntimeError("KvikIO failure at: shim/utils.cpp:21: libcuda.so.1: cannot open shared object file")

    kv.CuFile = CuFile
    monkeypatch.setitem(sys.modules, "kvikio", kv)
    monkeypatch.setitem(sys.modules, "kvikio.defaults", defaults)
    monkeypatch.delenv("CUFILE_ENV_PATH_JSON", raising=False)
    return kv


def test_kvikio_without_libcuda_falls_back_not_crashes(small_file, fake_kvikio_without_libcuda):
    # Even if a (wrong) probe claims the KvikIO paths work, opening one fails and we fall back.
    pr = probe_with({"cufile", "kvikio-compat", "cpu"})
    with pytest.warns(GdsFallbackWarning):
        r, eff, why = open_reader("cufile", small_file, probe=pr)
    assert eff == "cpu"
    assert "cufile: failed to open (RuntimeError" in why and "kvikio-compat: failed to open" in why
    assert "libcuda.so.1" in why
    r.close()
    with pytest.raises(ConfigError, match="failed to open"):
        open_reader("kvikio-compat", small_file, strict=True, probe=pr)


def _kvikio_python() -> str | None:
    """An interpreter with the real kvikio wheel (set IOBENCH_KVIKIO_PYTHON; not part of CI's .venv)."""
    exe = os.environ.get("IOBENCH_KVIKIO_PYTHON")
    if not exe or not shutil.which(exe):
        return None
    ok = subprocess.run([exe, "-c", "import kvikio"], capture_output=True, timeout=120).returncode == 0
    return exe if ok else None


def test_real_kvikio_wheel_without_libcuda_is_unavailable(small_file):
    exe = _kvikio_python()
    if exe is None:
        pytest.skip("set IOBENCH_KVIKIO_PYTHON to a python with kvikio-cu12 installed")
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    pr = detect.probe(small_file, python=exe, cache=False)
    rt = pr.facts["runtime"]
    assert rt["complete"] and rt["kvikio"]["importable"] is True and rt["libs"]["kvikio"] is True
    assert rt["cuda"]["libcuda"] is False
    for name in ("cufile", "kvikio-compat"):
        cap = pr.capabilities[name]
        assert not cap.available and "libcuda" in cap.reason
    assert pr.best() == "cpu"


def test_load_file_whole(small_file):
    from iobench.gds import load_file

    buf, n, eff, why = load_file("cpu", small_file, threads=2, task_size=4096)
    assert (n, eff, why) == (64 * 256, "cpu", None)
    assert buf[:n].tobytes() == bytes(range(256)) * 64
    with pytest.warns(GdsFallbackWarning):
        buf, n, eff, why = load_file("bounce", small_file, probe=probe_with({"cpu"}))
    assert eff == "cpu" and "bounce missing here" in why and n == 64 * 256


def _shim(tmp_path) -> str:
    """iobench importable from this tree without installing it (the layout maps gds/ to iobench.gds)."""
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    site = tmp_path / "site"
    (site / "iobench").mkdir(parents=True)
    for p in (root / "iobench").iterdir():
        os.symlink(p, site / "iobench" / p.name)
    for name in ("gds", "formats", "checkpointing"):
        os.symlink(root / name, site / "iobench" / name)
    return str(site)


REAL_KVIKIO = """
import sys, warnings, json
from iobench.gds import detect, open_reader, make_reader
caps = {n: detect.Capability(n, n in ("cufile", "kvikio-compat", "cpu")) for n in detect.PATH_NAMES}
pr = detect.Probe({}, caps)
out = {}
for name in ("cufile", "kvikio-compat"):
    try:
        make_reader(name, sys.argv[1])
        out[name] = "opened"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    r, eff, why = open_reader("cufile", sys.argv[1], probe=pr)
buf = bytearray(4)
out["fallback"] = [eff, why, r.read_into(buf, 0, 4)]
print(json.dumps(out))
"""


def test_real_kvikio_wheel_in_process_without_libcuda(small_file, tmp_path):
    """The real KvikIO, forced past the probe: opening fails with libcuda's error, and we fall back."""
    exe = _kvikio_python()
    if exe is None:
        pytest.skip("set IOBENCH_KVIKIO_PYTHON to a python with kvikio-cu12 installed")
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    env = {**os.environ, "PYTHONPATH": _shim(tmp_path)}
    res = subprocess.run([exe, "-c", REAL_KVIKIO, small_file], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path)  # not the repo root, whose iobench/ (without gds) would shadow the shim
    if res.returncode != 0 and "ModuleNotFoundError" in res.stderr:
        pytest.skip(f"that python lacks iobench's dependencies: {res.stderr.strip().splitlines()[-1]}")
    assert res.returncode == 0, res.stderr
    out = __import__("json").loads(res.stdout.strip().splitlines()[-1])
    assert out["cufile"].startswith("RuntimeError") and out["kvikio-compat"].startswith("RuntimeError")
    assert "libcuda" in out["kvikio-compat"]
    eff, why, n = out["fallback"]
    assert eff == "cpu" and n == 4 and "failed to open" in why
