"""``--workers 0`` (batches made in the consumer process) and ``--access memmap`` (rows sliced from
mapped shards): the exact bytes of every sample, each sample exactly once per epoch, the same order
as a worker-fed load, and the counters the results carry."""

from __future__ import annotations

import numpy as np
import pytest

from iobench.errors import ConfigError
from iobench.formats import get_format
from iobench.loader.core import run_load
from iobench.manifest import read_manifest
from iobench.storage import open_backend
from loader_helpers import quiet_cfg, tokens_dataset

SAMPLES, SHARD = 96, 16


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokens_dataset(tmp_path_factory, "inproc", SAMPLES, SHARD)


def _truth(url: str) -> dict[int, bytes]:
    """Every sample's stored bytes, read from the shard files by the manifest's layout."""
    man = read_manifest(open_backend(url))
    off, rec, _dt = get_format(man.format).reader(man).fixed_records(man.shards[0])
    out = {}
    for sh in man.shards:
        with open(open_backend(url).local_path(sh.path), "rb") as f:
            data = f.read()
        for i in range(sh.samples):
            out[sh.first_sample + i] = data[off + i * rec:off + (i + 1) * rec]
    return out


def _run(cfg):
    seen = []

    def deliver(batch):
        seen.append((batch.epoch, batch.indices.copy(), np.array(batch.data, copy=True)))
        return batch

    return run_load(cfg, deliver=deliver), seen


CASES = [(a, w) for a in ("map", "stream", "block", "memmap") for w in (0, 1)]


@pytest.mark.parametrize("access,workers", CASES)
def test_every_sample_exact_and_once_per_epoch(tok, access, workers):
    truth = _truth(tok)
    r, seen = _run(quiet_cfg(tok, 8, workers=workers, access=access, epochs=2, shuffle_buffer=20, seed=3))
    m = r.metrics
    assert m["access"] == access and r.environment["loader"]["workers"] == workers
    for epoch in (0, 1):
        ids = np.concatenate([i for e, i, _ in seen if e == epoch])
        assert sorted(ids.tolist()) == list(range(SAMPLES))
    for _e, ids, data in seen:
        for i, row in zip(ids.tolist(), data):
            assert row.tobytes() == truth[i]
    assert m["samples"] == 2 * SAMPLES and m["steps"] == 2 * SAMPLES // 8
    rec = len(truth[0])
    if access in ("map", "memmap"):   # one record asked for per sample: the exact bytes
        assert m["bytes_read"] == 2 * SAMPLES * rec
    assert len(m["per_worker"]) == max(1, workers)


@pytest.mark.parametrize("access", ["map", "stream", "block", "memmap"])
def test_w0_delivers_the_order_a_worker_does(tok, access):
    # the same pure order: W=0 is the single producer W=1 is, only in the consumer's process
    orders = {}
    for w in (0, 1):
        _r, seen = _run(quiet_cfg(tok, 8, workers=w, access=access, shuffle_buffer=20, seed=5))
        orders[w] = np.concatenate([i for _, i, _ in seen])
    assert np.array_equal(orders[0], orders[1])


def test_w0_wait_is_the_consumers_own_production_time(tok):
    # No worker: every step waits for its whole batch to be read.  With 2 ms per request and
    # 4 requests a batch, each wait covers its batch's 8 ms of storage time, step by step
    # (a W=1 worker with prefetch would hide it behind the 10 ms step instead).
    r, _ = _run(quiet_cfg(tok, 4, workers=0, access="map", steps=12, emulate="const:2ms", compute="10ms"))
    s = r.metrics["series"]
    assert all(w >= io for w, io in zip(s["wait_s"], s["io_s"]))
    assert all(io >= 4 * 0.002 for io in s["io_s"])
    assert r.metrics["requests"] == 12 * 4
    assert r.metrics["queue_depth"]["slots"] == 1 and set(s["queue_depth"]) == {1}
    stall = r.metrics["stall_ratio_first_step_excluded"]
    assert stall == pytest.approx(sum(s["wait_s"][1:]) / sum(s["step_s"][1:]))
    assert stall >= 0.8 * sum(s["io_s"][1:]) / sum(s["step_s"][1:])


