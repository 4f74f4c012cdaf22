"""`iobench ckpt` and `iobench ckpt restore`: results files, exit codes, one-line errors."""

from __future__ import annotations

import json

import pytest

from iobench.cli import main


def test_save_then_restore_with_reshard(tmp_path, capsys):
    out, rout = tmp_path / "save.json", tmp_path / "restore.json"
    rc = main(["ckpt", "--preset", "llama3-8b", "--scale", "1e-5", "--count", "3", "--interval-ms", "20",
               "--local", str(tmp_path / "l"), "--durable", str(tmp_path / "d"), "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    m = d["metrics"]["checkpoint"]
    assert d["command"] == "ckpt" and d["schema_version"] == 1
    assert m["saves"]["committed"] == 3 and m["state"]["ranks"] == 8
    for k in ("blocking_s", "local_write_s", "commit_latency_s", "upload_s"):
        assert set(m[k]) == {"count", "min", "mean", "p50", "p90", "p99", "p999", "max"}
    assert m["local_write_bytes_per_s"] > 0 and len(m["timeline"]) == 3 and m["exposure"]
    assert m["exposure"][-1]["step"] == 3
    assert main(["ckpt", "restore", "--durable", str(tmp_path / "d"), "--ranks", "4", "--verify",
                 "--json", str(rout)]) == 0
    r = json.loads(rout.read_text())["metrics"]["checkpoint"]
    assert (r["step"], r["tier"], r["ranks"], r["resharded"], r["verified"]) == (3, "durable", 4, True, True)
    assert r["restore_bytes"] == m["state"]["bytes_per_save"]
    # a rerun into the same tiers continues after the newest step
    assert main(["ckpt", "--preset", "llama3-8b", "--scale", "1e-5", "--count", "1", "--mode", "sync",
                 "--local", str(tmp_path / "l"), "--durable", str(tmp_path / "d"), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["metrics"]["checkpoint"]["timeline"][0]["step"] == 4


def test_restore_without_checkpoint_exits_1(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["ckpt", "restore", "--durable", str(tmp_path / "empty")]) == 1
    assert "no committed checkpoint" in capsys.readouterr().err
    # a durable tier that does not exist is a typo: exit 2, and it is not created
    assert main(["ckpt", "restore", "--durable", str(tmp_path / "none")]) == 2
    assert "--durable" in capsys.readouterr().err and not (tmp_path / "none").exists()


@pytest.mark.parametrize("argv,field", [
    (["--preset", "llama3-9b"], "--preset"),
    (["--preset", "llama3-8b", "--ranks", "6"], "--ranks"),
    (["--preset", "llama3-8b", "--interval-ms", "-1"], "--interval-ms"),
    (["--params", "1e6", "--mode", "eventually"], "--mode"),
    (["--params", "1e6", "--policy", "drop"], "--policy"),
    (["--params", "1e6", "--recipe", "fp8"], "recipe"),
    ([], "--preset"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, field):
    rc = main(["ckpt", *argv, "--durable", str(tmp_path / "d")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and field in err and "\n" not in err


def test_unreachable_durable_tier_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    rc = main(["ckpt", "--params", "1e4", "--durable", "s3://iobench/ckpt", "--endpoint-url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--durable" in err and "\n" not in err


def test_suite_stage_against_embedded_s3(tmp_path, s3_server):
    from iobench.suite.checkpoint import suite_stage
    from iobench.suite import SuiteContext

    ctx = SuiteContext(out_dir=tmp_path / "out", work_dir=tmp_path / "work", s3_url="s3://iobench/t/suite-ckpt",
                       s3_storage_options={"key": s3_server.access_key, "secret": s3_server.secret_key},
                       endpoint_url=s3_server.endpoint_url, config={"checkpoint": {"scale": 2e-5}})
    (tmp_path / "out").mkdir()
    m = suite_stage(ctx)
    assert m["saves_committed"] == 4 and m["restored_step"] == 4 and m["verified"]
    assert len(ctx.results_files) == 2 and all(p.exists() for p in ctx.results_files)
    assert any(r[0] == "checkpoint" for r in ctx.rows)
