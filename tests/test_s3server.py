"""The embedded SeaweedFS server: starts on loopback, serves S3, stops cleanly, keeps secrets out."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.s3


def test_session_server_serves_s3(s3_server):
    import s3fs

    assert s3_server.endpoint_url.startswith("http://127.0.0.1:")
    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    fs.pipe_file("iobench/hello.txt", b"hi")
    assert fs.cat_file("iobench/hello.txt") == b"hi"
    fs.rm_file("iobench/hello.txt")
    assert s3_server.secret_key not in repr(s3_server)


def test_wrong_credentials_are_refused(s3_server):
    import s3fs

    opts = s3_server.storage_options()
    opts["secret"] = "not-the-secret"
    fs = s3fs.S3FileSystem(**opts)
    with pytest.raises(Exception):  # noqa: B017 — s3fs's error for a bad signature varies by version
        fs.pipe_file("iobench/denied.txt", b"x")


def test_private_server_stops_and_cleans_up():
    import s3fs

    from iobench.s3server import S3Server

    tmp_before = set(os.listdir("/tmp"))
    server = S3Server(bucket="private").start()
    pid, data_dir = server.pid, server.data_dir
    # a restart (how `iobench run` puts each S3 load pass on its own server instance) is a new process
    # on the same data, endpoint and credentials
    fs = s3fs.S3FileSystem(**server.storage_options())
    fs.pipe_file("private/kept.bin", b"x" * 1000)
    endpoint = server.endpoint_url
    server.restart()
    assert server.pid != pid and server.endpoint_url == endpoint
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert s3fs.S3FileSystem(**server.storage_options()).cat_file("private/kept.bin") == b"x" * 1000
    pid = server.pid
    server.stop()
    assert not os.path.exists(data_dir)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # nothing of the server's outlives it in /tmp: no logs (glog's default), no unix sockets
    assert not [n for n in set(os.listdir("/tmp")) - tmp_before if "weed" in n]


def test_a_server_dies_with_the_process_that_started_it_even_by_sigkill(tmp_path):
    """SIGKILL runs no handler: the kernel ends the server with its parent (PR_SET_PDEATHSIG), where
    a killed `iobench run` or `smoke` had left its server running for good."""
    import signal
    import subprocess
    import sys
    import time

    code = ("import sys, time\nfrom iobench.s3server import S3Server\ns = S3Server(bucket='orphan').start()\n"
            "print(s.pid, s.data_dir, flush=True)\ntime.sleep(600)\n")
    from pathlib import Path

    sockets_before = set(Path("/tmp").glob("seaweedfs-*.sock"))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    data_dir = None
    try:
        pid_text, data_dir = p.stdout.readline().split(maxsplit=1)
        pid = int(pid_text)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            if open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z"):
                break    # dead, waiting for its reaper
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError("the server outlived the process that started it")
    finally:
        if p.poll() is None:
            p.kill()
        if data_dir is not None:
            import shutil

            shutil.rmtree(data_dir.strip(), ignore_errors=True)   # no handler ran to remove it
        for sock in set(Path("/tmp").glob("seaweedfs-*.sock")) - sockets_before:
            sock.unlink(missing_ok=True)   # nor its unix sockets (S3Server.stop removes a stopped server's)