def test_memmap_counts_faults_and_device_bytes(tok):
    from iobench.loader.core import LoadConfig

    r = run_load(LoadConfig(dataset=tok, workers=0, access="memmap", batch_size=8, cache="cold"))
    m = r.metrics
    assert r.environment["source"]["kind"] == "memmap"
    assert m["bytes_read"] == SAMPLES * 32
    dev = m["device_io"]
    if dev is not None and dev["device_bytes_read"] is not None:
        assert dev["read_amplification"] == dev["device_bytes_read"] / m["bytes_read"]
    assert m["requests"] >= 0 and m["read_calls"]["read"] == SAMPLES


@pytest.mark.parametrize("kw,field", [({"emulate": "bw:1GB/s"}, "--emulate"), ({"odirect": True}, "--odirect"),
                                      ({"verify_checksums": True}, "--verify-checksums"),
                                      ({"error_rate": 0.1}, "--error-rate/--timeout-rate")])
def test_memmap_refuses_what_a_mapping_cannot_do(tok, kw, field):
    with pytest.raises(ConfigError) as e:
        run_load(quiet_cfg(tok, 8, access="memmap", **kw))
    assert e.value.field == field


@pytest.mark.parametrize("workers", [0, 2])
def test_memmap_slices_any_ranged_sample_from_the_mapping(tmp_path, workers):
    # JPEG records in raw image shards: not fixed-size rows, so each sample is a view of the mapping
    from iobench.generate import GenSpec, generate
    from iobench.loader.core import LoadConfig

    url = str(tmp_path / "img")
    m = generate(GenSpec(format="raw", modality="images", num_samples=12, shard_size="5 samples", fsync=False), url,
                 progress=False)
    reader = get_format(m.format).reader(m)
    want, nbytes = {}, 0
    for sh in m.shards:
        with open(open_backend(url).local_path(sh.path), "rb") as f:
            data = f.read()
        for i in range(sh.samples):
            a, n = reader.sample_range(sh, i)
            want[sh.first_sample + i] = bytes(reader.sample_from_range(sh, i, data[a:a + n]).data)
            nbytes += n
    got: dict[int, list[bytes]] = {}

    def deliver(batch):
        for j, i in enumerate(batch.indices.tolist()):
            got.setdefault(i, []).append(bytes(batch.sample(j)))
        return batch

    r = run_load(LoadConfig(dataset=url, access="memmap", batch_size=4, workers=workers, epochs=2), deliver=deliver)
    assert r.metrics["access"] == "memmap" and r.metrics["requests"] == 2 * 12   # one slice per sample
    assert r.metrics["bytes_read"] == 2 * nbytes   # exactly the records' bytes, nothing read whole
    assert got == {i: [w, w] for i, w in want.items()}   # every sample, its bytes, once per epoch


def test_memmap_reads_megatron_gpt_windows(tmp_path):
    # GPTDataset's seq_len + 1-token windows over a Megatron .bin: overlapping slices of one mapping
    from test_formats_more import _index, _megatron_dataset

    from iobench.loader.core import LoadConfig

    root = tmp_path / "win"
    docs = _megatron_dataset(root, (8,), dtype=np.int32, code=4)
    seq = 10
    man = _index(root, "--seq-len", str(seq))
    stream = np.concatenate(docs)
    want = [stream[k * seq:k * seq + seq + 1].tobytes() for k in range(man["total_samples"])]
    for workers in (0, 1):
        _r, seen = _run(LoadConfig(dataset=str(root), access="memmap", batch_size=3, workers=workers))
        got = {int(i): row.tobytes() for _e, ids, data in seen for i, row in zip(ids, data)}
        assert sorted(got) == list(range(len(want))) and all(got[i] == w for i, w in enumerate(want))


