"""Storage probe against the embedded S3 server: curves, metadata, small files, safety."""

from __future__ import annotations

import json

import pytest
import s3fs

from iobench.config import build
from iobench.errors import ConfigError
from iobench.probe.metadata import MetadataConfig, run_metadata_probe
from iobench.probe.s3ops import probe_storage_options
from iobench.probe.safety import ProbeArea

pytestmark = pytest.mark.s3


def _keys(s3_server, prefix):
    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    try:
        found = fs.find(prefix[len("s3://"):], detail=True)
    except FileNotFoundError:
        return []
    return sorted(k for k, v in found.items() if v.get("type") != "directory")   # SeaweedFS shows empty folders


def test_s3_probe_cli_curves(s3_env, s3_prefix, tmp_path):
    from iobench.cli import main

    out = tmp_path / "s3.json"
    rc = main(["probe", "s3", s3_prefix, "--sizes", "4KiB,64KiB", "--concurrency", "1,3", "--runtime", "0.05s",
               "--range-size", "16KiB", "--part-sizes", "5MiB", "--multipart-size", "6MiB", "--size", "32MiB",
               "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    s3 = data["metrics"]["tiers"]["object"]["s3"]
    pts = s3["points"]
    assert {(p["op"], p["object_size"], p["concurrency"]) for p in pts} >= {
        ("put", 4096, 1), ("put", 65536, 3), ("get", 4096, 3), ("get", 65536, 1), ("range_get", 16384, 3)}
    for p in pts:
        assert p["requests"] >= p["concurrency"] and p["errors"] == 0
        if p["op"] in ("get", "range_get"):
            assert p["bytes"] == p["requests"] * p["object_size"]   # bytes counted as they arrive
            assert 0 < p["ttfb_s"]["p50"] <= p["latency_s"]["max"]
    mp = s3["multipart"]
    assert mp[0]["parts"] == 2 and mp[0]["bytes_per_s"] > 0
    assert s3["retries"] >= 0 and s3["throttled"] == 0 and s3["throttle_answers"] == 0
    assert {"throughput_vs_concurrency", "throughput_vs_object_size", "ttfb_vs_object_size",
            "latency_cdf"} <= set(s3["plots"])
    row = data["metrics"]["summary"]["object"]
    assert row["seq_read_bytes_per_s"] > 0 and row["rand_read_bs"] == 16384
    assert "secret" not in out.read_text().lower() or "***" in out.read_text()
    assert s3_env.secret_key not in out.read_text()
    assert _keys(s3_env, s3_prefix) == []


def test_s3_metadata_and_smallfiles(s3_server, s3_prefix):
    from iobench.probe.smallfiles import SmallFilesConfig, run_smallfiles_probe

    opts = probe_storage_options(s3_server.storage_options(), 4)
    area = ProbeArea.open(s3_prefix, 16 << 20, storage_options=opts)
    try:
        md = run_metadata_probe(area, build(MetadataConfig, {"files": 24, "workers": 4, "dirs": 2,
                                                            "file_size": "1KiB"}))["metrics"]
        sf = run_smallfiles_probe(area, build(SmallFilesConfig, {"samples": 24, "modality": "tokens", "seq_len": 256,
                                                                 "shard_size": "8 samples", "shard_formats": ["raw"],
                                                                 "workers": 2}), storage_options=opts)["metrics"]
    finally:
        area.close()
    assert list(md["phases"]) == ["put", "head", "get", "list", "delete"]
    for name in ("put", "head", "get", "delete"):
        assert md["phases"][name]["ops"] == 24
    assert md["phases"]["get"]["bytes"] == 24 * 1024
    assert md["phases"]["list"]["ops"] >= 2          # one page per prefix at least
    assert sf["formats"]["files"]["opens"] == 24 and sf["formats"]["raw"]["opens"] == 3
    assert sf["formats"]["files"]["samples"] == sf["formats"]["raw"]["samples"] == 24
    assert sf["penalty"] > 0
    assert _keys(s3_server, s3_prefix) == []


def test_s3_refuses_non_empty_prefix_and_keeps_foreign_objects(s3_server, s3_prefix):
    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    path = s3_prefix[len("s3://"):]
    fs.pipe(f"{path}/theirs.bin", b"precious")
    with pytest.raises(ConfigError, match="not empty"):
        ProbeArea.open(s3_prefix, 1 << 20, storage_options=s3_server.storage_options())
    area = ProbeArea.open(s3_prefix, 1 << 20, force=True, storage_options=s3_server.storage_options())
    run_metadata_probe(area, build(MetadataConfig, {"files": 5, "workers": 2, "dirs": 1}))
    area.close()
    assert _keys(s3_server, s3_prefix) == [f"{path}/theirs.bin"]
    assert fs.cat(f"{path}/theirs.bin") == b"precious"
