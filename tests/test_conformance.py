"""The loader's seams as one contract, run against every implementation (zarr's ``StoreTests``).

Every shard source (one per storage kind, the generic one that reads through the emulation
and fault wrappers, the verifying wrapper) passes the same tests of the ``ShardSource``
contract: each read returns the stored bytes exactly, a short shard is an ``IntegrityError``,
and its capability flags are honest (a flag it claims does what it says; a read it does not
claim goes through the path it says).  Then every source x format x access pattern loads one
epoch and must deliver every sample exactly once, with its stored bytes.

Datasets are tiny (3 shards of 8 samples) and most loads run in the consumer (``--workers
0``: the workers' code, no process start-up); one load per source runs with two workers, so
the pickled source, the typed worker messages and a worker's error cross a process boundary.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from iobench.errors import ConfigError, IntegrityError, IobenchError, StorageError
from iobench.formats import get_format
from iobench.generate import GenSpec, generate
from iobench.io.retry import RetryPolicy
from iobench.loader.core import LoadConfig, run_load
from iobench.loader.messages import ExceptionWrapper, Failed
from iobench.loader.source import (BackendSource, LocalFileSource, MemorySource, ObjectStoreSource, ShardSource,
                                   backend_source)
from iobench.loader.verifying import VerifyingSource
from iobench.manifest import read_manifest
from iobench.storage import open_backend

FORMATS = ("raw", "tfrecord", "tar", "parquet", "npy", "megatron", "hdf5", "arrow")
NO_RANGES = ("parquet", "arrow")      # no per-sample byte ranges: map is refused
ACCESSES = ("map", "stream", "block")
# storage kind -> what the factory must pick for plain storage of that kind
KINDS = {"local": LocalFileSource, "memory": MemorySource, "s3": ObjectStoreSource}
# the sources under test: (storage kind, BackendSource options, wrap in VerifyingSource)
SOURCES = {
    "local": ("local", {}, False),
    "local-odirect": ("local", {"odirect": True}, False),
    "memory": ("memory", {}, False),
    "s3": ("s3", {"s3_client": "s3fs", "block_size": 4096, "concurrency": 3}, False),
    "emulated": ("local", {"emulation": "const:0.1ms"}, False),
    "emulated-memory": ("memory", {"emulation": "const:0.1ms"}, False),
    "emulated-s3": ("s3", {"s3_client": "s3fs", "block_size": 4096, "concurrency": 3, "emulation": "const:0.1ms"}, False),
    "verifying": ("local", {}, True),
}


# The loads below run every source but emulated S3, whose GETs are s3's through one more wrapper (the
# contract tests above cover that wrapper): the suite stays under a minute.
LOAD_SOURCES = [n for n in SOURCES if n != "emulated-s3"]


def _spec(fmt: str) -> GenSpec:
    return GenSpec(format=fmt, modality="tokens", num_samples=24, shard_size="8 samples", seq_len=16,
                   vocab_size=1000, fsync=False)


class _Data:
    """One generated dataset: its URL, the options that reach it, manifest, stored bytes per shard."""

    def __init__(self, url: str, opts: dict, endpoint: str | None) -> None:
        self.url, self.opts, self.endpoint = url, opts, endpoint
        self.backend = open_backend(url, endpoint_url=endpoint, storage_options=opts or None)
        self.manifest = read_manifest(self.backend)
        self.stored = {sh.path: bytes(self.backend.cat(sh.path)) for sh in self.manifest.shards}
        reader = get_format(self.manifest.format).reader(self.manifest)
        # every sample's bytes as the format decodes them from the stored shards (the reference)
        self.samples = {s.index: np.ascontiguousarray(s.data).tobytes()
                        for sh in self.manifest.shards for s in reader.iter_samples(self.stored[sh.path], sh)}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, request):
    """(storage kind, format) -> _Data, generated on first use."""
    made: dict = {}

    def get(kind: str, fmt: str) -> _Data:
        if (kind, fmt) not in made:
            pytest.importorskip("pyarrow") if fmt in ("parquet", "arrow") else None
            pytest.importorskip("h5py") if fmt == "hdf5" else None
            opts, endpoint = {}, None
            if kind == "local":
                url = str(tmp_path_factory.mktemp(f"conf-{fmt}") / "ds")
            elif kind == "memory":
                url = f"memory://conformance/{fmt}-{os.getpid()}"
            else:
                server = request.getfixturevalue("s3_server")
                opts, endpoint = {"key": server.access_key, "secret": server.secret_key}, server.endpoint_url
                url = f"s3://iobench/conformance-{os.getpid()}/{fmt}"
            generate(_spec(fmt), url, endpoint_url=endpoint, storage_options=opts or None, progress=False)
            made[kind, fmt] = _Data(url, opts, endpoint)
        return made[kind, fmt]

    return get


def _source(name: str, data: _Data, **extra) -> ShardSource:
    kind, options, verify = SOURCES[name]
    src: ShardSource = backend_source(data.url, endpoint_url=data.endpoint, storage_options=data.opts,
                                      **(options | extra))
    return VerifyingSource(src) if verify else src


@pytest.fixture
def opened(datasets):
    """open(name, fmt) -> an opened source over that dataset (closed after the test)."""
    made = []

    def make(name: str, fmt: str = "raw", **extra):
        data = datasets(SOURCES[name][0], fmt)
        src = _source(name, data, **extra)
        src.open(worker_id=0)
        made.append(src)
        if SOURCES[name][1].get("odirect") and not src.supports_odirect:
            pytest.skip("no O_DIRECT here")
        return src, data

    yield make
    for s in made:
        s.close()


def _bytes(x) -> bytes:
    return bytes(memoryview(x).cast("B"))


# ---- the ShardSource contract, per source --------------------------------------------------------


@pytest.mark.parametrize("name", SOURCES)
def test_the_factory_picks_one_class_per_storage_kind(name, datasets):
    kind, options, verify = SOURCES[name]
    src = _source(name, datasets(kind, "raw"))
    inner = src.inner if isinstance(src, VerifyingSource) else src
    wrapped = bool(options.get("emulation"))
    want = BackendSource if wrapped and kind != "s3" else KINDS[kind]
    assert type(inner) is want


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", SOURCES)
def test_whole_shards_are_the_stored_bytes(name, fmt, opened):
    src, data = opened(name, fmt)
    shards = data.manifest.shards
    for sh in shards:
        assert _bytes(src.read_shard(sh)) == data.stored[sh.path]
    assert [_bytes(d) for d in src.read_shards(shards)] == [data.stored[sh.path] for sh in shards]


@pytest.mark.parametrize("name", SOURCES)
def test_ranges_and_pieces_are_the_stored_bytes(name, opened):
    src, data = opened(name)
    rng = np.random.default_rng(1)
    for sh in data.manifest.shards:
        stored = data.stored[sh.path]
        for _ in range(5):
            a = int(rng.integers(0, sh.bytes - 1))
            n = int(rng.integers(1, sh.bytes - a + 1))
            assert _bytes(src.read_range(sh, a, n)) == stored[a:a + n]
        # one streamed request in pieces, and the same pieces read into a buffer
        cuts = list(range(0, sh.bytes, 100)) + [sh.bytes]
        got = b"".join(_bytes(src.read_piece(sh, a, b - a, a == 0)) for a, b in zip(cuts, cuts[1:]))
        assert got == stored
        out = bytearray(sh.bytes)
        for a, b in zip(cuts, cuts[1:]):
            src.read_piece_into(sh, a, memoryview(out)[a:b], a == 0)
        assert bytes(out) == stored


@pytest.mark.parametrize("name", SOURCES)
def test_records_land_in_their_rows(name, opened):
    src, data = opened(name)
    reader = get_format("raw").reader(data.manifest)
    first, length, _ = reader.fixed_layout()
    shards = data.manifest.shards
    rng = np.random.default_rng(2)
    shard_of = rng.integers(len(shards), size=30)
    local = rng.integers(8, size=30)
    for inflight in (1, 3):
        out = np.zeros((30, length), dtype=np.uint8)
        assert src.read_records(shards, shard_of, local, first, length, out, inflight=inflight) >= 1
        for i in range(30):
            a = first + int(local[i]) * length
            assert out[i].tobytes() == data.stored[shards[int(shard_of[i])].path][a:a + length], (inflight, i)
    block = src.read_block_records(shards, first, length, reader.check_records)
    if block is not None:
        want = b"".join(data.stored[sh.path][first:] for sh in shards)
        assert block.tobytes() == want


@pytest.mark.parametrize("name", SOURCES)
def test_concurrent_reads_are_safe_where_claimed(name, opened):
    src, data = opened(name)
    if not src.concurrent_reads:
        pytest.skip(f"{name} does not claim concurrent reads")
    shards = data.manifest.shards
    errors, got = [], {}

    def read(i: int) -> None:
        try:
            got[i] = [_bytes(d) for d in src.read_shards(shards)]
        except Exception as e:  # noqa: BLE001 — collected, asserted below
            errors.append(e)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(g == [data.stored[sh.path] for sh in shards] for g in got.values())


@pytest.mark.parametrize("name", SOURCES)
def test_range_and_piece_flags_say_what_a_read_costs(name, opened):
    """supports_range_reads / supports_pieces: a read of n bytes moves n bytes in one request;
    without the flag, the source reads (and counts) the whole shard."""
    src, data = opened(name)
    sh = data.manifest.shards[1]

    def moved(fn) -> tuple[int, int]:
        before = src.stats()
        fn()
        after = src.stats()
        return (after["bytes_read"] - before.get("bytes_read", 0),
                after["calls"].get("read", 0) - before.get("calls", {}).get("read", 0))

    want = (10, 1) if src.supports_range_reads else (sh.bytes, 1)
    assert moved(lambda: src.read_range(sh, 70, 10)) == want
    want = (12, 1) if src.supports_pieces else (sh.bytes, 1)
    assert moved(lambda: src.read_piece(sh, 64, 12, True)) == want


def test_wrapped_storage_claims_no_pread_and_every_read_meets_the_wrapper(datasets):
    """Emulated or faulty storage: the factory's source claims no positional reads, and every kind
    of read reaches the wrapper (here a fault on every request: each read fails)."""
    from iobench.wrappers import InjectedFault

    data = datasets("local", "raw")
    src = backend_source(data.url, error_rate=1.0, retry=RetryPolicy(attempts=1))
    assert not (src.supports_pread or src.supports_odirect or src.supports_mapped_blocks)
    src.open()
    sh = data.manifest.shards
    reads = [lambda: src.read_shard(sh[0]), lambda: src.read_shards(sh), lambda: src.read_range(sh[0], 64, 32),
             lambda: src.read_piece(sh[0], 64, 32, True),
             lambda: src.read_records(sh, np.array([0, 1]), np.array([0, 0]), 64, 32, np.zeros((2, 32), np.uint8))]
    try:
        for read in reads:
            with pytest.raises((InjectedFault, StorageError)):
                read()
    finally:
        src.close()


def test_a_cached_shard_block_is_read_into_a_reused_buffer(opened):
    """A block of one local shard in the page cache is read (a copy in a reused buffer of ours,
    not a mapping of the file: NOTE [ Block buffers ]), the same buffer again once the block is
    dropped, and its bytes are the shard's."""
    src, data = opened("local")
    reader = get_format("raw").reader(data.manifest)
    first, length, _ = reader.fixed_layout()
    sh = data.manifest.shards[0]
    src.read_shard(sh)   # now in the page cache
    rows = src.read_block_records([sh], first, length, reader.check_records)
    assert rows.flags.writeable and rows.tobytes() == data.stored[sh.path][first:]
    where = rows.__array_interface__["data"][0]
    del rows
    again = src.read_block_records([sh], first, length, reader.check_records)
    assert again.__array_interface__["data"][0] == where and again.tobytes() == data.stored[sh.path][first:]
    held = src.read_block_records([sh], first, length, reader.check_records)   # ``again`` still alive
    assert held.__array_interface__["data"][0] != where and held.tobytes() == again.tobytes()
    part = again[1:3].view(np.uint16)   # a view of a view (a batch's rows) holds the buffer too
    del again, held
    third = src.read_block_records([sh], first, length, reader.check_records)
    assert third.__array_interface__["data"][0] != where and part.base is not None