def test_memmap_refuses_samples_without_byte_ranges(tmp_path):
    from iobench.generate import GenSpec, generate
    from iobench.loader.core import LoadConfig

    url = str(tmp_path / "z")
    generate(GenSpec(format="raw", modality="tokens", num_samples=16, shard_size="8 samples", seq_len=16,
                     vocab_size=100, compression="zstd:1", fsync=False), url, progress=False)
    with pytest.raises(ConfigError, match="use --access stream"):
        run_load(LoadConfig(dataset=url, access="memmap", batch_size=4, workers=0))


def test_memmap_on_memory_is_refused_with_the_fix(tmp_path):
    from iobench.generate import GenSpec, generate
    from iobench.loader.core import LoadConfig

    url = "memory://f2-memmap/tok"
    generate(GenSpec(format="raw", modality="tokens", num_samples=16, shard_size="8 samples", seq_len=16,
                     vocab_size=100, fsync=False), url, progress=False)
    with pytest.raises(ConfigError, match="use --access map"):
        run_load(LoadConfig(dataset=url, access="memmap", batch_size=4, workers=0))


@pytest.mark.parametrize("access", ["block", "memmap"])
def test_w0_and_memmap_metrics_are_the_typed_load_schema(tok, access):
    from iobench import schema

    r = run_load(quiet_cfg(tok, 8, workers=0, access=access))
    typed = schema.LoadMetrics.from_dict(r.metrics)
    assert typed.access == access and typed.steps == SAMPLES // 8 and typed.queue_depth["slots"] == 1


def test_w0_until_stable_stops_the_producer_where_the_rule_says(tok):
    # the stop rule reads the record while the consumer produces: it must see every step so far,
    # and stopping must end the producer at the next batch (no step after the one that stopped it)
    r = run_load(quiet_cfg(tok, 4, workers=0, until_stable=True, min_steps=10, max_time_s=0.4, compute="5ms"))
    m = r.metrics
    assert m["stopped_early"] is not None and m["steps"] < m["steps_planned"]
    assert len(m["series"]["wait_s"]) == m["steps"] == m["per_worker"][0]["batches"]
    assert m["samples"] == 4 * m["steps"]


