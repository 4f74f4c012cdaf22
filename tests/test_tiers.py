"""Tiers on local directories: config, staging, eviction invariants, pins, checksums, simulation, lifecycle."""

from __future__ import annotations

import json
import os

import pytest
import xxhash
from test_tiers_util import local_tiers, make_dataset, tier_files

from iobench.cli import main
from iobench.errors import ConfigError, StorageError
from iobench.tiers.catalog import Catalog
from iobench.tiers.config import load_tiers, tiers_from_mapping, write_tiers_file
from iobench.tiers.manager import TierManager
from iobench.tiers.policies import get_policy
from iobench.tiers.simulate import compare, parse_capacities, simulate
from iobench.wrappers import BackendWrapper

KB = 1000


@pytest.fixture
def ds_dir(tmp_path):
    make_dataset(str(tmp_path / "src"), shards=10, shard_bytes=20 * KB)
    return tmp_path / "src"


def _mgr(tmp_path, **kw):
    return TierManager(local_tiers(tmp_path, **kw)).open()


# ---- configuration -----------------------------------------------------------------------

def test_tiers_file_roundtrip_and_validation(tmp_path):
    cfg = local_tiers(tmp_path, nvme_capacity="64KiB", pfs=True)
    path = write_tiers_file(cfg, str(tmp_path / "tiers.yaml"))
    back = load_tiers(path)
    assert back.names == ["nvme", "pfs"] and back.tier("nvme").capacity_bytes == 65536
    assert back.tier("pfs").capacity_bytes is None
    with pytest.raises(ConfigError, match="tiers.nvme.policy.*did you mean 'lru'"):
        tiers_from_mapping({"tiers": [{"name": "nvme", "url": str(tmp_path), "policy": "lur"}]})
    with pytest.raises(ConfigError, match="tiers.capcity|capacity"):
        tiers_from_mapping({"tiers": [{"name": "nvme", "url": str(tmp_path), "capcity": "1GB"}]})
    with pytest.raises(ConfigError, match="used twice"):
        tiers_from_mapping({"tiers": [{"name": "a", "url": "x"}, {"name": "a", "url": "y"}]})
    with pytest.raises(ConfigError, match="tiers.nvme.capacity"):
        tiers_from_mapping({"tiers": [{"name": "nvme", "url": "x", "capacity": "-5"}]})
    with pytest.raises(ConfigError, match="no tier named 'nvm'.*did you mean 'nvme'"):
        cfg.tier("nvm")


def test_capacity_below_one_shard_fails_fast(tmp_path, ds_dir, capsys):
    mgr = _mgr(tmp_path, nvme_capacity=10 * KB)
    ds = mgr.register(str(ds_dir))
    with pytest.raises(ConfigError, match=r"tiers.nvme.capacity: 10000 bytes is smaller than one shard \(20000"):
        mgr.prestage(ds, "nvme")
    assert tier_files(tmp_path / "nvme") == {}
    path = write_tiers_file(mgr.config, str(tmp_path / "t.yaml"))
    for mode in ("prestage", "ondemand"):
        assert main(["stage", str(ds_dir), "--tiers", path, "--mode", mode]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "smaller than one shard" in err[0]


# ---- staging -----------------------------------------------------------------------------

def test_prestage_copies_verified_and_is_idempotent(tmp_path, ds_dir):
    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB)
    ds = mgr.register(str(ds_dir))
    rep = mgr.prestage(ds, "nvme", concurrency=3)
    m = rep.metrics()
    assert m["staged_shards"] == 10 and m["bytes"] == 200 * KB and m["refetches"] == 0
    assert m["bytes_by_tier_pair"] == {"source->nvme": 200 * KB}
    for s in ds.manifest.shards:
        data = (tmp_path / "nvme" / ds.id / s.path).read_bytes()
        assert "xxh64:" + xxhash.xxh64(data).hexdigest() == s.checksum
    again = mgr.prestage(ds, "nvme").metrics()
    assert again["staged_shards"] == 0 and again["already_present_shards"] == 10


