"""Generator: determinism across worker counts, shard rotation, manifest last, failures leave nothing whole."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from iobench.errors import ConfigError, StorageError
from iobench.generate import GenSpec, generate, plan_shards
from iobench.manifest import MANIFEST_NAME
from iobench.verify import verify_dataset


def _tree(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())
            if p.name != MANIFEST_NAME}


@pytest.mark.parametrize("fmt,modality", [("raw", "tokens"), ("tar", "images"), ("tfrecord", "tokens"),
                                          ("parquet", "images")])
def test_workers_1_and_4_give_byte_identical_datasets(tmp_path, fmt, modality):
    base = {"format": fmt, "modality": modality, "seed": 11, "image_width": 48, "image_height": 32,
            "seq_len": 128, "num_samples": 600 if modality == "tokens" else 24,
            "shard_size": "64 samples" if modality == "tokens" else "5 samples"}
    m1 = generate(GenSpec.from_mapping({**base, "workers": 1}), str(tmp_path / "w1"), progress=False)
    m4 = generate(GenSpec.from_mapping({**base, "workers": 4}), str(tmp_path / "w4"), progress=False)
    assert _tree(tmp_path / "w1") == _tree(tmp_path / "w4")
    d1, d4 = m1.to_dict(), m4.to_dict()
    for d in (d1, d4):
        d.pop("created_at")
        d["spec"].pop("workers")
    assert d1 == d4
    m5 = generate(GenSpec.from_mapping({**base, "seed": 12}), str(tmp_path / "s12"), progress=False)
    assert [s.checksum for s in m5.shards] != [s.checksum for s in m1.shards]


def test_shard_rotation_by_bytes_and_by_samples():
    spec = GenSpec.from_mapping({"seq_len": 1024, "num_samples": 1000, "shard_size": "256KiB"})
    plans = plan_shards(spec)
    assert [p.count for p in plans] == [128] * 7 + [104]          # 2 KiB per sample
    m = generate(spec, f"memory://rot-{uuid.uuid4().hex}", progress=False)
    assert all(s.bytes == 64 + 128 * 2048 for s in m.shards[:-1])
    spec = GenSpec.from_mapping({"num_samples": 10, "shard_size": "4 samples"})
    assert [p.count for p in plan_shards(spec)] == [4, 4, 2]
    assert [p.first for p in plan_shards(spec)] == [0, 4, 8]


def test_image_shards_land_near_the_byte_target(tmp_path):
    spec = GenSpec.from_mapping({"format": "tar", "modality": "images", "num_samples": 30, "shard_size": "1MiB"})
    m = generate(spec, str(tmp_path), progress=False)
    for s in m.shards[:-1]:
        assert 0.6 * 2**20 < s.bytes < 1.5 * 2**20


def test_checksum_algorithms(tmp_path):
    import crc32c

    m = generate(GenSpec.from_mapping({"num_samples": 8, "seq_len": 16, "checksum": "crc32c"}), str(tmp_path),
                 progress=False)
    data = (tmp_path / m.shards[0].path).read_bytes()
    assert m.shards[0].checksum == f"crc32c:{crc32c.crc32c(data):08x}"


@pytest.mark.parametrize("mapping,field", [
    ({"num_samples": 0}, "gen.num_samples"),
    ({"num_samples": -5}, "gen.num_samples"),
    ({"shard_size": "0"}, "gen.shard_size"),
    ({"shard_size": "-1MiB"}, "gen.shard_size"),
    ({"shard_size": "0 samples"}, "gen.shard_size"),
    ({"format": "zarr"}, "gen.format"),
    ({"modality": "audio"}, "gen.modality"),
    ({"token_dtype": "uint16", "vocab_size": 100000}, "gen.token_dtype"),
    ({"num_sampels": 3}, "gen.num_sampels"),
    ({"compression": "lz4"}, "gen.compression"),
    ({"workers": -1}, "gen.workers"),
])
def test_bad_spec_names_the_field(mapping, field):
    with pytest.raises(ConfigError) as e:
        GenSpec.from_mapping(mapping)
    assert e.value.field == field
    if field == "gen.num_sampels":
        assert "num_samples" in str(e.value)


def test_failure_mid_generation_leaves_no_manifest_and_no_shards(tmp_path, monkeypatch):
    import iobench.synth as synth

    real = synth.TokenSynth.rows

    def failing(self, start, stop):
        if start >= 150:
            raise OSError(errno.EIO, "injected I/O error")
        return real(self, start, stop)

    monkeypatch.setattr(synth.TokenSynth, "rows", failing)
    with pytest.raises(StorageError, match="no manifest written"):
        generate(GenSpec.from_mapping({"num_samples": 200, "seq_len": 8, "shard_size": "50 samples"}),
                 str(tmp_path), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_regenerating_withdraws_the_old_manifest_first(tmp_path, monkeypatch):
    spec = GenSpec.from_mapping({"num_samples": 20, "seq_len": 8, "shard_size": "5 samples"})
    generate(spec, str(tmp_path), progress=False)
    import iobench.synth as synth

    def failing(self, start, stop):
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(synth.TokenSynth, "rows", failing)
    with pytest.raises(StorageError):
        generate(spec, str(tmp_path), progress=False)
    assert not (tmp_path / MANIFEST_NAME).exists()
    assert not verify_dataset(str(tmp_path)).ok


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount is not permitted here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("workers", [1, 2])
def test_disk_full_fails_clearly_and_leaves_nothing_verify_accepts(tiny_tmpfs, workers):
    out = tiny_tmpfs / "ds"
    # tar: 32 payload bytes a sample (what the up-front space check counts, 125 KiB) in 1 KiB members,
    # so the disk fills while writing -- the path a disk that fills under a run takes
    spec = GenSpec.from_mapping({"format": "tar", "num_samples": 4000, "seq_len": 16, "shard_size": "256KiB",
                                 "workers": workers})
    with pytest.raises(StorageError, match="no space left"):
        generate(spec, str(out), progress=False)
    assert not (out / MANIFEST_NAME).exists()
    if out.exists():   # the directory this run made is removed when nothing is left in it
        assert [p.name for p in out.iterdir() if p.name.startswith("shard-")] == []   # no final-named partial shard
        assert not verify_dataset(str(out)).ok


def test_generate_to_s3_with_parallel_writers(s3_server, s3_prefix):
    spec = GenSpec.from_mapping({"format": "tar", "modality": "tokens", "num_samples": 300, "seq_len": 64,
                                 "shard_size": "100 samples", "workers": 2})
    opts = {"key": s3_server.access_key, "secret": s3_server.secret_key}
    m = generate(spec, s3_prefix + "/ds", endpoint_url=s3_server.endpoint_url, storage_options=opts, progress=False)
    assert len(m.shards) == 3
    rep = verify_dataset(s3_prefix + "/ds", endpoint_url=s3_server.endpoint_url, storage_options=opts)
    assert rep.ok and rep.samples_checked == 300
    local = generate(dataclasses.replace(spec, workers=1), f"memory://s3cmp-{uuid.uuid4().hex}", progress=False)
    assert [s.checksum for s in local.shards] == [s.checksum for s in m.shards]


def test_suite_stage_generates_and_verifies_every_format(tmp_path, s3_server, s3_prefix):
    import json

    from iobench.suite.generate import SUITE_FORMATS, suite_stage
    from iobench.suite import SuiteContext

    ctx = SuiteContext(out_dir=tmp_path / "out", work_dir=tmp_path / "work", s3_url=s3_prefix,
                       s3_storage_options={"key": s3_server.access_key, "secret": s3_server.secret_key},
                       endpoint_url=s3_server.endpoint_url)
    (tmp_path / "out").mkdir()
    metrics = suite_stage(ctx)
    assert metrics["datasets"] == metrics["verified"] == 4 * 2 * 2
    ds = [vars(d) for d in ctx.state.datasets]
    assert {(d["format"], d["modality"], d["location"]) for d in ds} == {
        (f, m, loc) for f in SUITE_FORMATS for m in ("tokens", "images") for loc in ("local", "s3")}
    assert all(d["url"].startswith("s3://") == (d["location"] == "s3") for d in ds)
    assert len(ctx.rows) == 4 and not ctx.warnings
    res = json.loads((tmp_path / "out" / "generate.json").read_text())
    assert res["command"] == "gen" and res["metrics"]["verified"] == 16
    assert ctx.results_files == [tmp_path / "out" / "generate.json"]


def test_fsync_calls_happen_shards_before_manifest(tmp_path, monkeypatch):
    real = os.fsync
    synced: list[str] = []

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    # one writer, in this process: the spy does not see fsyncs made in writer processes
    spec = GenSpec.from_mapping({"num_samples": 30, "seq_len": 16, "shard_size": "10 samples", "format": "tfrecord",
                                 "workers": 1})
    m = generate(spec, str(tmp_path), progress=False)
    names = [os.path.basename(p) for p in synced]
    for s in m.shards:
        assert s.path in names and s.index_path in names
    manifest_at = max(i for i, n in enumerate(names) if n.startswith(f".{MANIFEST_NAME}."))
    assert all(names.index(s.path) < manifest_at for s in m.shards)
    assert names[manifest_at + 1:] == [tmp_path.name]            # then the directory
    no = GenSpec.from_mapping({"num_samples": 30, "seq_len": 16, "shard_size": "10 samples", "fsync": False,
                               "workers": 1})
    synced.clear()
    generate(no, str(tmp_path / "nofsync"), progress=False)
    assert all(MANIFEST_NAME in n or n == "nofsync" for n in map(os.path.basename, synced))


def _regen_spec(n: int, **kw) -> GenSpec:
    # one writer, in this process: the failures below are injected by patching it
    return GenSpec.from_mapping({"format": "tfrecord", "num_samples": n, "seq_len": 8, "shard_size": "10 samples",
                                 "workers": 1, **kw})


def _names(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def test_regenerating_smaller_removes_only_what_the_old_manifest_listed(tmp_path):
    from iobench.generate import SUPERSEDED_NAME

    old = generate(_regen_spec(40), str(tmp_path), progress=False)
    assert len(old.shards) == 4
    (tmp_path / "mine.tfrecord").write_bytes(b"a user's file that looks like a shard")
    (tmp_path / "notes.txt").write_text("keep me")
    stats: dict = {}
    new = generate(_regen_spec(20), str(tmp_path), progress=False, stats=stats)
    assert len(new.shards) == 2 and stats["stale_removed"] == 4          # 2 shards + their 2 index files
    listed = {s.path for s in new.shards} | {s.index_path for s in new.shards}
    assert _names(tmp_path) == listed | {MANIFEST_NAME, "mine.tfrecord", "notes.txt"}
    assert SUPERSEDED_NAME not in _names(tmp_path)
    rep = verify_dataset(str(tmp_path))
    assert rep.ok and rep.stray_files == ["mine.tfrecord"]


def test_failure_after_the_first_shard_of_a_regeneration_leaves_no_manifest(tmp_path, monkeypatch):
    import iobench.synth as synth

    generate(_regen_spec(40), str(tmp_path), progress=False)
    (tmp_path / "notes.txt").write_text("keep me")
    real = synth.TokenSynth.rows
    seen: list[bool] = []

    def failing(self, start, stop):
        seen.append((tmp_path / MANIFEST_NAME).exists())   # the old manifest is gone before any shard is written
        if start >= 10:                                      # the first shard was rewritten already
            raise OSError(errno.EIO, "injected")
        return real(self, start, stop)

    monkeypatch.setattr(synth.TokenSynth, "rows", failing)
    with pytest.raises(StorageError, match="no manifest written"):
        generate(_regen_spec(40, seed=1), str(tmp_path), progress=False)
    assert seen and not any(seen)
    assert _names(tmp_path) == {"notes.txt"}            # neither the new shard nor the withdrawn ones remain
    assert not verify_dataset(str(tmp_path)).ok


def test_a_killed_regeneration_is_cleaned_up_by_the_next_one(tmp_path):
    """SIGKILL-like death mid-regeneration: no manifest; the next run still removes the old shards."""
    import multiprocessing as mp

    from iobench.generate import SUPERSEDED_NAME

    generate(_regen_spec(40), str(tmp_path), progress=False)
    (tmp_path / "notes.txt").write_text("keep me")

    def child():
        import iobench.synth as synth

        real = synth.TokenSynth.rows

        def dying(self, start, stop):
            if start >= 10:
                os._exit(9)                                  # no cleanup of any kind runs
            return real(self, start, stop)

        synth.TokenSynth.rows = dying
        generate(_regen_spec(40, seed=1), str(tmp_path), progress=False)

    p = mp.get_context("fork").Process(target=child)
    p.start()
    p.join(60)
    assert p.exitcode == 9
    assert not (tmp_path / MANIFEST_NAME).exists() and SUPERSEDED_NAME in _names(tmp_path)
    assert not verify_dataset(str(tmp_path)).ok
    new = generate(_regen_spec(10), str(tmp_path), progress=False)
    assert _names(tmp_path) == {MANIFEST_NAME, "notes.txt", new.shards[0].path, new.shards[0].index_path}
    assert verify_dataset(str(tmp_path)).ok


@pytest.mark.parametrize("after", [10, 20], ids=["after-1-shard", "after-2-shards"])
def test_a_killed_first_generation_is_cleaned_up_by_the_next_one(tmp_path, after):
    """A first generation killed after its first shards were renamed into place left shards and no
    manifest, and the next gen refused the directory as the user's; its record names them as gen's."""
    import multiprocessing as mp

    from iobench.generate import SUPERSEDED_NAME

    out = tmp_path / "ds"

    def child():
        import iobench.synth as synth

        real = synth.TokenSynth.rows

        def dying(self, start, stop):
            if start >= after:
                os._exit(9)                                  # no cleanup of any kind runs
            return real(self, start, stop)

        synth.TokenSynth.rows = dying
        generate(_regen_spec(40), str(out), progress=False)

    p = mp.get_context("fork").Process(target=child)
    p.start()
    p.join(60)
    assert p.exitcode == 9
    assert not (out / MANIFEST_NAME).exists() and SUPERSEDED_NAME in _names(out)
    assert any(n.endswith(".tfrecord") for n in _names(out))       # a finished shard of the killed run
    new = generate(_regen_spec(10, seed=1), str(out), progress=False)   # no --force needed
    assert _names(out) == {MANIFEST_NAME, new.shards[0].path, new.shards[0].index_path}
    assert verify_dataset(str(out)).ok


def test_a_first_generation_leaves_no_record(tmp_path):
    from iobench.generate import SUPERSEDED_NAME

    m = generate(_regen_spec(20), str(tmp_path / "ds"), progress=False)
    assert SUPERSEDED_NAME not in _names(tmp_path / "ds") and len(m.shards) == 2


def test_regenerating_on_s3_removes_stale_objects_only(s3_server, s3_prefix):
    import s3fs

    opts = {"key": s3_server.access_key, "secret": s3_server.secret_key}
    url = s3_prefix + "/ds"
    generate(_regen_spec(30, format="raw"), url, endpoint_url=s3_server.endpoint_url, storage_options=opts,
             progress=False)
    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    key = url[len("s3://"):]
    fs.pipe_file(key + "/foreign.bin", b"not ours")
    new = generate(_regen_spec(10, format="raw"), url, endpoint_url=s3_server.endpoint_url, storage_options=opts,
                   progress=False)
    names = {p.rsplit("/", 1)[1] for p in fs.find(key)}
    assert names == {MANIFEST_NAME, new.shards[0].path, "foreign.bin"}
    rep = verify_dataset(url, endpoint_url=s3_server.endpoint_url, storage_options=opts)
    assert rep.ok and rep.stray_files == ["foreign.bin"]


def test_manifest_paths_outside_the_dataset_are_never_deleted(tmp_path):
    import json

    root = tmp_path / "ds"
    generate(_regen_spec(20), str(root), progress=False)
    outside = tmp_path / "outside.tfrecord"
    outside.write_text("x")
    man = json.loads((root / MANIFEST_NAME).read_text())
    man["shards"][1]["path"] = "../outside.tfrecord"
    man["shards"][1]["index_path"] = str(outside)
    (root / MANIFEST_NAME).write_text(json.dumps(man))
    generate(_regen_spec(10), str(root), progress=False)
    assert outside.exists()