@pytest.mark.parametrize("flags", [["-W", "0"], ["-W", "0", "--access", "memmap"], ["--access", "memmap", "-W", "1"]])
def test_the_cli_takes_w0_and_memmap(tok, tmp_path, flags, capsys):
    import json

    from iobench.cli import main

    out = tmp_path / "r.json"
    assert main(["load", tok, *flags, "-B", "8", "--steps", "6", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["environment"]["loader"]["workers"] == int(flags[flags.index("-W") + 1])
    assert doc["metrics"]["steps"] == 6 and capsys.readouterr().out.startswith("stall ")


@pytest.mark.parametrize("workers,read_ahead,most", [(0, 0, 1), (0, 1, 2), (0, 2, 3)])
def test_block_buffers_are_reused_once_their_block_is_done(tok, monkeypatch, workers, read_ahead, most):
    """block from local files: a block's buffer goes back to the pool when its batches are done
    (nothing the loader keeps -- the emitter, the step, the read-ahead queue -- holds it), so a
    load uses read_ahead + 1 buffers however many blocks it reads (NOTE [ Block buffers ]);
    the bytes are the shards' own throughout."""
    from iobench.loader.source import LocalFileSource

    real = LocalFileSource._direct_buffer
    seen: set[int] = set()

    def spy(self, size):
        buf = real(self, size)
        seen.add(buf.__array_interface__["data"][0])
        return buf

    monkeypatch.setattr(LocalFileSource, "_direct_buffer", spy)
    truth = _truth(tok)
    r, got = _run(quiet_cfg(tok, 8, workers=workers, access="block", epochs=2, shuffle_buffer=SHARD, seed=1,
                            read_ahead=read_ahead))
    assert r.metrics["steps"] == 2 * SAMPLES // 8
    assert 1 <= len(seen) <= most
    for _e, ids, data in got:
        assert [truth[int(i)] for i in ids] == [bytes(row) for row in data.view(np.uint8)]


@pytest.mark.parametrize("workers,read_ahead", [(0, 0), (0, 1), (1, 0), (2, 1)])
def test_block_read_mmap_gathers_every_row_from_the_mapped_shard(tok, monkeypatch, workers, read_ahead):
    """``block_read="mmap"``: each block of one shard is its mapping (no buffer of the pool taken),
    every sample's stored bytes arrive exactly once per epoch, and every mapping of a shard is gone
    once the load ends (a block's mapping lives as long as its views)."""
    import os

    from iobench.loader.source import LocalFileSource

    taken = []
    monkeypatch.setattr(LocalFileSource, "_direct_buffer", lambda self, size: taken.append(size))
    truth = _truth(tok)
    r, seen = _run(quiet_cfg(tok, 8, workers=workers, access="block", epochs=2, shuffle_buffer=SHARD, seed=4,
                             read_ahead=read_ahead, block_read="mmap"))
    assert taken == [] and r.environment["source"]["block_read"] == "mmap"
    # each shard mapped whole once an epoch, its header included: a read of the shard's bytes
    assert r.metrics["bytes_read"] == 2 * sum(sh.bytes for sh in read_manifest(open_backend(tok)).shards)
    for epoch in (0, 1):
        assert sorted(np.concatenate([i for e, i, _ in seen if e == epoch]).tolist()) == list(range(SAMPLES))
    for _e, ids, data in seen:
        assert [truth[int(i)] for i in ids] == [bytes(row) for row in data.view(np.uint8)]
    with open("/proc/self/maps") as f:
        assert not [ln for ln in f if os.path.realpath(tok) in ln]


def test_block_read_mmap_reads_blocks_of_several_shards_and_says_so(tok):
    truth = _truth(tok)
    r, seen = _run(quiet_cfg(tok, 8, workers=0, access="block", shuffle_buffer=2 * SHARD, block_read="mmap"))
    assert any("block(s) hold several shards and were read, not mapped" in w for w in r.warnings)
    for _e, ids, data in seen:
        assert [truth[int(i)] for i in ids] == [bytes(row) for row in data.view(np.uint8)]


@pytest.mark.parametrize("kw,problem", [({"access": "map"}, "this load is map"),
                                        ({"emulate": "bw:1GB/s"}, "plain local files"),
                                        ({"odirect": True}, "plain local files"),
                                        ({"verify_checksums": True}, "plain local files"),
                                        ({"block_read": "mapped"}, "mapped")])
def test_block_read_mmap_is_refused_where_nothing_would_be_mapped(tok, kw, problem):
    with pytest.raises(ConfigError, match=problem) as e:
        run_load(quiet_cfg(tok, 8, **({"access": "block", "block_read": "mmap"} | kw)))
    assert e.value.field == "load.block_read"


def test_block_read_mmap_refuses_memory_and_parsed_samples(tmp_path):
    from iobench.generate import GenSpec, generate
    from iobench.loader.core import LoadConfig

    for url, spec in (("memory://block-read/tok", dict(modality="tokens", seq_len=16, vocab_size=100)),
                      (str(tmp_path / "img"), dict(modality="images"))):
        generate(GenSpec(format="raw", num_samples=8, shard_size="4 samples", fsync=False, **spec), url,
                 progress=False)
        with pytest.raises(ConfigError) as e:
            run_load(LoadConfig(dataset=url, access="block", batch_size=4, workers=0, block_read="mmap"))
        assert e.value.field == "load.block_read"


def test_the_readme_block_read_command_runs_as_pasted(tmp_path_factory):
    """README's --block-read example, its dataset path swapped for a generated one (whole batches of 256)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    m = re.search(r"^ +(iobench load /data/tokens [^\n]*--block-read mmap)$", (root / "README.md").read_text(), re.M)
    assert m, "README shows the --block-read command"
    tok = tokens_dataset(tmp_path_factory, "readme-block-read", 2048, 1024)
    argv = m.group(1).replace("/data/tokens", tok).split()[1:]
    p = subprocess.run([str(Path(sys.executable).parent / "iobench"), *argv, "--steps", "4", "--no-progress"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("stall "), p.stderr
    bad = subprocess.run([str(Path(sys.executable).parent / "iobench"), *argv, "--access", "map"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "load.block_read" in bad.stderr