def test_prestage_failure_releases_reservations_not_started(tmp_path, ds_dir, monkeypatch):
    """The prestage thread reserves shards ahead of its copiers: when one copy fails, the shards
    reserved but not yet copied are released (no 'staging' row left behind for another process to
    wait on), finished copies are committed, and a second prestage completes the rest."""
    import iobench.tiers.manager as manager

    real = manager.copy_verified

    def flaky(src, rel, *a, **kw):
        if rel.endswith("shard-00002.bin"):
            raise StorageError("injected: the source went away")
        return real(src, rel, *a, **kw)

    monkeypatch.setattr(manager, "copy_verified", flaky)
    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB)
    ds = mgr.register(str(ds_dir))
    with pytest.raises(StorageError, match="injected"):
        mgr.prestage(ds, "nvme", concurrency=2)
    assert mgr.catalog.copies(dataset=ds.id, tier="nvme", state="staging") == []
    ready = {c["shard"] for c in mgr.catalog.copies(dataset=ds.id, tier="nvme")}
    assert "shard-00002.bin" not in ready
    assert set(tier_files(tmp_path / "nvme")) == {f"{ds.id}/{s}" for s in ready}   # no file without its row
    monkeypatch.undo()
    rep = mgr.prestage(ds, "nvme", concurrency=2)
    assert rep.staged == 10 - len(ready) and rep.present == len(ready)
    assert len(mgr.catalog.copies(dataset=ds.id, tier="nvme")) == 10


def test_ondemand_miss_then_hit_and_stream_copies_nothing(tmp_path, ds_dir):
    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB)
    ds = mgr.register(str(ds_dir))
    s = ds.manifest.shards[0]
    data, info = mgr.read(ds, s, "nvme", "stream")
    assert info.result == "stream" and tier_files(tmp_path / "nvme") == {}
    data, info = mgr.read(ds, s, "nvme", "ondemand")
    assert info.result == "miss" and info.source == "source"
    data2, info2 = mgr.read(ds, s, "nvme", "ondemand")
    assert info2.result == "hit" and data2 == data
    assert "xxh64:" + xxhash.xxh64(data2).hexdigest() == s.checksum


def test_a_copy_lost_behind_the_catalogs_back_is_fetched_again(tmp_path, ds_dir):
    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB)
    ds = mgr.register(str(ds_dir))
    s = ds.manifest.shards[0]
    mgr.read(ds, s, "nvme", "ondemand")
    (tmp_path / "nvme" / ds.id / s.path).unlink()
    data, info = mgr.read(ds, s, "nvme", "ondemand")
    assert info.result == "miss" and "xxh64:" + xxhash.xxh64(data).hexdigest() == s.checksum
    assert mgr.read(ds, s, "nvme", "ondemand")[1].result == "hit"


def test_promotion_and_demotion_between_cache_tiers(tmp_path, ds_dir):
    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB, pfs=True)
    ds = mgr.register(str(ds_dir))
    mgr.prestage(ds, "pfs")
    rep = mgr.prestage(ds, "nvme")
    assert dict(rep.bytes_by_pair) == {"pfs->nvme": 200 * KB}  # promoted from the faster copy, not the source
    s = ds.manifest.shards[0]
    assert mgr.catalog.drop_copy(ds.id, s.path, "nvme") == "dropped"
    mgr.backend("nvme").rm(mgr.copy_rel(ds, s.path))
    data, info = mgr.read(ds, s, "nvme", "ondemand")
    assert info.result == "miss" and info.source == "pfs"
    assert mgr.demote(ds, ds.manifest.shards[1], "nvme", "pfs") == "dropped"
    assert not (tmp_path / "nvme" / ds.id / ds.manifest.shards[1].path).exists()


# ---- eviction invariants -----------------------------------------------------------------

