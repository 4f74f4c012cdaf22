"""Tiers with the object tier on the embedded S3 server: staging, faults mid-stage, the suite stage."""

from __future__ import annotations

import json
import socket
import threading

import pytest
import xxhash
from test_tiers_util import make_dataset, tier_files

from iobench.errors import StorageError
from iobench.tiers.config import TiersConfig, TierSpec
from iobench.tiers.manager import TierManager

pytestmark = pytest.mark.s3
KB = 1000


def _s3_opts(server, **extra):
    return {"key": server.access_key, "secret": server.secret_key, **extra}


def _cfg(tmp_path, s3_prefix, endpoint, opts, **kw):
    return TiersConfig(tiers=(TierSpec(name="nvme", url=str(tmp_path / "nvme"), capacity=kw.pop("capacity", None)),
                              TierSpec(name="pfs", url=str(tmp_path / "pfs"), emulation="pfs"),
                              TierSpec(name="object", url=s3_prefix, endpoint_url=endpoint, storage_options=opts)),
                       catalog=str(tmp_path / "catalog.sqlite"), **kw)


def test_prestage_and_ondemand_from_object_tier(tmp_path, s3_server, s3_prefix):
    url = f"{s3_prefix}/ds"
    m = make_dataset(url, shards=6, shard_bytes=30 * KB, endpoint_url=s3_server.endpoint_url,
                     storage_options=_s3_opts(s3_server))
    cfg = _cfg(tmp_path, s3_prefix, s3_server.endpoint_url, _s3_opts(s3_server), capacity=100 * KB)
    mgr = TierManager(cfg).open()
    ds = mgr.register(url)
    assert ds.origin_tier == "object"
    rep = mgr.prestage(ds, "pfs", concurrency=3)          # the pfs tier is emulated (seed table 4.2)
    assert rep.staged == 6 and dict(rep.bytes_by_pair) == {"object->pfs": 180 * KB}
    s = m.shards[0]
    data, info = mgr.read(ds, s, "nvme", "ondemand")
    assert info.result == "miss" and info.source == "pfs"
    assert "xxh64:" + xxhash.xxh64(data).hexdigest() == s.checksum
    assert mgr.evict("pfs", ds) == {"dropped": 6}         # the object tier still holds the origin
    for sh in m.shards:
        _, info = mgr.read(ds, sh, "nvme", "ondemand")
        assert sum(tier_files(tmp_path / "nvme").values()) <= 100 * KB
    assert mgr.counters()["bytes_by_tier_pair"]["object->nvme"] == 150 * KB


class _Proxy:
    """A TCP relay on 127.0.0.1 in front of the S3 server; ``cut()`` unplugs it (connection refused)."""

    def __init__(self, port: int):
        self.target = port
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.socks += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self):
        try:
            self.lsock.shutdown(socket.SHUT_RDWR)   # wakes the accept() thread and stops listening
        except OSError:
            pass
        self.lsock.close()
        with self.lock:
            for s in self.socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass


def test_source_unreachable_mid_stage_retries_then_clear_error(tmp_path, s3_server, s3_prefix):
    url = f"{s3_prefix}/ds"
    make_dataset(url, shards=5, shard_bytes=20 * KB, endpoint_url=s3_server.endpoint_url,
                 storage_options=_s3_opts(s3_server))
    proxy = _Proxy(int(s3_server.endpoint_url.rsplit(":", 1)[1]))
    endpoint = f"http://127.0.0.1:{proxy.port}"
    opts = _s3_opts(s3_server, config_kwargs={"connect_timeout": 1, "read_timeout": 5,
                                              "retries": {"max_attempts": 1}})
    cfg = _cfg(tmp_path, s3_prefix, endpoint, opts, retries=2, retry_backoff=0.05)
    mgr = TierManager(cfg).open()
    ds = mgr.register(url)
    done = []

    def after(shard, status):
        done.append(shard.path)
        if len(done) == 2:
            proxy.cut()

    try:
        with pytest.raises(StorageError) as ei:
            mgr.prestage(ds, "nvme", concurrency=1, on_shard=after)
    finally:
        proxy.cut()
    msg = str(ei.value)
    assert "shard-00002.bin" in msg and "failed after 2 attempts" in msg and s3_prefix[5:] in msg
    assert sorted(tier_files(tmp_path / "nvme")) == [f"{ds.id}/{p}" for p in done]   # nothing partial
    assert mgr.catalog.copies(tier="nvme", state="staging") == []


def test_suite_stage_on_the_embedded_object_tier(tmp_path, s3_server, s3_prefix):
    from iobench.suite import SuiteContext
    from iobench.suite.stage import suite_stage
    from iobench.suite.state import GeneratedDataset

    url = f"{s3_prefix}/datasets/raw-tokens"
    make_dataset(url, shards=6, shard_bytes=40 * KB, endpoint_url=s3_server.endpoint_url,
                 storage_options=_s3_opts(s3_server))
    ctx = SuiteContext(out_dir=tmp_path / "out", work_dir=tmp_path / "work", s3_url=s3_prefix,
                       s3_storage_options=_s3_opts(s3_server), endpoint_url=s3_server.endpoint_url)
    ctx.out_dir.mkdir()
    ctx.work_dir.mkdir()
    ctx.state.datasets = [GeneratedDataset(name="raw-tokens", format="raw", modality="tokens", url=url,
                                           location="s3", storage_options=_s3_opts(s3_server),
                                           endpoint_url=s3_server.endpoint_url)]
    out = suite_stage(ctx)
    assert out["dataset_bytes"] == 240 * KB
    assert out["bytes_by_tier_pair"].get("object->pfs", 0) > 0
    assert out["simulated_hit_ratio_half"]["pin-once-full"] == pytest.approx(0.25)
    assert ctx.state.tiers_file and (tmp_path / "work" / "tiers.yaml").stat().st_mode & 0o077 == 0
    r = json.loads((ctx.out_dir / "stage.json").read_text())
    assert r["metrics"]["prestage"]["staging"]["bytes_by_tier_pair"] == {"object->nvme": 240 * KB}
    assert s3_server.secret_key not in (ctx.out_dir / "stage.json").read_text()
    assert [row[0] for row in ctx.rows] == ["stage"] * 4
