"""The checkpoint engine on real files, real fsync and the embedded S3 server."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from iobench.checkpointing import commit_point as cp
from iobench.checkpointing import hooks
from iobench.checkpointing.commit import Checkpointer, EngineConfig
from iobench.checkpointing.restore import restore
from iobench.checkpointing.retention import RetentionPolicy, plan_deletions
from iobench.checkpointing.snapshot import LiveState, local_ranks
from iobench.checkpointing.state import StateSpec, TensorSpec, checkpoint_bytes, from_params, rank_shards
from iobench.errors import ConfigError, NoCheckpointError, StorageError
from iobench.storage import open_backend

SEED = 7


def small_spec(params=20_000, **kw):
    kw.setdefault("tp", 1)
    kw.setdefault("dp", 2)
    kw.setdefault("zero_stage", 1)
    return from_params(params, **kw)


def tiers(tmp_path):
    return open_backend(str(tmp_path / "local")), open_backend(str(tmp_path / "durable"))


def same(live: LiveState, restored) -> bool:
    return all(np.array_equal(a.view(np.uint8), b.view(np.uint8))
               for r in live.ranks for a, b in zip(live.arrays[r], restored.arrays[r]))


def run_saves(ck, live, steps):
    for s in steps:
        live.fill(SEED, s)
        ck.save(s, live)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_save_restore_bit_exact_and_retention(tmp_path, mode):
    spec = small_spec()
    live = LiveState(spec, local_ranks(spec))
    local, durable = tiers(tmp_path)
    with Checkpointer(spec, live.ranks, local, durable, EngineConfig(mode=mode, keep_local=1, keep_durable=2)) as ck:
        run_saves(ck, live, [10, 20, 30])
    assert [r.status for r in ck.records] == ["committed"] * 3
    assert cp.committed_steps(durable) == [20, 30] and cp.committed_steps(local) == [30]
    for r in ck.records:
        assert r.commit_latency_s > 0 and r.blocking_s > 0 and r.local_bytes == checkpoint_bytes(spec)
        if mode == "async":
            assert r.commit_latency_s >= r.blocking_s
        else:   # sync: training waits for the commit (and retention)
            assert r.blocking_s >= r.commit_latency_s
    got = restore([("local", local), ("durable", durable)])
    assert (got.step, got.tier) == (30, "local") and same(live, got)
    got = restore([("durable", durable)])
    assert got.step == 30 and same(live, got)


def test_snapshot_isolation(tmp_path):
    spec = small_spec(200_000)
    live = LiveState(spec, local_ranks(spec))
    local, durable = tiers(tmp_path)
    # A slow local write keeps the save in flight while training goes on changing the state.
    cfg = EngineConfig(local_bw=2e6)
    with Checkpointer(spec, live.ranks, local, durable, cfg) as ck:
        live.fill(SEED, 1)
        ck.save(1, live)
        live.fill(SEED, 2)          # the next training steps overwrite every tensor
        assert ck.inflight_steps == {1}
    got = restore([("durable", durable)])
    live.fill(SEED, 1)
    assert got.step == 1 and same(live, got)


def test_background_error_is_the_original_and_blocks_the_commit(tmp_path):
    spec = small_spec()
    live = LiveState(spec, local_ranks(spec))
    local, durable = tiers(tmp_path)
    class Boom(RuntimeError):
        pass

    boom = Boom("injected failure before the durable manifest")
    calls = {"n": 0}

    def hook(name):
        if name == "before_manifest":
            calls["n"] += 1
            if calls["n"] == 4:    # step 2's durable manifest (each step publishes local, then durable)
                raise boom

    hooks.set_hook(hook)
    try:
        ck = Checkpointer(spec, live.ranks, local, durable, EngineConfig(keep_durable=5))
        run_saves(ck, live, [1])
        ck.wait()
        run_saves(ck, live, [2])
        with pytest.raises(Boom) as e:
            ck.wait()
        assert e.value is boom
        ck.wait()   # reported once, then the engine goes on
        run_saves(ck, live, [3])
        ck.close()
    finally:
        hooks.set_hook(None)
    assert [r.status for r in ck.records] == ["committed", "failed", "committed"]
    assert cp.committed_steps(durable) == [1, 3]
    assert not durable.exists(cp.step_dir(2))


@pytest.mark.parametrize("policy", ["block", "skip", "coalesce"])
def test_backlog_policies(tmp_path, policy):
    spec = small_spec(50_000)       # 700 kB per save, uploads capped at 3.5 MB/s: 0.2 s each
    live = LiveState(spec, local_ranks(spec))
    local, durable = tiers(tmp_path)
    cfg = EngineConfig(policy=policy, queue_depth=1, durable_bw=3.5e6, fsync=False, keep_durable=10, keep_local=10)
    with Checkpointer(spec, live.ranks, local, durable, cfg) as ck:
        for s in range(1, 7):
            live.fill(SEED, s)
            ck.save(s, live)
    st = [r.status for r in ck.records]
    assert st[-1] in ("committed", "skipped")
    assert max(r.backlog for r in ck.records) >= 1
    if policy == "block":
        assert st == ["committed"] * 6
        assert max(r.wait_s for r in ck.records) > 0.05
    elif policy == "skip":
        assert "skipped" in st and "coalesced" not in st
    else:
        assert "coalesced" in st and "skipped" not in st and st[-1] == "committed"
    newest = max(r.step for r in ck.records if r.status == "committed")
    got = restore([("durable", durable)])
    live.fill(SEED, newest)
    assert got.step == newest and same(live, got)


def test_fsyncs_are_issued_in_order(tmp_path, monkeypatch):
    spec = small_spec()
    live = LiveState(spec, local_ranks(spec))
    local, durable = tiers(tmp_path)
    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    with Checkpointer(spec, live.ranks, local, durable, EngineConfig(mode="sync")) as ck:
        run_saves(ck, live, [5])
    for tier in (local, durable):
        d = tier.local_path(cp.step_dir(5))
        files = [i for i, p in enumerate(synced) if os.path.dirname(p) == d and "rank-" in os.path.basename(p)]
        manifest = [i for i, p in enumerate(synced) if os.path.dirname(p) == d and f".{cp.MANIFEST}." in p]
        dirs = [i for i, p in enumerate(synced) if p == d]
        root = [i for i, p in enumerate(synced) if p == tier.local_path("")]
        assert len(files) == spec.ranks, synced
        assert len(manifest) == 1 and max(files) < manifest[0]
        assert dirs and max(dirs) > manifest[0] and root and max(root) > manifest[0]


def test_corruption_and_truncation_are_skipped_with_reasons(tmp_path):
    spec = small_spec()
    live = LiveState(spec, local_ranks(spec))
    local, durable = tiers(tmp_path)
    with Checkpointer(spec, live.ranks, local, durable, EngineConfig(mode="sync", keep_local=3)) as ck:
        run_saves(ck, live, [1, 2, 3])
    # step 3: a flipped byte on both tiers; step 2: truncated on both
    for tier in (local, durable):
        p = tier.local_path(f"{cp.step_dir(3)}/{cp.rank_file(1)}")
        with open(p, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x01]))
        os.truncate(tier.local_path(f"{cp.step_dir(2)}/{cp.rank_file(0)}"), 1000)
    got = restore([("local", local), ("durable", durable)])
    live.fill(SEED, 1)
    assert got.step == 1 and same(live, got)
    text = " ".join(got.skipped)
    assert "checksum" in text and "truncated" in text


def test_partial_save_without_manifest_is_never_restored(tmp_path):
    spec = small_spec()
    live = LiveState(spec, local_ranks(spec))
    local, durable = tiers(tmp_path)
    with Checkpointer(spec, live.ranks, None, durable, EngineConfig(mode="sync")) as ck:
        run_saves(ck, live, [1, 2])
    durable.rm(f"{cp.step_dir(2)}/{cp.MANIFEST}")
    got = restore([("durable", durable)])
    assert got.step == 1
    assert any("no manifest" in s for s in got.skipped)


def test_no_committed_checkpoint(tmp_path):
    with pytest.raises(NoCheckpointError, match="no committed checkpoint"):
        restore([("durable", open_backend(str(tmp_path / "empty")))])


def test_reshard_bit_exact(tmp_path):
    t = (TensorSpec("a", (96, 64), 0, 1), TensorSpec("b", (64, 96), 1, 1), TensorSpec("n", (64,), None, 2))
    old = StateSpec(tensors=t, recipe="bf16-mixed-adam", tp=2, pp=1, dp=2, zero_stage=1, layers=1)
    live = LiveState(old, local_ranks(old))
    live.fill(SEED, 1)
    durable = open_backend(str(tmp_path / "d"))
    with Checkpointer(old, live.ranks, None, durable, EngineConfig(mode="sync")) as ck:
        ck.save(1, live)
    # the global tensors, assembled from what the old ranks hold
    glob = {}
    for r in live.ranks:
        for s, a in zip(live.shards[r], live.arrays[r]):
            g = glob.setdefault(s.key, np.zeros(s.global_shape, dtype=a.dtype))
            g[tuple(slice(o, o + n) for o, n in zip(s.offsets, s.shape))] = a
    for new in (old.with_parallelism(tp=4, dp=1), old.with_parallelism(tp=1, dp=3, zero_stage=3),
                old.with_parallelism(tp=8, dp=1, zero_stage=0)):
        got = restore([("durable", durable)], target=new)
        assert sorted(got.arrays) == list(range(new.ranks))
        for r, shards in enumerate(rank_shards(new)):
            for s, a in zip(shards, got.arrays[r]):
                box = tuple(slice(o, o + n) for o, n in zip(s.offsets, s.shape))
                assert np.array_equal(a.view(np.uint8), glob[s.key][box].view(np.uint8))


def test_retention_plan_protects_newest_and_inflight():
    pol = RetentionPolicy(keep_last=1)
    assert plan_deletions([1, 2, 3], [1, 2, 3, 4], {4}, pol) == [1, 2]
    assert plan_deletions([1, 2, 3], [1, 2, 3], {1}, pol) == [2]
    assert plan_deletions([], [1, 2], set(), pol) == []                      # nothing committed: delete nothing
    assert plan_deletions([5], [2, 5, 7], set(), pol) == [2]                 # older orphan only
    assert plan_deletions([10, 20, 30, 40], [10, 20, 30, 40], set(), RetentionPolicy(1, 20)) == [10, 30]
    with pytest.raises(ConfigError):
        RetentionPolicy(keep_last=0)


def test_s3_async_commit_conditional_manifest(tmp_path, s3_server, s3_prefix):
    spec = small_spec()
    live = LiveState(spec, local_ranks(spec))
    local = open_backend(str(tmp_path / "local"))
    opts = {"key": s3_server.access_key, "secret": s3_server.secret_key}
    durable = open_backend(s3_prefix, endpoint_url=s3_server.endpoint_url, storage_options=opts)
    with Checkpointer(spec, live.ranks, local, durable, EngineConfig(keep_durable=1)) as ck:
        run_saves(ck, live, [1, 2])
    assert [r.status for r in ck.records] == ["committed", "committed"]
    assert cp.committed_steps(durable) == [2]
    got = restore([("durable", durable)])
    assert got.step == 2 and same(live, got)
    m = cp.load_manifest(durable, 2)
    with pytest.raises(StorageError, match="already committed"):
        cp.publish(durable, m)


def test_disk_full_fails_cleanly_and_keeps_previous(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip() or 'not permitted'})")
    try:
        spec = small_spec(180_000)      # 2.5 MB per checkpoint: the second one does not fit beside the first
        live = LiveState(spec, local_ranks(spec))
        local = open_backend(str(mnt / "ckpt"))
        ck = Checkpointer(spec, live.ranks, local, None, EngineConfig(keep_local=1))
        run_saves(ck, live, [1])
        ck.wait()
        run_saves(ck, live, [2])
        with pytest.raises(StorageError, match="disk full"):
            ck.wait()
        ck.close()
        assert cp.committed_steps(local) == [1]
        assert not [n for n in os.listdir(local.local_path(cp.step_dir(1))) if n.endswith(".tmp")]
        assert not local.exists(cp.step_dir(2))
        got = restore([("local", local)])
        live.fill(SEED, 1)
        assert got.step == 1 and same(live, got)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_exposure_scaled_seed_example(tmp_path):
    """Seed G73 at 1/10 time scale: 112 GB at 7 vs 20 GB/s → 11.2 MB at 7 vs 20 MB/s, snapshots at 2 s
    and 4 s (20, 40), failure at 5 s (50): the recovery point is step 1 vs step 2, redo 3 s vs 1 s."""
    from iobench.checkpointing.runner import seed_exposure_scenario

    r = seed_exposure_scenario(str(tmp_path), time_scale=0.1)
    assert r["bytes"] == 11_200_000
    slow, fast = r["runs"]["7"], r["runs"]["20"]
    for run in (slow, fast):
        for lat in run["commit_latency_s"]:
            assert lat >= r["bytes"] / run["bandwidth_bytes_per_s"] * 0.98     # the cap is honoured
    assert (slow["recovered_step"], round(slow["redo_s_unscaled"])) == (1, 30)
    assert (fast["recovered_step"], round(fast["redo_s_unscaled"])) == (2, 10)


def test_restore_through_a_pluggable_reader(tmp_path):
    from iobench.checkpointing.restore import reader_read_fn
    from iobench.gds import make_reader

    spec = small_spec()
    live = LiveState(spec, local_ranks(spec))
    durable = open_backend(str(tmp_path / "d"))
    with Checkpointer(spec, live.ranks, None, durable, EngineConfig(mode="sync")) as ck:
        run_saves(ck, live, [1])
    opened = []

    def factory(path):
        opened.append(path)
        return make_reader("cpu", path)

    got = restore([("durable", durable)], read_fn=reader_read_fn(factory))
    assert got.step == 1 and same(live, got) and len(opened) == spec.ranks


def test_staging_buffers_are_reused_and_memory_stays_flat(tmp_path):
    import psutil

    spec = from_params(600_000)       # 8.4 MB, one rank
    live = LiveState(spec, [0])
    local, durable = tiers(tmp_path)
    proc = psutil.Process()
    with Checkpointer(spec, [0], local, durable, EngineConfig(keep_local=1, keep_durable=1, fsync=False)) as ck:
        addr = ck.staging.buffers[0].ctypes.data
        rss = []
        for s in range(1, 9):
            live.touch(s)
            ck.save(s, live)
            ck.wait()
            rss.append(proc.memory_info().rss)
        assert ck.staging.buffers[0].ctypes.data == addr
        assert ck.staging.nbytes == live.nbytes
    assert rss[-1] - rss[0] < 4 * 1024 * 1024   # no per-save growth (a leak would add 8.4 MB per save)


def test_manifest_missing_a_rank_is_not_a_checkpoint(tmp_path):
    import json as _json

    spec = small_spec()
    live = LiveState(spec, local_ranks(spec))
    durable = open_backend(str(tmp_path / "d"))
    with Checkpointer(spec, live.ranks, None, durable, EngineConfig(mode="sync")) as ck:
        run_saves(ck, live, [1, 2])
    p = durable.local_path(f"{cp.step_dir(2)}/{cp.MANIFEST}")
    d = _json.loads(open(p).read())
    d["files"] = d["files"][:1]
    open(p, "w").write(_json.dumps(d))
    got = restore([("durable", durable)])
    assert got.step == 1 and any("lacks ranks" in s for s in got.skipped)


def test_a_committed_step_is_never_overwritten(tmp_path):
    spec = small_spec()
    live = LiveState(spec, local_ranks(spec))
    local, durable = tiers(tmp_path)
    with Checkpointer(spec, live.ranks, local, durable, EngineConfig(mode="sync")) as ck:
        run_saves(ck, live, [1])
    before = open(local.local_path(f"{cp.step_dir(1)}/{cp.rank_file(0)}"), "rb").read()
    ck2 = Checkpointer(spec, live.ranks, local, durable, EngineConfig(mode="sync"))
    live.fill(SEED, 99)
    with pytest.raises(StorageError, match="already committed"):
        ck2.save(1, live)
    ck2.close()
    assert open(local.local_path(f"{cp.step_dir(1)}/{cp.rank_file(0)}"), "rb").read() == before
    got = restore([("durable", durable)])
    live.fill(SEED, 1)
    assert got.step == 1 and same(live, got)


def test_read_hashing_matches_one_shot_and_refuses_short_files(tmp_path, monkeypatch):
    """The restore's overlapped read+hash gives the digest of the whole buffer, chunk boundaries
    anywhere, and a file shorter than the manifest says is a short read, not a silent tail."""
    from iobench.checkpointing import restore as rs
    from iobench.checkpointing.local_writer import checksum
    from iobench.errors import IntegrityError

    monkeypatch.setattr(rs, "HASH_CHUNK", 4096)
    data = np.random.default_rng(1).integers(0, 256, 50_001, dtype=np.uint8)
    p = tmp_path / "rank.bin"
    p.write_bytes(data.tobytes())
    dst = np.zeros_like(data)
    assert rs.read_hashing(str(p), "x", memoryview(dst), "xxh3_64") == checksum(memoryview(data))
    assert np.array_equal(dst, data)
    big = np.zeros(60_000, dtype=np.uint8)
    with pytest.raises(IntegrityError, match="short read"):
        rs.read_hashing(str(p), "x", memoryview(big), "xxh3_64")
