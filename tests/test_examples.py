"""The shipped examples run as written: the compose service's command through `sh` against the
embedded S3 server, the Actions workflow's shape (permissions, pinned images, a health check
that fails), and the README's training-step callback."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
BIN = Path(sys.executable).parent


def _shim(d: Path, name: str, body: str) -> None:
    p = d / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


@pytest.mark.s3
def test_compose_smoke_command_runs_through_sh(tmp_path, s3_server):
    import s3fs

    doc = yaml.safe_load((ROOT / "examples" / "docker-compose.smoke.yml").read_text())
    cmd = doc["services"]["smoke"]["command"]
    assert cmd[:2] == ["sh", "-c"] and "\n" not in cmd[2].strip()
    script = cmd[2].replace("http://minio:9000", s3_server.endpoint_url)
    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    fs.mkdir("iobench-smoke", exist_ok=True)
    # The container's `pip install` is its setup, not what is under test: a shim records it.
    shims = tmp_path / "shims"
    shims.mkdir()
    _shim(shims, "pip", f'echo "$@" > {tmp_path / "pip-args"}')
    env = {**os.environ, **s3_server.env(), "PATH": f"{shims}:{BIN}:{os.environ['PATH']}"}
    env.pop("COLUMNS", None)
    work = tmp_path / "src"
    work.mkdir()
    p = subprocess.run(["sh", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "pip-args").read_text().split() == ["install", "-q", ".[s3]"]
    junit = (work / "reports" / "smoke" / "junit.xml").read_text()
    assert "<testsuite" in junit and 'failures="0"' in junit
    assert (work / "reports" / "smoke" / "smoke.json").exists()


def test_compose_and_actions_images_are_pinned():
    for name in ("docker-compose.smoke.yml", "github-actions-smoke.yml"):
        text = (ROOT / "examples" / name).read_text()
        yaml.safe_load(text)
        images = re.findall(r"\b(minio/(?:minio|mc)(?::\S+)?)", text)
        assert images and all(":RELEASE." in i for i in images), images


def test_actions_example_permissions_and_failing_health_check(tmp_path):
    wf = yaml.safe_load((ROOT / "examples" / "github-actions-smoke.yml").read_text())
    assert wf["permissions"]["checks"] == "write"
    steps = wf["jobs"]["smoke"]["steps"]
    start = next(s for s in steps if s.get("name") == "Start MinIO")["run"]
    # Run the step with MinIO never coming up (nothing listens on the port): it must fail.
    shims = tmp_path / "shims"
    shims.mkdir()
    _shim(shims, "docker", 'echo "docker $*"')
    _shim(shims, "sleep", "exit 0")  # the 60 one-second waits, without the wait
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "S3_ENDPOINT": "http://127.0.0.1:9",
           "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    p = subprocess.run(["bash", "-e", "-c", start], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0, p.stdout
    assert "docker logs minio" in p.stdout


def test_callback_module_from_the_current_directory(tmp_path):
    """`--compute-fn mytrain:step` finds mytrain.py where the user runs iobench (module path fix)."""
    ds = tmp_path / "ds"
    subprocess.run([str(BIN / "iobench"), "gen", "--out", str(ds), "--num-samples", "64", "--seq-len", "2048"],
                   check=True, capture_output=True, timeout=120)
    (tmp_path / "mytrain.py").write_text("CALLS = []\ndef step(batch, i):\n    assert batch.data.shape[1] == 2048\n")
    p = subprocess.run([str(BIN / "iobench"), "load", str(ds), "--compute-mode", "callback", "--compute-fn",
                        "mytrain:step", "--steps", "3", "--no-progress"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_readme_torch_step_example_runs(tmp_path):
    pytest.importorskip("torch")
    ds = tmp_path / "ds"
    subprocess.run([str(BIN / "iobench"), "gen", "--out", str(ds), "--num-samples", "64", "--seq-len", "2048"],
                   check=True, capture_output=True, timeout=120)
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"iobench load DATA (--compute-mode callback --compute-fn examples/torch_step\.py:step)", readme)
    assert m, "README names the example command"
    p = subprocess.run([str(BIN / "iobench"), "load", str(ds), *m.group(1).split(), "--steps", "3", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