@pytest.mark.parametrize("size", [1, 4096, 3 * 2**20 + 5, 8 * 2**20 + 64])
def test_block_buffers_are_private_page_aligned_and_big_enough(size):
    import mmap

    from iobench.loader.source import _anonymous

    m = _anonymous(size)
    a = np.frombuffer(m, dtype=np.uint8)
    assert len(a) >= size and a.__array_interface__["data"][0] % mmap.PAGESIZE == 0
    a[:size] = 7   # writeable, and private: nothing else sees it
    assert int(a[:size].min()) == 7


def test_odirect_flag_opens_with_o_direct(opened, monkeypatch):
    src, data = opened("local-odirect")
    flags = []
    real = os.open
    monkeypatch.setattr(os, "open", lambda p, f, *a: flags.append(f) or real(p, f, *a))
    try:
        assert _bytes(src.read_shard(data.manifest.shards[0])) == data.stored[data.manifest.shards[0].path]
    except OSError as e:   # tmpfs and some FUSE file systems refuse O_DIRECT
        pytest.skip(str(e))
    assert flags and all(f & os.O_DIRECT for f in flags)


def test_verifying_flags_are_its_own():
    class Plain(ShardSource):
        supports_range_reads = supports_record_reads = supports_pieces = supports_pread = True
        supports_odirect = concurrent_reads = True

        def read_shard(self, shard):
            return b""

    v = VerifyingSource(Plain())
    assert (v.supports_pieces, v.supports_odirect) == (True, True)   # its reads are the wrapped source's
    assert not (v.supports_range_reads or v.supports_record_reads or v.supports_pread
                or v.concurrent_reads or v.supports_mapped_blocks)   # never around the check


