"""Tar sample ranges across every header layout the peers write: Python's tarfile (ustar, GNU long
names, pax), webdataset's TarWriter (a pax header on every member: its float mtime), member names
of 99, 100, 101 and 255 characters, pax attributes on short names.  For each, ``iter_entries``
gives tarfile's own member ranges (start: the first extended header, ``TarInfo.offset``; end: the
padded data), ``iobench index`` records each sample's start at its first member's first header,
and the loader's map and stream reads deliver every sample once with its exact bytes, label and id.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
import types

import numpy as np
import pytest

from iobench.cli import main
from iobench.formats import tar as tarfmt
from iobench.loader.core import LoadConfig, run_load

# name lengths around ustar's 100-byte name field and its 255-byte prefix + name limit
NAME_LENGTHS = (13, 99, 100, 101, 255)


def _key(i: int, name_len: int) -> str:
    """A key whose ``KEY.jpg`` member name is ``name_len`` characters: a directory, then a name
    part of at most 100 (so that ustar fits it as prefix + name where any writer could)."""
    stem = f"s{i:04d}"
    if name_len <= 100:
        return "d" * (name_len - len(".jpg") - len(stem) - 1) + "/" + stem
    prefix = max(1, name_len - 101)
    return "d" * prefix + "/" + "e" * (name_len - prefix - 1 - len(".jpg") - len(stem)) + stem


def _samples(shard: int) -> list[tuple[str, bytes, int]]:
    """(key, image payload, label) of one shard: every name length, payloads 0..2 blocks long."""
    out = []
    for j, n in enumerate(NAME_LENGTHS * 2):
        i = shard * 100 + j
        size = (1, 511, 512, 513, 1500)[j % 5]
        out.append((_key(i, n), bytes((i * 7 + k) % 251 for k in range(size)), i % 10))
    return out


def _write_tarfile(fmt: int, samples, pax: bool) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for j, (key, image, label) in enumerate(samples):
            for ext, payload in ((".jpg", image), (".cls", str(label).encode())):
                ti = tarfile.TarInfo(key + ext)
                ti.size = len(payload)
                ti.mtime = 1_700_000_000
                if pax and j % 2 == 0:      # pax attributes on a short name too: an 'x' header anyway
                    ti.pax_headers = {"comment": "c" * (j * 40 + 1), "iobench.sample": str(j)}
                    ti.mtime = 1_700_000_000.25
                tf.addfile(ti, io.BytesIO(payload))
    return buf.getvalue()


def _write_webdataset(samples) -> bytes:
    wds = pytest.importorskip("webdataset")
    buf = io.BytesIO()
    w = wds.TarWriter(buf)
    for key, image, label in samples:
        w.write({"__key__": key, "jpg": image, "cls": label})
    w.close()
    return buf.getvalue()


WRITERS = {
    "ustar": lambda s: _write_tarfile(tarfile.USTAR_FORMAT, s, pax=False),
    "gnu": lambda s: _write_tarfile(tarfile.GNU_FORMAT, s, pax=False),
    "pax": lambda s: _write_tarfile(tarfile.PAX_FORMAT, s, pax=False),
    "pax-attrs": lambda s: _write_tarfile(tarfile.PAX_FORMAT, s, pax=True),
    "webdataset": _write_webdataset,
}


def _tarfile_truth(data: bytes) -> list[tuple[str, int, int, bytes]]:
    """(name, first header offset, end of padded data, payload) of each regular member, as tarfile reads them."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return [(m.name, m.offset, m.offset_data + m.size + (-m.size % 512), tf.extractfile(m).read())
                for m in tf.getmembers() if m.isreg()]


@pytest.fixture(scope="module", params=list(WRITERS))
def dataset(request, tmp_path_factory):
    """Two shards by one writer, indexed; (root, manifest dict, expected samples by id, shard bytes)."""
    root = tmp_path_factory.mktemp(f"tar-{request.param}") / "ds"
    root.mkdir()
    expected: dict[int, tuple[bytes, int]] = {}
    shards = {}
    sid = 0
    for s in range(2):
        data = WRITERS[request.param](_samples(s))
        name = f"shard-{s:04d}.tar"
        (root / name).write_bytes(data)
        shards[name] = data
        for _, image, label in _samples(s):
            expected[sid] = (image, label)
            sid += 1
    assert main(["index", str(root), "--format", "tar"]) == 0
    manifest = json.loads((root / "manifest.json").read_text())
    return request.param, root, manifest, expected, shards


