"""Peer loaders for benchmarks/bench_fidelity.py; runs in the benchmark's own venv (torch, webdataset).

    PYTHON fidelity_peers.py '{"kind": "torch-map" | "wds-stream", ...}'

Prints one JSON line: per-step ``wait_s``, ``compute_s``, ``t_s`` (step starts), samples,
bytes and wall time.  The consumer loop is the one iobench's loader uses: wait for the next
batch (stall), then sleep the step's compute.  No iobench import: the peers see the same
bytes (paths from the manifest, resolved by the caller) and nothing else of ours.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import sys
import time

import numpy as np


class TokenShards:
    """Map-style Dataset over raw token shards: sample i = one ranged read (os.pread) of seq_len tokens."""

    HEADER = 64

    def __init__(self, shards: list[dict], sample_bytes: int, dtype: str) -> None:
        self.paths = [s["path"] for s in shards]
        self.first = [s["first_sample"] for s in shards]
        self.count = sum(s["samples"] for s in shards)
        self.sample_bytes, self.dtype = sample_bytes, dtype
        self.fds: dict[int, int] = {}

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        import torch

        s = bisect.bisect_right(self.first, i) - 1
        fd = self.fds.get(s)
        if fd is None:  # opened lazily in each worker (fds do not cross the fork usefully)
            fd = self.fds[s] = os.open(self.paths[s], os.O_RDONLY)
        off = self.HEADER + (i - self.first[s]) * self.sample_bytes
        b = os.pread(fd, self.sample_bytes, off)
        return torch.from_numpy(np.frombuffer(b, dtype=self.dtype).copy())


def cgroup_read_bytes(spec: dict) -> int | None:
    """The cgroup's bytes read from the device (v1 blkio / v2 io.stat), as iobench.blockdev reads them."""
    cg = spec.get("cgroup")
    if not cg:
        return None
    kind, path, devno = cg
    try:
        if kind == "v1":
            with open(os.path.join(path, "blkio.throttle.io_service_bytes")) as f:
                return sum(int(p[2]) for p in (ln.split() for ln in f) if len(p) == 3 and p[0] == devno
                           and p[1] == "Read")
        with open(os.path.join(path, "io.stat")) as f:
            for ln in f:
                p = ln.split()
                if p and p[0] == devno:
                    return int(dict(kv.split("=", 1) for kv in p[1:]).get("rbytes", 0))
    except OSError:
        return None
    return 0


def consume(it, spec: dict, nbytes) -> dict:
    """The consumer loop, then the DataLoader's workers stopped: they keep prefetching after the last
    step, and the device counter is read only once nothing of the peer reads any more."""
    compute_s = spec["compute_s"]
    out: dict = {"wait_s": [], "compute_s": [], "t_s": [], "samples": 0, "bytes": 0}
    t_start = time.perf_counter()
    for _step in range(spec["steps"]):
        t0 = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        t1 = time.perf_counter()
        n, b = nbytes(batch)
        out["samples"] += n
        out["bytes"] += b
        if compute_s:
            time.sleep(compute_s)
        for k, v in (("wait_s", t1 - t0), ("compute_s", time.perf_counter() - t1), ("t_s", t0 - t_start)):
            out[k].append(v)
    out["wall_s"] = time.perf_counter() - t_start
    # the device counter as the last step ends, before the workers stop (what they read past it: the rest)
    out["device_bytes_at_last_step"] = cgroup_read_bytes(spec)
    stop = getattr(it, "_shutdown_workers", None)
    if stop is not None:
        stop()
    return out


def torch_map(spec: dict) -> dict:
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    ds = TokenShards(spec["shards"], spec["sample_bytes"], spec["dtype"])
    # The caller's sample order where given (iobench's, for the same seed): the same samples in the same
    # batches, and exactly ``steps`` batches of them -- the DataLoader has nothing to prefetch past the
    # last step, so its device bytes are the steps' bytes, as iobench's are.
    sampler = spec["indices"] if spec.get("indices") is not None else \
        RandomSampler(ds, generator=torch.Generator().manual_seed(spec.get("seed", 0)))
    dl = DataLoader(ds, batch_size=spec["batch"], sampler=sampler,
                    num_workers=spec["workers"], prefetch_factor=spec["prefetch"], persistent_workers=False)
    return consume(iter(dl), spec, lambda b: (len(b), b.numel() * b.element_size()))


def _wds(spec: dict):
    import webdataset as wds

    ds = (wds.WebDataset(spec["urls"], shardshuffle=False, workersplitter=wds.split_by_worker,
                         nodesplitter=None, empty_check=False)
          .shuffle(spec.get("shuffle_buffer", 0), rng=random.Random(spec.get("seed", 0)))
          .to_tuple(spec.get("key", "npy"))
          .batched(spec["batch"], partial=True, collation_fn=lambda xs: [x[0] for x in xs]))
    if spec["workers"] == 0:
        return iter(ds)
    return iter(wds.WebLoader(ds, batch_size=None, num_workers=spec["workers"], prefetch_factor=spec["prefetch"]))


def wds_stream(spec: dict) -> dict:
    return consume(_wds(spec), spec, lambda b: (len(b), sum(len(x) for x in b)))


def main() -> None:
    spec = json.loads(sys.argv[1])
    t0 = time.perf_counter()
    fn = {"torch-map": torch_map, "wds-stream": wds_stream}[spec["kind"]]
    if spec["kind"] == "torch-map":
        import torch  # noqa: F401 — imported before the device counter starts: its libraries are not the data
    before = cgroup_read_bytes(spec)
    out = fn(spec)
    after = cgroup_read_bytes(spec)
    out["device_bytes_read"] = after - before if None not in (before, after) else None
    last = out.pop("device_bytes_at_last_step", None)
    out["device_bytes_by_last_step"] = last - before if None not in (before, last) else None
    out["process_s"] = time.perf_counter() - t0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