# ---- integrity errors surface ----------------------------------------------------------------


@pytest.fixture
def truncated(tmp_path, request):
    """(kind) -> a raw dataset whose shard 1 lost its last 40 bytes behind the manifest's back."""
    def make(kind: str) -> _Data:
        if kind == "local":
            url = str(tmp_path / "ds")
        elif kind == "memory":
            url = f"memory://conformance/trunc-{os.getpid()}-{request.node.name}"
        else:
            server = request.getfixturevalue("s3_server")
            url = f"s3://iobench/conformance-trunc-{os.getpid()}/{request.node.name}"
        opts, endpoint = ({}, None) if kind != "s3" else \
            ({"key": server.access_key, "secret": server.secret_key}, server.endpoint_url)
        generate(_spec("raw"), url, endpoint_url=endpoint, storage_options=opts or None, progress=False)
        data = _Data(url, opts, endpoint)
        sh = data.manifest.shards[1]
        data.backend.write_bytes(sh.path, data.stored[sh.path][:-40], fsync=False)
        return data
    return make


@pytest.mark.parametrize("name", SOURCES)
def test_a_short_shard_is_an_integrity_error_naming_it(name, truncated):
    kind, options, _verify = SOURCES[name]
    data = truncated(kind)
    src = _source(name, data)
    src.open()
    sh = data.manifest.shards[1]
    if options.get("odirect") and not src.supports_odirect:
        pytest.skip("no O_DIRECT here")
    try:
        with pytest.raises(IntegrityError, match=sh.path):
            src.read_shard(sh)
        with pytest.raises(IntegrityError, match=sh.path):
            src.read_range(sh, sh.bytes - 50, 50)
        with pytest.raises(IntegrityError, match=sh.path):
            src.read_piece(sh, sh.bytes - 50, 50, True)
    finally:
        src.close()