def test_iter_entries_are_tarfiles_ranges(dataset):
    writer, _root, _m, _exp, shards = dataset
    for data in shards.values():
        truth = _tarfile_truth(data)
        ours = [(e.name, e.start, e.end, bytes(e.payload)) for e in tarfmt.iter_entries(data)]
        assert ours == truth
        lengths = {len(n) for n, *_ in truth}
        assert {99, 100, 101, 255}.issubset(lengths)
        if writer in ("gnu", "pax", "webdataset"):      # the long names do have extended headers
            assert any(start < end - 512 - len(p) - (-len(p) % 512) for _, start, end, p in truth)


def test_index_offsets_start_at_each_samples_first_header(dataset):
    _writer, _root, manifest, expected, shards = dataset
    assert manifest["extra"]["index_version"] == 2 and manifest["total_samples"] == len(expected)
    for sh in manifest["shards"]:
        truth = _tarfile_truth(shards[sh["path"]])
        starts, key = [], None
        for name, start, _end, _p in truth:
            k = tarfmt.split_key(name)[0]
            if k != key:
                starts.append(start)
                key = k
        assert sh["offsets"] == starts + [truth[-1][2]]


class _Collect:
    """The step callback: every sample the loader delivers, by id."""

    def __init__(self) -> None:
        self.got: list[tuple[int, bytes, int]] = []

    def __call__(self, batch, step) -> None:
        for i in range(len(batch)):
            self.got.append((int(batch.indices[i]), np.asarray(batch.sample(i)).tobytes(), int(batch.labels[i])))


@pytest.mark.parametrize("access", ["map", "stream"])
def test_map_and_stream_reads_deliver_exact_samples(dataset, access, monkeypatch):
    _writer, root, _m, expected, _shards = dataset
    collect = _Collect()
    mod = types.ModuleType("iobench_tar_ranges_step")
    mod.step = collect                                          # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "iobench_tar_ranges_step", mod)
    cfg = LoadConfig(dataset=str(root), workers=1, batch_size=3, access=access, shuffle=True, seed=5,
                     shuffle_buffer=4, compute_mode="callback", compute_fn="iobench_tar_ranges_step:step",
                     monitor_interval_s=1.0)
    run = run_load(cfg)
    assert run.metrics["access"] == access
    got = sorted(collect.got)
    assert [i for i, _, _ in got] == sorted(expected)         # every sample once, by its id
    for i, data, label in got:
        assert (data, label) == expected[i], f"sample {i}"


def test_stale_tar_index_is_refused_with_the_fix(dataset, tmp_path, capsys):
    _writer, root, manifest, _exp, _shards = dataset
    stale = dict(manifest, extra={k: v for k, v in manifest["extra"].items() if k != "index_version"})
    (tmp_path / "ds").mkdir()
    for sh in manifest["shards"]:
        (tmp_path / "ds" / sh["path"]).write_bytes((root / sh["path"]).read_bytes())
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(stale))
    assert main(["load", str(tmp_path / "ds"), "--batch-size", "2", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "index version 1" in err and f"iobench index {tmp_path / 'ds'} --force" in err


def test_driver_reindexes_a_manifest_cached_by_another_index_version(dataset, tmp_path, monkeypatch):
    from iobench import driver, manifest as manifest_mod
    from iobench.storage import open_backend

    _writer, root, manifest, _exp, _shards = dataset
    monkeypatch.setenv("IOBENCH_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "ds").mkdir()
    for sh in manifest["shards"]:        # the tars alone: the driver indexes them into its cache
        (tmp_path / "ds" / sh["path"]).write_bytes((root / sh["path"]).read_bytes())
    url = str(tmp_path / "ds")
    said: list[str] = []
    first, path = driver._indexed_manifest(open_backend(url), url, said.append)
    again, same = driver._indexed_manifest(open_backend(url), url, said.append)
    assert same == path and "using the index cached" in said[-1]
    assert [s.offsets for s in again.shards] == [tuple(s["offsets"]) for s in manifest["shards"]]
    monkeypatch.setattr(manifest_mod, "INDEX_VERSION", manifest_mod.INDEX_VERSION + 1)
    _m, other = driver._indexed_manifest(open_backend(url), url, said.append)
    assert other != path and "indexing it" in said[-1]