@pytest.mark.parametrize("policy", ["lru", "fifo"])
def test_capacity_never_exceeded_and_eviction_order(tmp_path, ds_dir, policy):
    mgr = _mgr(tmp_path, nvme_capacity=65 * KB, policy=policy)   # room for 3 shards of 20 kB
    ds = mgr.register(str(ds_dir))
    sh = ds.manifest.shards
    for s in sh[:3]:
        mgr.read(ds, s, "nvme", "ondemand")
    mgr.read(ds, sh[0], "nvme", "ondemand")          # touch shard 0: LRU keeps it, FIFO does not care
    _, info = mgr.read(ds, sh[3], "nvme", "ondemand")
    assert info.result == "miss" and info.evicted == 1
    present = {c["shard"] for c in mgr.catalog.copies(tier="nvme")}
    gone = sh[1].path if policy == "lru" else sh[0].path
    assert gone not in present and len(present) == 3
    for i in range(30):
        mgr.read(ds, sh[(i * 7) % 10], "nvme", "ondemand")
        assert sum(tier_files(tmp_path / "nvme").values()) <= 65 * KB
    u = mgr.catalog.usage("nvme")
    assert u["high_water_mark_bytes"] <= 65 * KB and u["used_bytes"] <= 65 * KB
    assert set(tier_files(tmp_path / "nvme")) == {f"{ds.id}/{c['shard']}" for c in mgr.catalog.copies(tier="nvme")}


def test_pinned_and_in_use_copies_are_never_evicted(tmp_path, ds_dir):
    mgr = _mgr(tmp_path, nvme_capacity=45 * KB)       # two shards
    ds = mgr.register(str(ds_dir))
    sh = ds.manifest.shards
    mgr.read(ds, sh[0], "nvme", "ondemand")
    mgr.read(ds, sh[1], "nvme", "ondemand")
    assert mgr.pin(ds, sh[0].path, "nvme")
    in_use = mgr.catalog.find_and_pin(ds.id, sh[1].path, ["nvme"])  # a reader holds shard 1
    assert in_use is not None
    _, info = mgr.read(ds, sh[2], "nvme", "ondemand")
    assert info.result == "bypass"                    # no room and nothing evictable: served, not cached
    assert mgr.stage_shard(ds, sh[3], "nvme") == "full"
    assert mgr.evict("nvme", ds) == {"pinned": 2}
    mgr.catalog.unpin(in_use[1])
    _, info = mgr.read(ds, sh[2], "nvme", "ondemand")
    assert info.result == "miss" and info.evicted == 1
    assert {c["shard"] for c in mgr.catalog.copies(tier="nvme")} == {sh[0].path, sh[2].path}
    assert mgr.unpin(ds, sh[0].path, "nvme") == 1


def test_pins_of_dead_processes_are_released(tmp_path, ds_dir):
    import multiprocessing as mp

    mgr = _mgr(tmp_path, nvme_capacity=25 * KB)       # one shard
    ds = mgr.register(str(ds_dir))
    sh = ds.manifest.shards
    mgr.read(ds, sh[0], "nvme", "ondemand")
    p = mp.get_context("fork").Process(target=_pin_and_die, args=(mgr.config.catalog, ds.id, sh[0].path))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert mgr.catalog.usage("nvme")["pinned_copies"] == 1
    _, info = mgr.read(ds, sh[1], "nvme", "ondemand")
    assert info.result == "miss" and info.evicted == 1


def _pin_and_die(catalog, dataset, shard):
    assert Catalog(catalog).find_and_pin(dataset, shard, ["nvme"]) is not None
    os._exit(0)


def test_last_copy_is_never_evicted(tmp_path):
    """A copy with no other copy anywhere (e.g. a checkpoint written straight to the tier) stays."""
    cat = Catalog(str(tmp_path / "c.sqlite"))
    cat.ensure_tier("nvme", 100)
    cat.add_ready_copy("ckpt", "step-1/rank0.bin", "nvme", 60, "xxh64:0")
    r = cat.reserve("ds", "s0", "nvme", 60, "xxh64:1", 100, get_policy("lru"))
    assert r.status == "full"
    assert cat.drop_copy("ckpt", "step-1/rank0.bin", "nvme") == "last-copy"
    cat.register_dataset("ds", "x", "object", [("s0", 60, "xxh64:1"), ("s1", 60, "xxh64:2")])
    assert cat.drop_copy("ds", "s0", "object") == "origin"


# ---- faults ------------------------------------------------------------------------------

class _CorruptOnce(BackendWrapper):
    """A real local backend whose first read of each file returns one flipped byte."""

    def __init__(self, inner, times=1):
        super().__init__(inner)
        self.left = {}
        self.times = times

    def _flip(self, rel, data):
        n = self.left.setdefault(rel, self.times)
        if n > 0 and data and rel.startswith("shard-"):
            self.left[rel] = n - 1
            return bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    def cat(self, rel, start=None, end=None):
        return self._flip(rel, self.inner.cat(rel, start, end))

    def open(self, rel, mode="rb", **kw):
        f = self.inner.open(rel, mode, **kw)
        outer = self

        class _F:
            def read(self, n=-1):
                return outer._flip(rel, f.read(n))

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

        return _F()