def test_worker_errors_carry_their_traceback_and_keep_their_class():
    try:
        raise IntegrityError("shard-7.bin: flipped byte")
    except IntegrityError as e:
        msg = Failed(3, ExceptionWrapper.of(e))
    import pickle

    msg = pickle.loads(pickle.dumps(msg))
    with pytest.raises(IntegrityError, match="shard-7.bin") as got:
        msg.error.reraise(msg.worker)
    assert "test_conformance.py" in str(got.value.__cause__)     # the worker's own traceback
    try:
        raise KeyError(lambda: 0)    # an exception that cannot be pickled
    except KeyError as e:
        wrapped = pickle.loads(pickle.dumps(ExceptionWrapper.of(e)))
    with pytest.raises(StorageError, match="loader worker 1 failed: RuntimeError: KeyError"):
        wrapped.reraise(1)


# ---- the loader over every source x format x access pattern ----------------------------------------


def _load(data: _Data, access: str, source=None, workers: int = 0, **kw) -> dict[int, bytes]:
    """{sample id: its bytes} for every sample one epoch delivers (each at most once)."""
    seen: dict[int, bytes] = {}

    def deliver(batch):
        for i, r in zip(batch.indices.tolist(), np.asarray(batch.data)):
            assert i not in seen, f"sample {i} delivered twice"
            seen[i] = np.ascontiguousarray(r).tobytes()
        return batch

    cfg = LoadConfig(dataset=data.url, endpoint_url=data.endpoint, access=access, batch_size=5, workers=workers,
                     shuffle=True, shuffle_buffer=0, epochs=1, drop_last=False, monitor_interval_s=1.0, **kw)
    run = run_load(cfg, storage_options=data.opts or None, source=source, deliver=deliver)
    assert run.metrics["samples"] == len(seen)
    return seen


