"""Shared fixtures: a real SeaweedFS S3 server on 127.0.0.1 for the whole session."""

from __future__ import annotations

import os
import re
import sys
import tempfile

import pytest

# Every results file a test writes (in this process or a command it starts) is checked against
# docs/results.schema.json before it is written (iobench.results.write_json).
os.environ["IOBENCH_VALIDATE_RESULTS"] = "1"


# Scratch a test or the code under test leaves in the system temp directory outlives every run (a
# temp dir of Python's default name from a bare mkdtemp(), or one of iobench's own prefixes): the
# session fails naming each, so a leak anywhere in the suite is caught, not only where a test looks.
_LEAKED = re.compile(r"^(tmp[a-z0-9_]{8}|iobench-.*)$")


def _temp_entries() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if _LEAKED.match(n)}


def pytest_sessionstart(session):
    session.config.stash[_TEMP_BEFORE] = _temp_entries()


def pytest_sessionfinish(session, exitstatus):
    left = sorted(_temp_entries() - session.config.stash.get(_TEMP_BEFORE, set()))
    if left and exitstatus == pytest.ExitCode.OK:
        print(f"\nthe session left these in {tempfile.gettempdir()}: {left}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_TEMP_BEFORE = pytest.StashKey[set]()


def _has_gpu() -> bool:
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def pytest_collection_modifyitems(config, items):
    # every test that starts the embedded server carries the `s3` marker (`-m "not s3"` skips them all)
    for item in items:
        if "s3_server" in getattr(item, "fixturenames", ()) and "s3" not in item.keywords:
            item.add_marker(pytest.mark.s3)
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _iobench_cache_dir(tmp_path_factory):
    """Indexed manifests and host ceilings (iobench.driver.cache_dir) go to a session directory, not ~/.cache."""
    # The host's ceiling is calibrated once per batch shape; tests have dozens of shapes, so it is off
    # unless a test asks for it (IOBENCH_HOST_CEILING=cached, or --host-ceiling).
    want = {"IOBENCH_CACHE_DIR": str(tmp_path_factory.mktemp("iobench-cache")), "IOBENCH_HOST_CEILING": "off"}
    old = {k: os.environ.get(k) for k in want}
    os.environ.update(want)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def s3_server():
    """The embedded S3 server; yields the running S3Server (bucket 'iobench')."""
    from iobench.s3server import S3Server

    server = S3Server(bucket="iobench").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """AWS_* variables pointing at the embedded server, for code that reads the environment."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def s3_prefix(s3_server, request):
    """A fresh s3:// prefix per test, removed afterwards."""
    import s3fs

    name = request.node.name.replace("[", "_").replace("]", "_").replace("/", "_")[:80]
    prefix = f"iobench/t/{name}-{os.getpid()}"
    yield f"s3://{prefix}"
    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    try:
        fs.rm(prefix, recursive=True)
    except FileNotFoundError:
        pass


@pytest.fixture
def read_throttle():
    """Factory: ``read_throttle(path, bytes_per_s)`` -> a ReadThrottle (context manager) on path's disk.

    Kernel-throttled reads for this process and the workers it forks (iobench.throttle);
    the test is skipped, with the reason, where no cgroup throttle or block device exists.
    """
    from iobench.blockdev import device_of
    from iobench.throttle import ReadThrottle, available

    ok, why = available()
    if not ok:
        pytest.skip(f"no kernel read throttle here: {why}")

    def make(path: str, bytes_per_s: int) -> ReadThrottle:
        dev = device_of(path)
        if dev is None:
            pytest.skip(f"{path} is not on a block device (tmpfs/overlay): nothing to throttle")
        return ReadThrottle(dev, bytes_per_s, tag=f"test{os.getpid()}")

    return make
