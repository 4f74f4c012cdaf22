"""Every command of the README's "Start here" runs as pasted: only the example's paths and hosts are
swapped for this machine's (a scratch directory for /mnt/pfs/scratch, a dataset iobench did not
write for /data/train, the embedded S3 server for s3://bucket/...); the install commands run in a
copy of this checkout (their own .venv, packages from the index).  `git clone` and the `make`
commands are what CI itself runs; `iobench smoke` is run as written by tests/test_smoke.py.

Slow (a `check` runs up to its 60 s cap on a generated dataset): in CI's slow set."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.s3]


def start_here_commands() -> list[str]:
    """The shell commands of the README's "Start here" section, continuation lines joined, comments cut."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Start here"):text.index("\n## ", text.index("## Start here") + 1)]
    out = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            cmd = re.sub(r"\s+#.*$", "", cmd).strip()
            cmd = re.sub(r"\s+", " ", cmd)
            if cmd and not cmd.startswith(("git clone", "make ", "iobench smoke")):
                out.append(cmd)
    return out


def _user_tars(n_tars: int = 4, per_tar: int = 1024, size: int = 4096) -> list[tuple[str, bytes]]:
    """A dataset iobench did not write: webdataset-style tars (key.bin + key.cls), no manifest."""
    import numpy as np

    rng = np.random.default_rng(0)
    tars = []
    for t in range(n_tars):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for i in range(per_tar):
                key = f"sample{t * per_tar + i:08d}"
                for ext, data in ((".bin", rng.bytes(size)), (".cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(key + ext)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        tars.append((f"train-{t:06d}.tar", buf.getvalue()))
    return tars


@pytest.fixture(scope="module")
def places(tmp_path_factory, s3_server):
    import s3fs

    base = tmp_path_factory.mktemp("start-here")
    (base / "scratch").mkdir()
    train = base / "train"
    train.mkdir()
    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    if not fs.exists("bucket"):
        fs.mkdir("bucket")
    for name, data in _user_tars():
        (train / name).write_bytes(data)
        fs.pipe_file(f"bucket/train/{name}", data)
    repo = base / "repo"     # the install commands' clone: this checkout's tracked files
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src, dst = ROOT / rel, repo / rel
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    return {"/mnt/pfs/scratch": str(base / "scratch"), "/data/train": str(train), "s3://bucket/train":
            "s3://bucket/train", "cwd": base, "repo": repo}


def test_start_here_lists_the_commands_it_shows():
    cmds = start_here_commands()
    assert cmds[0].startswith("python3 -m venv .venv") and cmds[1] == ".venv/bin/iobench --version"
    assert sum(c.startswith("iobench check") for c in cmds) == 2
    assert [c.split()[1] for c in cmds if c.startswith("iobench") and "check" not in c] == ["index", "load", "report"]


def test_every_start_here_command_runs_as_pasted(places, s3_env):
    env = {**os.environ, **s3_env.env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for cmd in start_here_commands():
        script = cmd
        for example, here in places.items():
            if example.startswith(("/", "s3://")):
                script = script.replace(example, here)
        install = cmd.startswith(("python3 -m venv", ".venv/"))
        p = subprocess.run(["bash", "-e", "-c", script], cwd=places["repo"] if install else places["cwd"], env=env,
                           capture_output=True, text=True, timeout=900)
        out = p.stdout + p.stderr
        assert "Traceback" not in out and "error:" not in p.stderr, f"{cmd}\n{out}"
        if cmd.startswith("iobench check"):
            # the verdict first; exit 1 is --max-stall's gate saying the stall is above it
            assert p.returncode in (0, 1), f"{cmd}\n{out}"
            assert p.stdout.startswith("at 180.0 ms/step, batch 256, 8 workers: stall"), f"{cmd}\n{out}"
        else:
            assert p.returncode == 0, f"{cmd}\n{out}"
    assert (places["cwd"] / "load.json").exists() and (places["cwd"] / "reports" / "mine" / "report.html").exists()