def _load_options(name: str) -> tuple[dict, bool]:
    kind, options, verify = SOURCES[name]
    kw = {"emulate": options["emulation"]} if "emulation" in options else {}
    if "odirect" in options:
        kw["odirect"] = True
    if kind == "s3":
        kw |= {"s3_client": options["s3_client"], "s3_block_size": "4KiB", "s3_concurrency": 3}
    return kw | ({"verify_checksums": True} if verify else {}), verify


@pytest.mark.parametrize("access", ACCESSES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", LOAD_SOURCES)
def test_every_sample_once_with_its_bytes(name, fmt, access, datasets):
    data = datasets(SOURCES[name][0], fmt)
    kw, _ = _load_options(name)
    if access == "map" and fmt in NO_RANGES:
        with pytest.raises(ConfigError, match="load.access"):   # no per-sample ranges: refused before any work
            _load(data, access, **kw)
        return
    got = _load(data, access, **kw)
    assert sorted(got) == sorted(data.samples)
    assert all(got[i] == data.samples[i] for i in got)


@pytest.mark.parametrize("name", LOAD_SOURCES)
def test_two_worker_processes_deliver_every_sample_once(name, datasets):
    data = datasets(SOURCES[name][0], "raw")
    kw, _ = _load_options(name)
    got = _load(data, "block", workers=2, **kw)
    assert got == data.samples


def test_a_corrupt_shard_fails_a_verified_load_from_a_worker(tmp_path):
    url = str(tmp_path / "ds")
    generate(_spec("raw"), url, progress=False)
    data = _Data(url, {}, None)
    sh = data.manifest.shards[2]
    flipped = bytearray(data.stored[sh.path])
    flipped[100] ^= 1
    data.backend.write_bytes(sh.path, bytes(flipped), fsync=False)
    for access in ACCESSES:
        with pytest.raises(IobenchError, match=sh.path):
            _load(data, access, workers=2, verify_checksums=True)


def test_odirect_under_emulation_is_ignored_with_a_warning(datasets):
    """Emulated storage passes every read through its wrapper, so O_DIRECT (which would go round
    it) is off, and the results say so instead of measuring buffered reads as direct ones."""
    data = datasets("local", "raw")
    run = run_load(LoadConfig(dataset=data.url, access="block", batch_size=5, workers=0, shuffle_buffer=0,
                              epochs=1, monitor_interval_s=1.0, odirect=True, emulate="const:0.1ms"))
    assert any("--odirect ignored" in w for w in run.warnings)
