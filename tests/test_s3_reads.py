"""The loader's S3 read path: request size and concurrency from the probe, blocks read ahead
concurrently (GETs kept in flight across block boundaries), a server on this host."""

from __future__ import annotations

import numpy as np
import pytest

from iobench.errors import ConfigError
from iobench.generate import GenSpec, generate
from iobench.dist.world import usable_cores
from iobench.loader.core import LoadConfig, run_load
from iobench.loader.source import ranged_gets
from iobench.planner.s3_reads import plan_s3_reads
from iobench.storage import open_backend

MiB = 2**20


def _pts(table: dict) -> list[dict]:
    """{(object_size, concurrency): MiB/s} -> probe GET points."""
    return [{"op": "get", "object_size": s, "concurrency": c, "bytes_per_s": v * MiB} for (s, c), v in table.items()]


def test_plan_picks_the_smallest_size_and_fewest_in_flight_near_the_best():
    pts = _pts({(MiB, 1): 100, (MiB, 4): 200, (MiB, 8): 210,
                (4 * MiB, 1): 200, (4 * MiB, 4): 480, (4 * MiB, 8): 500,
                (16 * MiB, 1): 300, (16 * MiB, 4): 510, (16 * MiB, 8): 520})
    p = plan_s3_reads(pts + [{"op": "put", "object_size": MiB, "concurrency": 1, "bytes_per_s": 9e12}],
                      shard_bytes=64 * MiB, workers=1)
    # 4 MiB reaches 500 of the best 520 (>= 90%); at 4 MiB, 4 in flight reach 480 of 500
    assert (p.block_size, p.concurrency, p.expected_bytes_per_s) == (4 * MiB, 4, 480 * MiB)
    # 16 GETs per 64 MiB shard: the block being read has enough GETs, one block ahead suffices
    assert p.read_ahead == 1
    # whole-shard GETs: 4 in flight need the block and 3 more read ahead
    assert plan_s3_reads(pts, 4 * MiB + 64).read_ahead == 3
    # the in-flight count is shared by the workers (rounded up), never below one
    assert plan_s3_reads(pts, 64 * MiB, workers=3).concurrency == 2
    assert plan_s3_reads(pts, 64 * MiB, workers=8).concurrency == 1
    # sizes above the shard are not candidates: a ranged GET never spans two shards
    assert plan_s3_reads(pts, 2 * MiB).block_size == MiB
    # every probed size above the shard: the shard itself, one GET each
    assert plan_s3_reads(pts, MiB // 2).block_size == MiB // 2
    assert "4 MiB" in p.why and "per worker" in p.why
    # whole shards buffered (block access): the largest size near the best, here the 16 MiB of 520
    w = plan_s3_reads(pts, shard_bytes=64 * MiB, whole_shards=True)
    assert (w.block_size, w.concurrency, w.expected_bytes_per_s) == (16 * MiB, 4, 510 * MiB)
    assert "whole shards" in w.why
    # ... never above the shard, nor a size that falls short of the best by more than `near`
    assert plan_s3_reads(pts, 8 * MiB + 64, whole_shards=True).block_size == 4 * MiB
    assert plan_s3_reads(_pts({(MiB, 4): 500, (8 * MiB, 4): 440}), 8 * MiB + 64,
                         whole_shards=True).block_size == MiB


def test_plan_refuses_results_without_gets():
    with pytest.raises(ConfigError, match="GET"):
        plan_s3_reads([{"op": "put", "object_size": MiB, "concurrency": 1, "bytes_per_s": 1.0}], MiB)
    with pytest.raises(ConfigError):
        plan_s3_reads(_pts({(MiB, 1): 1}), MiB, workers=0)


def test_server_on_this_host_reads_the_endpoint():
    def b(endpoint):
        return open_backend("s3://bkt/p", endpoint_url=endpoint, storage_options={"key": "k", "secret": "s"},
                            s3_client="s3fs")
    assert b("http://127.0.0.1:8333").server_on_this_host
    assert b("http://localhost:8333").server_on_this_host
    assert b("http://[::1]:8333").server_on_this_host
    assert not b("http://10.1.2.3:9000").server_on_this_host
    assert not b("https://s3.example.org").server_on_this_host
    assert not open_backend("memory://x").server_on_this_host


@pytest.mark.parametrize("client,block", [("obstore", "4KiB"), ("s3fs", "4KiB"), ("obstore", "1MiB"), ("s3fs", "1MiB")])
def test_blocks_read_ahead_concurrently_deliver_every_row(s3_server, s3_prefix, client, block):
    """Several blocks read at once (read-ahead 3) share one GET pool and one buffer pool
    (4 KiB GETs), or each shard is one GET parsed in the client's own buffer (obstore,
    1 MiB) or read into a reused one of ours (s3fs, 1 MiB):
    every delivered row must still be its shard's bytes, each sample exactly once."""
    if client == "obstore":
        pytest.importorskip("obstore", reason="the s3fast extra (obstore) is not installed")
    opts = {"key": s3_server.access_key, "secret": s3_server.secret_key}
    url = s3_prefix + "/tok"
    m = generate(GenSpec(format="raw", modality="tokens", num_samples=600, shard_size="40 samples", seq_len=256,
                         vocab_size=1000, fsync=False), url, endpoint_url=s3_server.endpoint_url,
                 storage_options=opts, progress=False)
    seen = []

    def deliver(batch):
        seen.append((batch.indices.copy(), np.array(batch.data, copy=True)))
        return batch
    cfg = LoadConfig(dataset=url, endpoint_url=s3_server.endpoint_url, workers=2, batch_size=16, shuffle_buffer=40,
                     s3_block_size=block, s3_concurrency=3, read_ahead=3, access="block", s3_client=client,
                     epochs=2)
    r = run_load(cfg, storage_options=opts, deliver=deliver)
    assert r.metrics["bytes_read"] == 2 * m.total_bytes
    gets = sum(len(ranged_gets(s.bytes, 4096 if block == "4KiB" else MiB)) for s in m.shards)
    assert r.metrics["read_calls"]["read"] == 2 * gets
    from iobench.formats import get_format

    b, rd = open_backend(url, endpoint_url=s3_server.endpoint_url, storage_options=opts), get_format("raw").reader(m)
    want = np.concatenate([rd.tokens(b.cat(sh.path), sh) for sh in m.shards])
    for ids, data in seen:
        assert np.array_equal(data, want[ids])
    assert sorted(int(i) for ids, _ in seen for i in ids) == sorted(list(range(600)) * 2)
    # the server is on this host: with as many workers as cores the results say so
    local = [w for w in r.warnings if "runs on this machine" in w]
    assert bool(local) == (cfg.workers >= usable_cores())
    assert all(s3_server.secret_key not in w for w in r.warnings)


def test_s3fs_ranged_reads_land_in_the_callers_buffer(s3_server, s3_prefix):
    """s3fs's cat_into streams the body into the caller's buffer: the exact range, a short
    count where the object ends first, and S3's missing key as FileNotFoundError."""
    b = open_backend(s3_prefix, endpoint_url=s3_server.endpoint_url, s3_client="s3fs",
                     storage_options={"key": s3_server.access_key, "secret": s3_server.secret_key})
    data = np.random.default_rng(3).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    b.fs.pipe_file(b.path("obj"), data)
    assert not b.zero_copy_reads
    out = bytearray(300_000)
    assert b.cat_into("obj", 1000, 250_000, out) == 249_000
    assert bytes(out[:249_000]) == data[1000:250_000]
    assert b.cat_into("obj", 200_000, 400_000, out) == 100_000
    assert bytes(out[:100_000]) == data[200_000:]
    with pytest.raises(FileNotFoundError):
        b.cat_into("missing", 0, 10, out)


def test_cli_plan_s3_reads_from_probe_results(tmp_path, capsys):
    import json

    from iobench.cli import main
    from iobench.results import Results
    from iobench.units import parse_size

    pts = _pts({(4 * MiB, 1): 300, (4 * MiB, 4): 760, (8 * MiB, 1): 420, (8 * MiB, 4): 780, (8 * MiB, 8): 800})
    # shaped as `iobench probe s3 URL --json` writes it (one tier named "object")
    src = Results(command="probe", metrics={"tiers": {"object": {"s3": {"points": pts}}}}).write(tmp_path / "probe.json")
    out = tmp_path / "plan.json"
    assert main(["plan", "s3-reads", "--from", str(src), "--set", "shard_bytes=8MiB", "--set", "workers=2",
                 "--json", str(out)]) == 0
    p = json.loads(out.read_text())["metrics"]["plan"]
    # block access buffers whole shards: one 8 MiB GET per shard, not two of 4 MiB; 4 in flight in all
    assert (p["outputs"]["s3_block_bytes"], p["outputs"]["s3_concurrency"]) == (8 * MiB, 2)
    assert p["inputs_from"]["points"] == "results:metrics.tiers.object.s3.points"
    rec = p["recommendation"]
    assert "--s3-block-size 8MiB --s3-concurrency 2 --read-ahead 1" in rec and rec in capsys.readouterr().out
    assert parse_size(rec.split("--s3-block-size ")[1].split()[0], "x") == 8 * MiB
    # map access: the smallest size near the best
    assert main(["plan", "s3-reads", "--from", str(src), "--set", "shard_bytes=8MiB", "--set", "access=map",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["metrics"]["plan"]["outputs"]["s3_block_bytes"] == 4 * MiB
    # no probe results: one line naming the input and the fix, exit 2
    capsys.readouterr()
    assert main(["plan", "s3-reads", "--set", "shard_bytes=8MiB"]) == 2
    assert "points" in capsys.readouterr().err
    assert main(["plan", "s3-reads", "--from", str(src), "--set", "shard_bytes=8MiB", "--set", "access=rand"]) == 2
