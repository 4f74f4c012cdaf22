"""Core pieces: units, config validation, results schema, atomic writes, storage backends, CLI."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from iobench.io.atomic import atomic_open, atomic_write_bytes
from iobench.cli import main
from iobench.config import build, check_choice, deep_merge, parse_set
from iobench.errors import ConfigError, EndpointError, UsageError
from iobench.metrics import LatencyHistogram, merged
from iobench.results import Results, read_results, redact
from iobench.storage import open_backend
from iobench.units import parse_duration, parse_size


def test_parse_size_units_and_errors():
    assert parse_size("64MiB") == 64 * 2**20
    assert parse_size("1.5KB") == 1500
    assert parse_size(4096) == 4096
    for bad in ("0", "-1MiB", "12 parsecs", "", True):
        with pytest.raises(ConfigError):
            parse_size(bad, "shard_size")
    with pytest.raises(ConfigError, match="shard_size"):
        parse_size("abc", "shard_size")


def test_parse_duration():
    assert parse_duration("250ms") == pytest.approx(0.25)
    assert parse_duration("2s") == 2.0
    assert parse_duration(0) == 0.0
    with pytest.raises(ConfigError):
        parse_duration("-5ms")
    with pytest.raises(ConfigError):
        parse_duration(0, allow_zero=False)


@dataclass(frozen=True)
class _Inner:
    depth: int = 2


@dataclass(frozen=True)
class _Cfg:
    workers: int = 1
    name: str = "x"
    ratio: float = 0.5
    fast: bool = False
    inner: _Inner = _Inner()
    sizes: tuple[int, ...] = (1,)

    def __post_init__(self):
        if self.workers < 1:
            raise ConfigError("cfg.workers", f"must be at least 1, got {self.workers}", "use 1 or more")


def test_build_converts_and_freezes():
    cfg = build(_Cfg, {"workers": "4", "fast": "yes", "inner": {"depth": 3}, "sizes": "1,2,3"}, "cfg")
    assert cfg.workers == 4 and cfg.fast is True and cfg.inner.depth == 3 and cfg.sizes == (1, 2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.workers = 5  # frozen


def test_build_rejects_unknown_key_with_nearest_name():
    with pytest.raises(ConfigError) as e:
        build(_Cfg, {"wokers": 2}, "cfg")
    assert "cfg.wokers" in str(e.value) and "workers" in str(e.value)
    with pytest.raises(ConfigError, match="cfg.inner.dpth"):
        build(_Cfg, {"inner": {"dpth": 1}}, "cfg")


def test_build_rejects_bad_values():
    with pytest.raises(ConfigError, match="integer"):
        build(_Cfg, {"workers": "many"}, "cfg")
    with pytest.raises(ConfigError, match="at least 1"):
        build(_Cfg, {"workers": 0}, "cfg")
    with pytest.raises(ConfigError, match="did you mean 'tar'"):
        check_choice("format", "tra", ["raw", "tar", "parquet"])


def test_parse_set_and_merge():
    over = parse_set(["loader.workers=4", "loader.decode=false", "name=abc"])
    assert over == {"loader": {"workers": 4, "decode": False}, "name": "abc"}
    assert deep_merge({"loader": {"workers": 1, "prefetch": 2}}, over)["loader"] == {
        "workers": 4, "prefetch": 2, "decode": False}
    with pytest.raises(ConfigError, match="--set"):
        parse_set(["novalue"])


def test_histogram_summary_and_merge():
    a, b = LatencyHistogram(), LatencyHistogram()
    for i in range(1, 101):
        a.record_s(i / 1000)
    b.record_s(1.0)
    m = merged([a, LatencyHistogram.decode(b.encode())])
    s = m.summary()
    assert s["count"] == 101
    assert s["max"] == pytest.approx(1.0, rel=1e-3)
    assert s["p50"] == pytest.approx(0.051, rel=0.02)
    assert LatencyHistogram().summary()["p99"] is None


def test_fast_summary_equals_hdrh_own_scan():
    import numpy as np

    h = LatencyHistogram()
    for v in np.random.default_rng(3).lognormal(11, 1.5, 3000).astype(int):
        h.record_ns(int(v))
    raw = h._h
    s = h.summary()
    assert s["mean"] == raw.get_mean_value() / 1e9
    for key, p in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
        assert s[key] == raw.get_value_at_percentile(p) / 1e9
    assert h.cdf(10) == [(raw.get_value_at_percentile(10.0 * i) / 1e9, i / 10) for i in range(11)]


def test_results_schema_and_redaction(tmp_path):
    r = Results(command="demo", config={"s3": {"secret": "hunter2", "key": "AKIA", "endpoint_url": "http://x"}})
    r.metrics[STALL_RATIO] = 0.1
    r.warn("first step excluded")
    path = r.write(tmp_path / "out.json")
    text = path.read_text()
    assert "hunter2" not in text and "AKIA" not in text
    data = read_results(path)
    for key in ("schema_version", "command", "iobench_version", "started_at", "host", "config", "environment",
                "world", "metrics", "warnings"):
        assert key in data
    assert data["config"]["s3"]["endpoint_url"] == "http://x"
    assert redact({"nested": [{"password": "p"}]}) == {"nested": [{"password": "***"}]}
    with pytest.raises(ConfigError):
        read_results(tmp_path / "missing.json")


def test_atomic_open_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "sub" / "file.bin"
    with pytest.raises(RuntimeError), atomic_open(target) as f:
        f.write(b"partial")
        raise RuntimeError("boom")
    assert not target.exists()
    assert list((tmp_path / "sub").iterdir()) == []
    atomic_write_bytes(target, b"whole")
    assert target.read_bytes() == b"whole"


def test_atomic_write_fsyncs_file_and_directory(tmp_path, monkeypatch):
    calls = []
    real = os.fsync

    def counting(fd):
        calls.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    atomic_write_bytes(tmp_path / "m.json", b"{}")
    assert any(c.startswith(str(tmp_path / ".m.json.")) for c in calls)   # the file, before rename
    assert str(tmp_path) in calls                                          # then its directory


def test_local_and_memory_backends(tmp_path):
    for url in (str(tmp_path / "ds"), "memory://iobench-core-test"):
        b = open_backend(url)
        b.makedirs()
        b.write_bytes("a/x.bin", b"0123456789")
        assert b.size("a/x.bin") == 10
        assert b.cat("a/x.bin", 2, 5) == b"234"
        with pytest.raises(ValueError), b.open_output("a/y.bin") as f:
            f.write(b"half")
            raise ValueError("fail")
        assert not b.exists("a/y.bin")


def test_open_backend_rejects_bad_urls():
    with pytest.raises(ConfigError, match="scheme"):
        open_backend("nosuchscheme://host/x")  # ftp:// is an fsspec protocol now
    with pytest.raises(ConfigError, match="bucket"):
        open_backend("s3://")
    with pytest.raises(ConfigError, match="endpoint"):
        open_backend("s3://b/p", endpoint_url="127.0.0.1:9")


@pytest.mark.s3
def test_s3_backend_roundtrip_and_abort(s3_server, s3_prefix):
    opts = {"key": s3_server.access_key, "secret": s3_server.secret_key}
    b = open_backend(s3_prefix, endpoint_url=s3_server.endpoint_url, storage_options=opts, check=True)
    payload = os.urandom(7 * 2**20)  # > 5 MiB: exercises a multipart upload
    with b.open_output("big.bin") as f:
        f.write(payload)
    assert b.size("big.bin") == len(payload)
    assert b.cat("big.bin", 100, 200) == payload[100:200]
    with pytest.raises(RuntimeError), b.open_output("never.bin") as f:
        f.write(os.urandom(6 * 2**20))
        raise RuntimeError("abort")
    assert not b.exists("never.bin")


@pytest.mark.s3
def test_s3_unreachable_and_missing_bucket(s3_server):
    opts = {"key": s3_server.access_key, "secret": s3_server.secret_key}
    with pytest.raises(EndpointError, match="does not exist"):
        open_backend("s3://no-such-bucket-xyz/p", endpoint_url=s3_server.endpoint_url, storage_options=opts,
                     check=True)
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(EndpointError, match="cannot reach"):
        open_backend("s3://iobench/p", endpoint_url=f"http://127.0.0.1:{port}", storage_options=opts, check=True)


def test_cli_version_and_bad_command(capsys):
    assert main(["version"]) == 0
    assert "iobench" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["no-such-command"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "invalid choice" in err[0]


def test_cli_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "iobench.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "version" in out.stdout


def test_cli_registers_every_command_module_and_a_plain_load_skips_yaml_and_the_planner():
    import pkgutil

    from iobench import commands
    from iobench.cli import _command_names, build_parser

    want = sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))
    assert _command_names() == want and "load" in want
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(sub.choices) == want
    # start-up: what `iobench load DATA` imports before it reads anything (fresh interpreter)
    code = ("import sys; from iobench.cli import build_parser; import iobench.commands.load, iobench.loader.core, "
            "iobench.storage, iobench.results, iobench.dist.launch; "
            "iobench.storage.parse_storage_options([]); "
            "print(sorted(m for m in ('yaml', 'iobench.planner.pipeline', 'iobench.loader.analysis') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_usage_error_is_one_line():
    e = ConfigError("loader.prefetch", "must be at least 1, got 0", "use --prefetch 1 or more")
    assert "\n" not in str(e) and str(e).startswith("loader.prefetch:")
    assert isinstance(e, UsageError) and e.exit_code == 2


def test_results_json_is_valid(tmp_path):
    p = Results(command="x").write(tmp_path / "r.json")
    json.loads(p.read_text())


def test_suite_config_validates_cluster_files(tmp_path):
    from pathlib import Path

    from iobench.suite import load_suite_config

    example = load_suite_config(str(Path(__file__).parents[1] / "examples" / "cluster.yaml"))
    assert example.object.url.startswith("s3://") and example.checkpoint.scale == 0.001
    bad = tmp_path / "bad.yaml"
    bad.write_text("objct:\n  url: s3://b/p\n")
    with pytest.raises(ConfigError, match="did you mean 'object'"):
        load_suite_config(str(bad))
    bad.write_text("object:\n  url: /local/path\n")
    with pytest.raises(ConfigError, match="object.url"):
        load_suite_config(str(bad))
    bad.write_text("checkpoint:\n  scale: 2\n")
    with pytest.raises(ConfigError, match="checkpoint.scale"):
        load_suite_config(str(bad))