def test_checksum_mismatch_is_fetched_again(tmp_path, ds_dir):
    from iobench.storage import open_backend

    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB, retry_backoff=0)
    ds = mgr.register(str(ds_dir), backend=_CorruptOnce(open_backend(str(ds_dir))))
    rep = mgr.prestage(ds, "nvme", concurrency=1)
    assert rep.refetches == 10 and rep.staged == 10
    for s in ds.manifest.shards:
        data = (tmp_path / "nvme" / ds.id / s.path).read_bytes()
        assert "xxh64:" + xxhash.xxh64(data).hexdigest() == s.checksum
    _, info = mgr.read(ds, ds.manifest.shards[0], "nvme", "ondemand")
    assert info.result == "hit"


def test_persistent_corruption_fails_clearly_without_partial_copy(tmp_path, ds_dir):
    from iobench.storage import open_backend

    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB, retry_backoff=0, retries=2)
    ds = mgr.register(str(ds_dir), backend=_CorruptOnce(open_backend(str(ds_dir)), times=99))
    with pytest.raises(StorageError, match=r"shard-00000.bin.*failed its checksum after 2 attempts"):
        mgr.prestage(ds, "nvme", concurrency=1)
    assert tier_files(tmp_path / "nvme") == {}
    assert mgr.catalog.copies(tier="nvme", state=None) == []


def test_bit_rot_in_a_local_source_is_caught_by_the_direct_copy_path(tmp_path, ds_dir):
    shard = ds_dir / "shard-00004.bin"
    data = bytearray(shard.read_bytes())
    data[777] ^= 0x01
    shard.write_bytes(bytes(data))
    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB, retry_backoff=0, retries=2)
    ds = mgr.register(str(ds_dir))
    with pytest.raises(StorageError, match=r"shard-00004.bin.*failed its checksum after 2 attempts"):
        mgr.prestage(ds, "nvme", concurrency=1)
    assert f"{ds.id}/shard-00004.bin" not in tier_files(tmp_path / "nvme")
    assert not [f for f in tier_files(tmp_path / "nvme") if f.endswith(".tmp")]


def test_direct_copy_reads_each_byte_once_and_resumes_short_writes(tmp_path, ds_dir, monkeypatch):
    """Verified local copies hash the bytes as they pass: no read-back, and a short write(2) is resumed."""
    real_readv, real_write = os.readv, os.write
    read = []

    def readv(fd, bufs):
        n = real_readv(fd, bufs)
        read.append(n)
        return n

    def short_write(fd, data):
        return real_write(fd, data[:777])

    monkeypatch.setattr(os, "readv", readv)
    monkeypatch.setattr(os, "write", short_write)
    monkeypatch.setattr(os, "preadv", None)         # the old read-back of the copy must not be needed
    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB, retry_backoff=0)
    ds = mgr.register(str(ds_dir))
    rep = mgr.prestage(ds, "nvme", concurrency=2)
    monkeypatch.undo()
    assert rep.staged == 10 and rep.refetches == 0 and rep.retries == 0
    assert sum(read) == 10 * 20 * KB                 # one read of each source byte, nothing more
    for s in ds.manifest.shards:
        assert (tmp_path / "nvme" / ds.id / s.path).read_bytes() == (ds_dir / s.path).read_bytes()


def test_unverified_local_copies_go_through_the_kernel(tmp_path, ds_dir, monkeypatch):
    calls = []
    real = os.copy_file_range

    def cfr(*a):
        calls.append(a[2])
        return real(*a)

    monkeypatch.setattr(os, "copy_file_range", cfr)
    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB, verify=False)
    ds = mgr.register(str(ds_dir))
    rep = mgr.prestage(ds, "nvme", concurrency=2)
    monkeypatch.undo()
    assert rep.staged == 10 and calls
    for s in ds.manifest.shards:
        assert (tmp_path / "nvme" / ds.id / s.path).read_bytes() == (ds_dir / s.path).read_bytes()


