"""`iobench smoke` against the embedded SeaweedFS server, including the failures CI must see."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import json
import socket
import time
import xml.etree.ElementTree as ET

import pytest

from iobench.cli import main
from iobench.smoke import CHECKS, run_smoke

pytestmark = pytest.mark.s3


def _junit(path):
    root = ET.parse(path).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    return root, cases


def _objects(server, prefix):
    import s3fs

    fs = s3fs.S3FileSystem(**server.storage_options())
    # Only keys below the prefix: SeaweedFS reports an emptied prefix itself as a directory.
    return [k for k in fs.find("iobench/") if k.startswith(f"iobench/{prefix}/")]


def test_smoke_passes_and_cleans_up(s3_env, tmp_path, capsys):
    junit, out = tmp_path / "smoke.xml", tmp_path / "smoke.json"
    rc = main(["smoke", "--endpoint-url", s3_env.endpoint_url, "--bucket", "iobench", "--prefix", "ci/smoke-ok",
               "--junit", str(junit), "--json", str(out)])
    assert rc == 0, capsys.readouterr()
    root, cases = _junit(junit)
    assert list(cases) == list(CHECKS)
    assert root.get("failures") == "0" and root.get("skipped") == "0"
    assert all(len(c) == 0 for c in cases.values())      # no <failure> or <skipped> children
    m = json.loads(out.read_text())["metrics"]
    assert m["passed"] and 0 <= m[STALL_RATIO] <= 1 and m["batch_wait_s"]["count"] > 0
    assert _objects(s3_env, "ci/smoke-ok") == []
    text = json.dumps(json.loads(out.read_text()))
    assert s3_env.secret_key not in text and s3_env.secret_key not in junit.read_text()


def test_wrong_credentials_fail_the_connect_check(s3_env, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    junit = tmp_path / "smoke.xml"
    assert main(["smoke", "--endpoint-url", s3_env.endpoint_url, "--bucket", "iobench", "--junit", str(junit),
                 "--timeout", "30s"]) == 1
    root, cases = _junit(junit)
    failure = cases["connect"].find("failure")
    assert failure is not None and "denied" in failure.get("message")
    assert cases["write dataset"].find("skipped") is not None


def test_missing_bucket_fails_clearly(s3_env, tmp_path):
    report = run_smoke(s3_env.endpoint_url, "no-such-bucket-here", timeout_s=30)
    assert not report.passed
    connect = report.checks[0]
    assert connect.status == "failed" and "does not exist" in connect.message


def test_unreachable_endpoint_is_a_failed_check_not_bad_input(s3_env, tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t0 = time.perf_counter()
    assert main(["smoke", "--endpoint-url", f"http://127.0.0.1:{port}", "--bucket", "iobench", "--timeout", "30s"]) == 1
    assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize("argv", [
    ["--bucket", "Bad_Bucket"],
    ["--bucket", "iobench", "--endpoint-url", "ftp://127.0.0.1:1"],
    ["--bucket", "iobench", "--timeout", "0"],
    ["--bucket", "iobench", "--timeout", "30"],   # no unit
    ["--bucket", "iobench", "--max-stall", "2"],
    [],
])
def test_malformed_flags_are_bad_input(argv):
    with pytest.raises(SystemExit) if not argv else _nothing():
        rc = main(["smoke", *argv])
        assert rc == 2


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_server_stopped_mid_run_fails_without_hanging(monkeypatch, tmp_path):
    from iobench.s3server import S3Server

    server = S3Server(bucket="iobench").start()
    try:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)

        def stop_after_write(check):
            if check.name == "write dataset" and check.status == "passed":
                server.stop(timeout_s=1)     # SIGTERM, then SIGKILL: the store dies mid-run

        t0 = time.perf_counter()
        report = run_smoke(server.endpoint_url, "iobench", timeout_s=20, on_check=stop_after_write)
        elapsed = time.perf_counter() - t0
    finally:
        server.stop()
    status = {c.name: c.status for c in report.checks}
    assert status["connect"] == status["write dataset"] == "passed"
    assert status["verify dataset"] == "failed" and status["cleanup"] == "failed"
    assert status["read with stall measurement"] == "skipped"     # the store is gone: no waiting out retries
    assert not report.passed and elapsed < 60
    assert all(c.message for c in report.checks if c.status == "failed")


def test_ci_examples_run_the_smoke_command():
    from pathlib import Path

    import yaml

    ex = Path(__file__).resolve().parent.parent / "examples"
    wf = yaml.safe_load((ex / "github-actions-smoke.yml").read_text())
    steps = [s.get("run", "") for s in wf["jobs"]["smoke"]["steps"]]
    assert any("iobench smoke" in s and "--junit" in s and "--bucket" in s for s in steps)
    assert any("minio/minio" in s for s in steps)
    compose = yaml.safe_load((ex / "docker-compose.smoke.yml").read_text())
    assert {"minio", "create-bucket", "smoke"} <= set(compose["services"])
    assert "iobench smoke" in " ".join(compose["services"]["smoke"]["command"])  # [sh, -c, one line]
    cluster = yaml.safe_load((ex / "cluster.yaml").read_text())
    assert cluster["object"]["url"].startswith("s3://") and "planner" in cluster


def _ci_examples() -> list[tuple[str, str]]:
    """Every `iobench smoke` command the README, the docs and the Actions workflow show, as written."""
    import re
    from pathlib import Path

    import yaml

    root = Path(__file__).parents[1]
    out = []
    for doc in ("README.md", "docs/commands.md"):
        for cmd in re.findall(r"^(iobench smoke [^\n]+)$", (root / doc).read_text(), re.M):
            out.append((doc, re.sub(r"\s*\[--json [^\]]+\]", "", cmd)))
    wf = yaml.safe_load((root / "examples" / "github-actions-smoke.yml").read_text())
    step = next(s for s in wf["jobs"]["smoke"]["steps"] if s.get("name") == "iobench smoke")
    out.append(("examples/github-actions-smoke.yml", step["run"].strip()))
    return out


@pytest.mark.parametrize("where,cmd", _ci_examples(), ids=[w for w, _ in _ci_examples()])
def test_every_ci_smoke_example_passes_as_written(s3_env, tmp_path, where, cmd):
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    import s3fs

    bucket = re.search(r"--bucket (\S+)", cmd).group(1)
    env = {**os.environ, **s3_env.env(), "S3_ENDPOINT": s3_env.endpoint_url, "BUCKET": "iobench-ci",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    bucket = bucket.replace('"$BUCKET"', env["BUCKET"])
    fs = s3fs.S3FileSystem(**s3_env.storage_options())
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    # the example's host is the only thing swapped: its own store for the embedded one
    script = re.sub(r"http://(minio|127\.0\.0\.1):9000", s3_env.endpoint_url, cmd)
    p = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, f"{where}: {cmd}\n{p.stdout}{p.stderr}"
    assert "smoke: passed (7/7 checks" in p.stdout


@pytest.mark.parametrize("flags", [["--steps", "1"], ["--step-time", "0ms"], ["--max-stall", "2"],
                                   ["--bucket", "ci"]])
def test_bad_read_flags_are_bad_input(flags, capsys):
    args = ["smoke", "--endpoint-url", "http://127.0.0.1:9", "--bucket", "iobench-ci", *flags]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0]
