"""Tier commands delete only what iobench's records say it created.

A property test drives random sequences of stage / read / evict / reconcile / lifecycle (with
and without a prefix, over the hot tier's whole root too) over several datasets — one living
inside a bounded tier (registered), one outside, one inside a tier and never registered — and
over the user's own files on every tier (a note at each tier's root, a project directory, a
file under the checkpoint prefix, a look-alike ``step-0`` directory with no iobench manifest),
and asserts after every step that no origin and no user byte changed and no bounded tier
holds more than its capacity (everything on it counted except the origins and user files).
Lifecycle items are checkpoint steps whose manifest says iobench committed them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tiers_util import make_dataset

from iobench.cli import main
from iobench.errors import ConfigError
from iobench.tiers.config import TiersConfig, TierSpec, write_tiers_file
from iobench.tiers.lifecycle import apply_lifecycle, lifecycle_items, plan_lifecycle
from iobench.tiers.manager import TierManager

SHARD = 2000
CAP = {"nvme": 5 * SHARD + 100, "pfs": 7 * SHARD + 100}


def _snapshot(root: str) -> dict[str, str]:
    out = {}
    for dirpath, _d, files in os.walk(root):
        for n in files:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = hashlib.sha1(open(p, "rb").read()).hexdigest()
    return out


def _du(root: str, exclude: list[str]) -> int:
    total = 0
    for dirpath, _d, files in os.walk(root):
        if any(dirpath == e or dirpath.startswith(e + os.sep) for e in exclude):
            continue
        for n in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, n))
            except FileNotFoundError:
                pass
    return total


class World:
    def __init__(self, base: str):
        self.base = base
        self.nvme, self.pfs, self.obj = (os.path.join(base, n) for n in ("nvme", "pfs", "object"))
        self.origins = {"inside": os.path.join(self.pfs, "ckpt", "ds-inside"),      # registered, lives in pfs
                        "outside": os.path.join(base, "src", "ds-outside"),         # registered, no tier
                        "stranger": os.path.join(self.pfs, "ds-stranger")}          # in pfs, never registered
        for i, p in enumerate(self.origins.values()):
            make_dataset(p, shards=3, shard_bytes=SHARD, seed=i)
        for step in (1, 2, 3):
            d = os.path.join(self.pfs, "ckpt", f"step-{step}")
            os.makedirs(d)
            with open(os.path.join(d, "rank0.bin"), "wb") as f:
                f.write(os.urandom(300))
            with open(os.path.join(d, "manifest.json"), "w") as f:   # the record: iobench committed it
                f.write('{"format": "iobench-checkpoint", "step": %d}' % step)
        # The user's own files, on every tier: never iobench's to delete, whatever the command.
        self.user = [os.path.join(t, n) for t in (self.nvme, self.pfs, self.obj)
                     for n in ("scratch.txt", os.path.join("project", "main.py"))]
        self.user += [os.path.join(self.pfs, "ckpt", "notes.md"), os.path.join(self.pfs, "ckpt", "step-0", "rank0.bin"),
                      os.path.join(self.pfs, "step-9", "manifest.json")]
        for i, p in enumerate(self.user):
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(f"user file {i}\n")
        # No explicit catalog: the default must land outside every bounded tier.
        self.cfg = TiersConfig(tiers=(TierSpec("nvme", self.nvme, capacity=CAP["nvme"]),
                                      TierSpec("pfs", self.pfs, capacity=CAP["pfs"]),
                                      TierSpec("object", self.obj)))
        self.mgr = TierManager(self.cfg, fsync=False).open()
        self.ds = {k: self.mgr.register(self.origins[k]) for k in ("inside", "outside")}
        self.before = {k: _snapshot(p) for k, p in self.origins.items()}
        self.user_before = {p: open(p, "rb").read() for p in self.user}

    def check(self) -> None:
        for k, p in self.origins.items():
            assert _snapshot(p) == self.before[k], f"origin {k} changed"
        for p, data in self.user_before.items():
            assert os.path.exists(p), f"user file {p} deleted"
            assert open(p, "rb").read() == data, f"user file {p} changed"
        for t in ("nvme", "pfs"):
            root = getattr(self, t)
            used = _du(root, [p for p in self.origins.values()] + [os.path.join(self.pfs, "ckpt")]
                       + [os.path.join(root, "project"), os.path.join(root, "step-9")]) \
                - sum(os.path.getsize(p) for p in self.user if os.path.dirname(p) == root)
            assert used <= CAP[t], f"tier {t} holds {used} bytes > capacity {CAP[t]}"
        assert not self.cfg.catalog.startswith(self.nvme + os.sep) and not self.cfg.catalog.startswith(self.pfs + os.sep)

    def do(self, op: tuple) -> None:
        kind = op[0]
        if kind == "stage":
            _, which, to, n = op
            ds = self.ds[which]
            for s in ds.manifest.shards[:n]:
                self.mgr.stage_shard(ds, s, to)
        elif kind == "read":
            _, which, to, i = op
            ds = self.ds[which]
            data, _ = self.mgr.read(ds, ds.manifest.shards[i % len(ds.manifest.shards)], to)
            assert len(data) == SHARD
        elif kind == "evict":
            self.mgr.evict(op[1])
        elif kind == "reconcile":
            self.mgr.reconcile(op[1])
        elif kind == "lifecycle":
            _, every, prefix, hot = op
            if hot == "nvme" and prefix:
                return
            root = self.pfs if hot == "pfs" else self.nvme
            names = sorted(n for n in os.listdir(os.path.join(root, prefix)) if not n.startswith("."))
            items = lifecycle_items(self.mgr, hot, prefix, names)
            assert "ds-inside" not in items and "step-0" not in items and "notes.md" not in items
            assert "scratch.txt" not in items and "project" not in items
            plan = plan_lifecycle(items, keep_last=1, every_nth=every) if items else None
            if plan is not None:
                rep = apply_lifecycle(self.mgr, plan, hot, "object", prefix)
                assert not rep.errors
        elif kind == "lifecycle-everything":
            # a plan naming every entry (as a caller could build it): only iobench's steps may go
            names = sorted(os.listdir(os.path.join(self.pfs, "ckpt")))
            apply_lifecycle(self.mgr, plan_lifecycle(names, keep_last=1), "pfs", "object", "ckpt")
            apply_lifecycle(self.mgr, plan_lifecycle(sorted(os.listdir(self.nvme)), keep_last=1), "nvme", "object")

    def close(self) -> None:
        self.mgr.close()


OPS = st.one_of(
    st.tuples(st.just("stage"), st.sampled_from(["inside", "outside"]), st.sampled_from(["nvme", "pfs"]),
              st.integers(1, 3)),
    st.tuples(st.just("read"), st.sampled_from(["inside", "outside"]), st.sampled_from(["nvme", "pfs"]),
              st.integers(0, 5)),
    st.tuples(st.just("evict"), st.sampled_from(["nvme", "pfs"])),
    st.tuples(st.just("reconcile"), st.sampled_from(["nvme", "pfs"])),
    st.tuples(st.just("lifecycle"), st.integers(0, 2), st.sampled_from(["ckpt", ""]), st.sampled_from(["pfs", "nvme"])),
    st.tuples(st.just("lifecycle-everything")),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=1, max_size=10))
def test_random_tier_operations_never_touch_origins_or_exceed_capacity(ops):
    base = tempfile.mkdtemp(prefix="h11-own-")
    w = World(base)
    try:
        w.check()
        for op in ops:
            w.do(op)
            w.check()
    finally:
        w.close()
        shutil.rmtree(base, ignore_errors=True)


def test_reconcile_with_capacity_on_the_pfs_tier_keeps_datasets_living_there(tmp_path, capsys):
    w = World(str(tmp_path / "w"))
    try:
        stray = os.path.join(w.pfs, "my-notes.txt")
        with open(stray, "w") as f:
            f.write("mine")
        ds = w.ds["outside"]
        w.mgr.prestage(ds, "pfs")
        # in a copy directory: a dead stager's temp file for one of the dataset's shards is ours to clean;
        # a file of any other name there is not (ownership by record: the catalog names the shards)
        orphan = os.path.join(w.pfs, ds.id, f".{ds.manifest.shards[0].path}.zzzzzzzz.tmp")
        foreign = os.path.join(w.pfs, ds.id, "orphan.bin")
        for path in (orphan, foreign):
            with open(path, "wb") as f:
                f.write(b"x")
        tiers = write_tiers_file(w.cfg, str(tmp_path / "tiers.yaml"))
        assert main(["tiers", "reconcile", "--tiers", tiers]) == 0
        assert "removed_files': 1" in capsys.readouterr().out
        assert not os.path.exists(orphan) and os.path.exists(stray) and os.path.exists(foreign)
        w.check()
    finally:
        w.close()


def test_lifecycle_refuses_hot_equal_archive_and_keeps_origins(tmp_path, capsys):
    w = World(str(tmp_path / "w"))
    try:
        tiers = write_tiers_file(w.cfg, str(tmp_path / "tiers.yaml"))
        rc = main(["tiers", "lifecycle", "--tiers", tiers, "--hot", "pfs", "--archive", "pfs", "--prefix", "ckpt",
                   "--keep-last", "1", "--every-nth", "2"])
        err = capsys.readouterr().err
        assert rc == 2 and "--archive" in err and len(err.strip().splitlines()) == 1
        assert sorted(os.listdir(os.path.join(w.pfs, "ckpt"))) == ["ds-inside", "notes.md", "step-0", "step-1",
                                                                  "step-2", "step-3"]
        rc = main(["tiers", "lifecycle", "--tiers", tiers, "--hot", "pfs", "--archive", "object", "--prefix", "ckpt",
                   "--keep-last", "1", "--every-nth", "2"])
        assert rc == 0, capsys.readouterr().err
        assert sorted(os.listdir(os.path.join(w.pfs, "ckpt"))) == ["ds-inside", "notes.md", "step-0", "step-3"]
        assert os.listdir(os.path.join(w.obj, "ckpt")) == ["step-2"]
        w.check()
        with pytest.raises(ConfigError, match="--prefix"):
            main(["--debug", "tiers", "lifecycle", "--tiers", tiers, "--hot", "pfs", "--archive", "object",
                  "--prefix", "../..", "--keep-last", "1"])
    finally:
        w.close()


def test_failed_archive_copy_expires_nothing(tmp_path, monkeypatch):
    import iobench.tiers.lifecycle as lc

    w = World(str(tmp_path / "w"))
    try:
        monkeypatch.setattr(lc, "_copy_item", lambda *a: (_ for _ in ()).throw(OSError("archive is broken")))
        names = lifecycle_items(w.mgr, "pfs", "ckpt", sorted(os.listdir(os.path.join(w.pfs, "ckpt"))))
        rep = apply_lifecycle(w.mgr, plan_lifecycle(names, keep_last=1, every_nth=2), "pfs", "object", "ckpt")
        assert rep.errors and not rep.expired and not rep.dropped
        assert sorted(os.listdir(os.path.join(w.pfs, "ckpt"))) == ["ds-inside", "notes.md", "step-0", "step-1",
                                                                  "step-2", "step-3"]
    finally:
        w.close()


def test_catalog_inside_a_bounded_tier_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="catalog: .* inside tier 'nvme'"):
        TiersConfig(tiers=(TierSpec("nvme", str(tmp_path / "nvme"), capacity="1MiB"),),
                    catalog=str(tmp_path / "nvme" / ".iobench" / "catalog.sqlite"))
    cfg = TiersConfig(tiers=(TierSpec("nvme", str(tmp_path / "nvme"), capacity="1MiB"),))
    assert cfg.catalog == str(tmp_path / ".nvme.iobench" / "catalog.sqlite")
    cfg = TiersConfig(tiers=(TierSpec("nvme", str(tmp_path / "nvme"), capacity="1MiB"),
                             TierSpec("pfs", str(tmp_path / "pfs"))))
    assert cfg.catalog == str(tmp_path / "pfs" / ".iobench" / "catalog.sqlite")


def test_lifecycle_never_archives_over_the_users_files_on_the_archive_tier(tmp_path):
    w = World(str(tmp_path / "w"))
    try:
        theirs = os.path.join(w.obj, "ckpt", "step-2", "rank0.bin")   # the user's, where step-2 would go
        os.makedirs(os.path.dirname(theirs))
        with open(theirs, "w") as f:
            f.write("not a checkpoint")
        names = lifecycle_items(w.mgr, "pfs", "ckpt", sorted(os.listdir(os.path.join(w.pfs, "ckpt"))))
        rep = apply_lifecycle(w.mgr, plan_lifecycle(names, keep_last=1, every_nth=2), "pfs", "object", "ckpt")
        assert "step-2" in rep.errors and not rep.expired and not rep.dropped   # nothing dropped after a failure
        assert open(theirs).read() == "not a checkpoint"
        assert sorted(os.listdir(os.path.join(w.pfs, "ckpt"))) == ["ds-inside", "notes.md", "step-0", "step-1",
                                                                  "step-2", "step-3"]
        w.check()
    finally:
        w.close()
