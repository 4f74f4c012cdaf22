"""Several processes staging and reading through one catalog at once (the loader's worker setup)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import threading

import xxhash
from test_tiers_util import local_tiers, make_dataset, tier_files

from iobench.storage import open_backend
from iobench.tiers import loader_source
from iobench.tiers.config import write_tiers_file
from iobench.tiers.manager import TierManager
from iobench.tiers.simulate import read_trace

KB = 1000
SHARDS, SHARD_BYTES, CAPACITY = 16, 50 * KB, 180 * KB   # the hot tier holds 3 of 16 shards


def _reader(source, seed, n, q):
    import numpy as np

    try:
        source.open()
        rng = np.random.default_rng(seed)
        shards = source.manifest.shards
        bad = 0
        for i in rng.integers(0, len(shards), n):
            data = source.read_shard(shards[i])
            bad += "xxh64:" + xxhash.xxh64(bytes(data)).hexdigest() != shards[i].checksum
        source.close()
        q.put(("ok", bad))
    except BaseException as e:  # report to the parent instead of dying silently
        q.put(("error", repr(e)))


def _dir_bytes(path) -> int:
    """Bytes of the files in one directory listing (one getdents: a consistent snapshot of names)."""
    total = 0
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return 0
    for name in names:
        try:
            total += os.stat(os.path.join(path, name)).st_size
        except FileNotFoundError:
            pass
    return total


def test_concurrent_readers_never_exceed_capacity_nor_see_partial_copies(tmp_path):
    m = make_dataset(str(tmp_path / "src"), shards=SHARDS, shard_bytes=SHARD_BYTES)
    cfg = local_tiers(tmp_path, nvme_capacity=CAPACITY)
    tf = write_tiers_file(cfg, str(tmp_path / "tiers.yaml"))
    src = loader_source(tf, "ondemand", m, open_backend(str(tmp_path / "src")))
    ds_dir = tmp_path / "nvme" / src.dataset.id
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _dir_bytes(ds_dir))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(src, seed, 40, q)) for seed in range(3)]
    for p in procs:
        p.start()
    outcomes = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    stop.set()
    t.join()
    assert outcomes == [("ok", 0)] * 3                       # every byte a reader got matched the manifest
    assert 0 < peak[0] <= CAPACITY                          # high-water mark on disk, temp files included
    mgr = TierManager(cfg).open()
    u = mgr.catalog.usage("nvme")
    assert u["high_water_mark_bytes"] <= CAPACITY and u["pinned_copies"] == 0
    assert mgr.catalog.copies(tier="nvme", state="staging") == []
    ready = {f"{c['dataset']}/{c['shard']}" for c in mgr.catalog.copies(tier="nvme")}
    assert set(tier_files(tmp_path / "nvme")) == ready      # no orphans, no leftover temp files
    for rel in ready:
        shard = rel.split("/", 1)[1]
        want = next(s.checksum for s in m.shards if s.path == shard)
        assert "xxh64:" + xxhash.xxh64((tmp_path / "nvme" / rel).read_bytes()).hexdigest() == want
    _, reads = read_trace(src.trace_path)
    assert len(reads) == 120 and len({r["pid"] for r in reads}) == 3
    met = src.metrics()
    clone = pickle.loads(pickle.dumps(src))                 # what a spawned loader worker receives
    clone.open()
    assert bytes(clone.read_shard(m.shards[0])) == (tmp_path / "src" / m.shards[0].path).read_bytes()
    st = clone.stats()
    assert st["bytes_read"] == SHARD_BYTES and st["calls"]["read"] == 1 and "read" in st["hist"]
    clone.close()
    assert met["reads"] == 120 and met["hits"] + met["misses"] + met["bypassed"] == 120
    assert met["tiers"]["nvme"]["high_water_mark_bytes"] <= CAPACITY


def _prestager(tiers_file, url, q):
    from iobench.tiers.config import load_tiers

    try:
        mgr = TierManager(load_tiers(tiers_file)).open()
        rep = mgr.prestage(mgr.register(url), "nvme", concurrency=2)
        q.put(("ok", rep.staged, rep.present))
    except BaseException as e:
        q.put(("error", repr(e), 0))


def test_concurrent_prestage_copies_each_shard_once(tmp_path):
    make_dataset(str(tmp_path / "src"), shards=SHARDS, shard_bytes=SHARD_BYTES)
    tf = write_tiers_file(local_tiers(tmp_path, nvme_capacity=SHARDS * SHARD_BYTES), str(tmp_path / "t.yaml"))
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_prestager, args=(tf, str(tmp_path / "src"), q)) for _ in range(3)]
    for p in procs:
        p.start()
    outcomes = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(o[0] == "ok" for o in outcomes), outcomes
    assert sum(o[1] for o in outcomes) == SHARDS                  # each shard copied by exactly one process
    assert all(o[1] + o[2] == SHARDS for o in outcomes)           # and every process saw all of them ready
    assert len(tier_files(tmp_path / "nvme")) == SHARDS


def _slow_stager(tiers_file, url):
    from iobench.storage import open_backend as ob
    from iobench.tiers.config import load_tiers
    from iobench.wrappers import EmulatedBackend

    mgr = TierManager(load_tiers(tiers_file)).open()
    slow = EmulatedBackend(ob(url), "bw:20KB")       # 50 kB shards take 2.5 s each: killed mid-copy
    ds = mgr.register(url, backend=slow)
    mgr.prestage(ds, "nvme", ds.manifest.shards[:2], concurrency=2)


def test_a_stager_killed_mid_copy_leaves_nothing_visible_and_is_recovered(tmp_path):
    import signal
    import time

    m = make_dataset(str(tmp_path / "src"), shards=4, shard_bytes=SHARD_BYTES)
    cfg = local_tiers(tmp_path, nvme_capacity=2 * SHARD_BYTES + KB)
    tf = write_tiers_file(cfg, str(tmp_path / "t.yaml"))
    p = mp.get_context("fork").Process(target=_slow_stager, args=(tf, str(tmp_path / "src")))
    p.start()
    mgr = TierManager(cfg).open()
    deadline = time.monotonic() + 30
    while len(mgr.catalog.copies(tier="nvme", state="staging")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    files = tier_files(tmp_path / "nvme")
    assert files and all(os.path.basename(f).startswith(".") for f in files)   # only temp names: nothing visible
    ds = mgr.register(str(tmp_path / "src"))
    assert mgr.catalog.find_and_pin(ds.id, m.shards[0].path, ["nvme"]) is None
    assert mgr.reconcile("nvme")["removed_files"] == len(files)
    assert mgr.catalog.copies(tier="nvme", state="staging") == []          # the dead stager's reservations
    rep = mgr.prestage(ds, "nvme", m.shards[:2])
    assert rep.staged == 2 and mgr.catalog.usage("nvme")["high_water_mark_bytes"] <= 2 * SHARD_BYTES + KB