def test_source_vanishing_mid_stage_retries_then_fails(tmp_path, ds_dir):
    import shutil

    mgr = _mgr(tmp_path, nvme_capacity=1_000 * KB, retry_backoff=0.01, retries=3)
    ds = mgr.register(str(ds_dir))
    seen = []

    def after(shard, status):
        seen.append(shard.path)
        if len(seen) == 3:
            shutil.rmtree(ds_dir)

    with pytest.raises(StorageError, match=r"shard-00003.bin.*failed after 3 attempts: FileNotFoundError"):
        mgr.prestage(ds, "nvme", concurrency=1, on_shard=after)
    files = tier_files(tmp_path / "nvme")
    assert sorted(files) == [f"{ds.id}/shard-0000{i}.bin" for i in range(3)]
    assert all(n == 20 * KB for n in files.values())
    assert [c["shard"] for c in mgr.catalog.copies(tier="nvme", state=None)] == [f"shard-0000{i}.bin" for i in range(3)]
    assert mgr.retries >= 2


# ---- simulation --------------------------------------------------------------------------

def _epochs(n, epochs, shuffle, seed=0):
    import numpy as np

    out = []
    for e in range(epochs):
        order = np.random.default_rng(seed + e).permutation(n) if shuffle else range(n)
        out += [(f"s{i}", 100) for i in order]
    return out


def test_simulation_sequential_epochs_defeat_lru_and_fifo():
    trace = _epochs(20, 4, shuffle=False)
    for policy in ("lru", "fifo"):
        assert simulate(trace, policy, 1000).hits == 0          # half the data: 0% (seed ch. 4)
    pin = simulate(trace, "pin-once-full", 1000)
    assert pin.hits == 3 * 10 and pin.hit_ratio == pytest.approx(30 / 80)
    assert simulate(trace, "lru", 2000).hit_ratio == pytest.approx(60 / 80)   # everything fits


def test_simulation_shuffled_epochs_pin_once_full_is_guaranteed():
    trace = _epochs(40, 5, shuffle=True, seed=7)
    for frac in (0.25, 0.5, 0.75):
        cap = int(4000 * frac)
        pin = simulate(trace, "pin-once-full", cap)
        assert pin.hits == 4 * int(40 * frac)              # exactly capacity/dataset after epoch 1
        lru = simulate(trace, "lru", cap)
        assert lru.hit_ratio < pin.hit_ratio
        assert simulate(trace, "belady", cap).hit_ratio >= pin.hit_ratio
    assert simulate(trace, "lru", 5).hits == 0               # no shard fits: nothing is admitted
    assert parse_capacities(["25%", "1KB"], 4000) == [1000, 1000]
    with pytest.raises(ConfigError):
        compare(trace, ["lfu"], [1000])


