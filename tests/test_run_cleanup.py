"""`iobench run --config` against a cluster object store removes what it created there — its
own iobench-run-XXXX prefix — and nothing else under the configured URL."""

from __future__ import annotations

import pytest

from iobench.cli import main


@pytest.mark.s3
@pytest.mark.slow  # ~90 s here: the generate stage writes every format locally and on S3
def test_run_config_removes_only_its_own_s3_prefix(tmp_path, s3_env, s3_prefix):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_env.storage_options())
    base = s3_prefix[len("s3://"):]
    fs.pipe(f"{base}/users-data.bin", b"keep me")
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(f"work_dir: {tmp_path}\nobject:\n  url: {s3_prefix}\n  endpoint_url: {s3_env.endpoint_url}\n")
    rc = main(["run", "--config", str(cfg), "--stages", "generate", "--out", str(tmp_path / "out"), "--no-progress"])
    assert rc == 0
    fs.invalidate_cache()
    left = sorted(p.rsplit("/", 1)[-1] for p in fs.find(base))
    assert left == ["users-data.bin"], left
    assert fs.cat(f"{base}/users-data.bin") == b"keep me"
