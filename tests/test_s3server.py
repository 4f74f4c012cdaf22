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
