"""``--access memmap``: token rows sliced from memory-mapped shards, as nanoGPT's ``get_batch``
(``np.memmap`` of ``train.bin``, random windows stacked into a batch) and Megatron's
``GPTDataset`` (an ``np.memmap`` of the ``.bin``, shuffled sample windows) read their data.

No syscall per sample: each shard is mapped once (``mmap``, read-only, no populate) per process
that reads it — the consumer with ``--workers 0``, else each worker — and a batch is one gather
of its rows from the mappings straight into the batch's slot.  The I/O is what the kernel does
behind the gather: a major page fault per missing page, plus the read-around the kernel adds to
each (``read_ahead_kb``).  So the bytes the loader asked for (rows x row bytes, counted as
``bytes_read``) and the bytes the device read (``device_io``, ``iobench.blockdev``) differ; their
ratio is the read amplification the results report.  A batch's ``requests`` are the major page
faults its gather took (``getrusage(RUSAGE_THREAD)``); its storage time is the whole gather
(copying from a mapping and faulting it in are one act).

Formats whose samples are not fixed-size rows but have byte ranges (Megatron ``.bin`` with
GPTDataset's ``seq_len + 1``-token windows, npy, raw images) are sliced too: each sample is a
view of the mapping (``read_range``: no syscall, no copy until the batch is collated), counted
one request per sample, the faults in the source's ``major_page_faults``.

The order is map's (``sampler.order_of``): every sample exactly once per epoch.  Only plain local
files with per-sample byte ranges can be mapped; anything else is refused before any work.
"""

from __future__ import annotations

import os
import resource
from collections import OrderedDict
from contextlib import suppress

import numpy as np

from ..errors import ConfigError, IntegrityError
from ..io.inputs import open_regular
from ..metrics import now_ns
from .source import BackendSource, LocalFileSource, ShardSource, gather_rows, map_shard

# Mappings kept open per process (LRU): each is address space only, but the kernel caps a
# process's mappings (vm.max_map_count, 65530 by default).
_MAX_MAPS = 1024


def check_memmap(cfg, backend, manifest, source) -> None:
    """Refuse, before any work, a load ``--access memmap`` cannot do (field-and-fix errors)."""

    if not backend.is_local:
        raise ConfigError("--access", f"memmap maps local files; {backend.protocol}:// has no mapping",
                          "use --access map (one ranged read per sample) for this dataset")
    if source is not None and not isinstance(source, BackendSource):
        raise ConfigError("--access", "memmap maps the dataset's own files, not a tiers source",
                          "drop --tiers, or use --access map")
    for flag, on in (("--emulate", cfg.emulate not in ("", "none")), ("--odirect", cfg.odirect),
                     ("--verify-checksums", cfg.verify_checksums),
                     ("--error-rate/--timeout-rate", bool(cfg.error_rate or cfg.timeout_rate))):
        if on:
            raise ConfigError(flag, "cannot apply to --access memmap: page faults read the mapping, "
                                    "not the storage wrappers or O_DIRECT", f"drop {flag}, or use --access map")
    # samples without byte ranges (a zstd shard) are refused by map's own check (core._check_map_ranges)


class MappedSource(ShardSource):
    """A LocalFileSource whose samples are read from mappings of the shards.

    ``read_records`` (fixed-size rows: one gather per batch) and ``read_range`` (any sample with a byte
    range: a view) are the reads the map producer makes (worker ``_produce_map``); everything else
    (whole shards, opening, counters, description) is the inner source's.
    """

    supports_record_reads = True
    supports_range_reads = True    # a sample is a slice of the mapping: no request, no copy

    def __init__(self, inner: LocalFileSource) -> None:
        self.inner = inner
        self._maps: OrderedDict = OrderedDict()
        self._scratch: np.ndarray | None = None
        self.faults = 0

    # -- the inner source's lifecycle and counters ---------------------------------------------

    def open(self, worker_id: int = 0) -> None:
        self.inner.open(worker_id=worker_id)
        self._maps.clear()

    def read_shard(self, shard):
        return self.inner.read_shard(shard)

    def stats(self) -> dict:
        out = self.inner.stats()
        if out:
            out["major_page_faults"] = self.faults
        return out

    def close(self) -> None:
        self._scratch = None
        while self._maps:
            _unmap_oldest(self._maps)
        self.inner.close()

    def describe(self) -> dict:
        return self.inner.describe() | {"kind": "memmap", "mapping": "mmap(MAP_SHARED, PROT_READ), no populate; "
                                                                      "page faults and read-around are the I/O"}

    # -- reads -----------------------------------------------------------------------------------

    def _rows(self, shard, first: int, length: int) -> np.ndarray:
        """``shard``'s records as a (records, length) uint8 view of its mapping."""
        count = (shard.bytes - first) // length
        return self._mapped(shard)[first:first + count * length].reshape(count, length)

    def read_range(self, shard, start: int, length: int) -> memoryview:
        """Bytes ``start:start+length`` of the shard as a view of its mapping (faulted in when read)."""
        f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt
        t0 = now_ns()
        view = self._mapped(shard)[start:start + length].data   # a memoryview of the mapping
        if len(view) != length:
            raise IntegrityError(f"{shard.path}: offset {start}: {length} bytes asked for, the shard holds "
                                 f"{shard.bytes}")
        self.inner.backend.record("read", now_ns() - t0, nread=length)
        self.faults += resource.getrusage(resource.RUSAGE_THREAD).ru_majflt - f0
        return view

    def _mapped(self, shard) -> np.ndarray:
        """``shard``'s bytes as a uint8 view of its mapping (mapped once per process, LRU)."""
        hit = self._maps.pop(shard.path, None)
        if hit is None:
            if len(self._maps) >= _MAX_MAPS:
                _unmap_oldest(self._maps)
            path = self.inner.backend.base.local_path(shard.path)
            fd = open_regular(path, "shard", "replace it with the shard file")   # never blocks on a FIFO
            try:
                m = map_shard(fd, shard)
            finally:
                os.close(fd)   # the mapping keeps the file
            hit = (np.frombuffer(m, dtype=np.uint8), m)
        self._maps[shard.path] = hit   # most recently used last
        return hit[0]

    def read_records(self, shards, shard_of: np.ndarray, local: np.ndarray, first: int, length: int,
                     out: np.ndarray, inflight: int = 1) -> int:
        """Sample i = record ``local[i]`` of ``shards[shard_of[i]]``, into ``out[i]``; returns the gather's
        major page faults (the requests it made of the device).  The caller checked the bounds."""
        n = len(local)
        if n == 0:
            return 0
        f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt
        t0 = now_ns()
        s0 = int(shard_of[0])
        if (shard_of == s0).all():
            # mode="clip": no temporary (bounds checked by the caller)
            np.take(self._rows(shards[s0], first, length), local, axis=0, out=out, mode="clip")
        else:   # the two gathers read_records makes on memory://
            self._scratch = gather_rows(lambda s: self._rows(shards[s], first, length), shard_of, local, out,
                                        self._scratch)
        dt = now_ns() - t0
        faults = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt - f0
        self.faults += faults
        # each record's share of the gather, as one "read" (what read_latency_s shows for memmap)
        self.inner.backend.record_many("read", np.full(n, dt // n, dtype=np.int64), nread=n * length)
        return faults


def _unmap_oldest(maps: OrderedDict) -> None:
    """Close the least recently used mapping; one a batch still refers to goes with its last view."""
    _path, (view, m) = maps.popitem(last=False)
    del view   # the mapping's own view: only a batch's reference may keep it open now
    with suppress(BufferError):   # a batch still refers to it
        m.close()