def test_stage_cli_trace_and_simulate(tmp_path, ds_dir, capsys):
    cfg = local_tiers(tmp_path, nvme_capacity=45 * KB)
    tf = write_tiers_file(cfg, str(tmp_path / "tiers.yaml"))
    out, trace, sim = tmp_path / "r.json", tmp_path / "t.jsonl", tmp_path / "s.json"
    assert main(["stage", str(ds_dir), "--tiers", tf, "--mode", "ondemand", "--epochs", "2", "--readers", "2",
                 "--trace", str(trace), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["command"] == "stage" and len(r["metrics"]["epochs"]) == 2
    assert r["metrics"]["tiers"]["nvme"]["high_water_mark_bytes"] <= 45 * KB
    assert r["metrics"]["reads"]["reads"] == 20
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["capacity_bytes"] == 45 * KB
    assert {x["result"] for x in lines[1:]} <= {"hit", "miss", "bypass"}
    assert main(["tiers", "simulate", str(trace), "--capacities", "50%,100%", "--json", str(sim)]) == 0
    s = json.loads(sim.read_text())
    rows = {(x["policy"], x["capacity_bytes"]): x for x in s["metrics"]["simulation"]}
    assert rows[("pin-once-full", 100 * KB)]["hit_ratio"] == pytest.approx(0.25)   # half the data, 2 epochs
    assert rows[("lru", 200 * KB)]["hit_ratio"] == pytest.approx(0.5)
    assert main(["tiers", "show", "--tiers", tf]) == 0
    assert "nvme" in capsys.readouterr().out
    assert main(["tiers", "simulate", str(tmp_path / "nope.jsonl")]) == 2


# ---- lifecycle ---------------------------------------------------------------------------

def test_lifecycle_plan_matches_seed_retention_example():
    from iobench.tiers.lifecycle import plan_lifecycle

    # Seed G30: 30 days at one checkpoint per 10 min = 4,320; keep 3 on PFS, every 100th archived.
    plan = plan_lifecycle([f"step-{i}" for i in range(1, 4321)], keep_last=3, every_nth=100)
    assert len(plan.keep) == 3 and plan.keep[-1] == "step-4320"
    assert len(plan.archive) == 43 and plan.archive[0] == "step-100"
    assert len(plan.keep) * 1.75 == pytest.approx(5.25)              # PFS footprint, TB
    assert len(plan.archive) * 1.75 + 9 == pytest.approx(84.25)       # archive total, TB
    assert len(plan.expire) == 4320 - 3 - 43
    with pytest.raises(ConfigError):
        plan_lifecycle(["a"], keep_last=0)


def test_lifecycle_apply_archives_then_drops(tmp_path):
    from iobench.tiers.config import TiersConfig, TierSpec
    from iobench.tiers.lifecycle import apply_lifecycle, plan_lifecycle

    cfg = TiersConfig(tiers=(TierSpec(name="pfs", url=str(tmp_path / "pfs")),
                             TierSpec(name="object", url=str(tmp_path / "obj"))), catalog=str(tmp_path / "c.sqlite"))
    mgr = TierManager(cfg).open()
    for i in range(1, 7):
        d = tmp_path / "pfs" / "ckpt" / f"step-{i}"
        d.mkdir(parents=True)
        (d / "rank0.bin").write_bytes(os.urandom(1000))
        (d / "manifest.json").write_text('{"format": "iobench-checkpoint"}')
    plan = plan_lifecycle([f"step-{i}" for i in range(1, 7)], keep_last=2, every_nth=2)
    assert plan.archive == ("step-2", "step-4", "step-6") and plan.expire == ("step-1", "step-3")
    rep = apply_lifecycle(mgr, plan, "pfs", "object", prefix="ckpt")
    assert not rep.errors and rep.bytes_archived == 3 * (1000 + len('{"format": "iobench-checkpoint"}'))
    assert sorted(os.listdir(tmp_path / "pfs" / "ckpt")) == ["step-5", "step-6"]
    assert sorted(os.listdir(tmp_path / "obj" / "ckpt")) == ["step-2", "step-4", "step-6"]
    assert (tmp_path / "obj/ckpt/step-4/rank0.bin").stat().st_size == 1000


def test_each_rank_prestages_its_own_assignment(tmp_path, ds_dir):
    from iobench.tiers.run import run_stage

    cfg = local_tiers(tmp_path, nvme_capacity=100 * KB)     # half the dataset: enough for one rank's share
    r = run_stage(cfg, str(ds_dir), mode="prestage", rank=1, world=2, epochs=1)
    assert r["rank_shards"] == 5 and r["staging"]["staged_shards"] == 5 and r["epochs"][0]["hit_ratio"] == 1.0
    assert sorted(f.rsplit("/", 1)[1] for f in tier_files(tmp_path / "nvme")) == [
        f"shard-{i:05d}.bin" for i in (1, 3, 5, 7, 9)]


def test_processes_opening_a_new_catalog_together_all_get_in(tmp_path):
    """Ranks of one job open a fresh catalog at the same moment: switching it to WAL must wait
    for the others (SQLite says "database is locked" at once there, without the busy handler)."""
    import subprocess
    import sys
    import time

    code = ("import sys, time\nfrom iobench.tiers.catalog import Catalog\n"
            "while time.time() < float(sys.argv[2]): pass\n"
            "Catalog(sys.argv[1]).ensure_tier('nvme', None)\n")
    for rnd in range(4):
        start = time.time() + 1.0
        procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"c{rnd}.sqlite"), str(start)],
                                  stderr=subprocess.PIPE, text=True) for _ in range(6)]
        errs = [p.communicate(timeout=60)[1] for p in procs]
        assert all(p.returncode == 0 for p in procs), [e for e in errs if e][:1]
