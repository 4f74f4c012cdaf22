"""The loader's S3 request size and GETs in flight, chosen from an object store's probe curves.

``iobench probe s3`` measures GET bandwidth for each object size at each concurrency (the
``get`` points of its results).  A ranged GET of N bytes costs the store about what a GET
of an N-byte object does, so the same curve says how large the loader's ranged GETs
should be and how many it should keep in flight:

- request size: the smallest size whose best bandwidth is within ``near`` of the best of
  all sizes (larger requests only add latency per request and memory per worker), capped
  at the shard size (a ranged GET never spans two shards).  Where the loader buffers whole
  shards anyway (``whole_shards``: block access), the largest such size instead: memory and
  a block's latency are then the same whatever the request size, while every extra GET costs
  the store and the client a request's CPU, and a shard cut into parts is copied together
  out of a zero-copy client's buffers (obstore) where one GET would be parsed in place;
- concurrency: at that size, the fewest requests in flight within ``near`` of its best
  (more only add server load and memory for nothing), shared by the loader's workers;
- read-ahead: a worker's GETs come from the block it reads and the blocks it reads ahead,
  so it reads ahead enough blocks to have ``concurrency`` GETs to make (a shard read in one
  GET, with a concurrency of 2, needs one block ahead), and at least one, so that the
  collation of a block overlaps the next block's GETs.

The plan records the probe points it chose from, so a run says why it read as it did.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class S3ReadPlan:
    block_size: int          # bytes per ranged GET (load.s3_block_size)
    concurrency: int         # GETs in flight per worker (load.s3_concurrency)
    read_ahead: int          # blocks each worker reads ahead, enough to keep ``concurrency`` GETs in flight
    expected_bytes_per_s: float   # the probe's bandwidth at the chosen point (all workers together)
    why: str

    def to_dict(self) -> dict:
        return {"block_size": self.block_size, "concurrency": self.concurrency, "read_ahead": self.read_ahead,
                "expected_bytes_per_s": self.expected_bytes_per_s, "why": self.why}


def plan_s3_reads(points: list[dict], shard_bytes: int, workers: int = 1, near: float = 0.9,
                  whole_shards: bool = False) -> S3ReadPlan:
    """Request size and per-worker concurrency from the probe's GET points (see the module docstring).

    ``whole_shards``: the reader buffers whole shards (block access), so among the sizes near
    the best the one that reads a shard in the fewest GETs is taken, not the smallest."""
    gets = [p for p in points if p.get("op") == "get" and p.get("bytes_per_s")]
    if not gets:
        raise ConfigError("probe results", "hold no GET points", "run `iobench probe s3 URL --ops get` first")
    if shard_bytes <= 0 or workers < 1 or not 0 < near <= 1:
        raise ConfigError("plan_s3_reads", "shard_bytes and workers must be positive, near within (0, 1]",
                          "pass the manifest's largest shard, the loader's W and e.g. near=0.9")
    by_size: dict[int, list[dict]] = {}
    for p in gets:
        by_size.setdefault(int(p["object_size"]), []).append(p)
    fitting = {s: ps for s, ps in by_size.items() if s <= shard_bytes} or \
        {min(by_size): by_size[min(by_size)]}   # every probed size is above the shard: the smallest
    best_of = {s: max(p["bytes_per_s"] for p in ps) for s, ps in fitting.items()}
    top = max(best_of.values())
    near_top = [s for s, b in best_of.items() if b >= near * top]
    # Whole shards buffered (block access, embedded server, W=2 on 2 cores, obstore, 5 alternating
    # rounds): 8 MiB shards read in one GET each ran 1.20-1.52x (median 1.31x) the rate of two 4 MiB
    # GETs (server CPU 0.72-0.87 vs 0.94-1.22 s per 512 MiB), and the smallest-size rule took 4 MiB
    # whenever the probe put it within 10% of 8 MiB.
    size = max(near_top) if whole_shards else min(near_top)
    at = sorted(fitting[size], key=lambda p: p["concurrency"])
    best = max(p["bytes_per_s"] for p in at)
    pick = next(p for p in at if p["bytes_per_s"] >= near * best)
    total = int(pick["concurrency"])
    per_worker = max(1, -(-total // workers))
    block = min(size, shard_bytes)
    gets_per_block = max(1, round(shard_bytes / block))   # at least one shard per block (iobench.loader.source.ranged_gets)
    read_ahead = max(1, -(-per_worker // gets_per_block) - 1)
    why = (f"probe GETs: {_mib(size)} objects reach {best_of[size] / 2**20:.0f} MiB/s "
           f"(best size {top / 2**20:.0f} MiB/s; sizes up to the {_mib(shard_bytes)} shard"
           + ("; whole shards are buffered, so the largest size near the best" if whole_shards else "") + "); "
           f"{total} in flight reach {pick['bytes_per_s'] / 2**20:.0f} of {best / 2**20:.0f} MiB/s, "
           f"so {per_worker} per worker x {workers}, {read_ahead} block(s) read ahead")
    return S3ReadPlan(block_size=block, concurrency=per_worker, read_ahead=read_ahead,
                      expected_bytes_per_s=float(pick["bytes_per_s"]), why=why)


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"
