"""One file I/O job (pattern, request size, queue depth, O_DIRECT) and what an engine measured."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..metrics import LatencyHistogram

PATTERNS = ("read", "write", "randread", "randwrite")


@dataclass(frozen=True)
class Job:
    path: str                  # the probe's own test file (already laid out, file_size bytes)
    file_size: int
    rw: str                    # one of PATTERNS
    bs: int                    # request size, bytes
    qd: int                    # requests in flight
    direct: bool               # O_DIRECT (page cache bypassed)
    runtime_s: float
    seed: int = 0
    # How queue depth is produced: "async" = one thread with qd requests in flight (fio
    # libaio); "threads" = qd threads each with one synchronous request (fio psync
    # numjobs=qd, and the built-in engine).  Sequential jobs split the file into qd regions.
    qd_model: str = "async"

    @property
    def is_write(self) -> bool:
        return "write" in self.rw

    @property
    def is_random(self) -> bool:
        return self.rw.startswith("rand")

    def regions(self) -> list[tuple[int, int]]:
        """[start, end) of each of the qd streams, aligned to bs."""
        blocks = max(1, self.file_size // self.bs)
        per = max(1, blocks // self.qd)
        out = []
        for i in range(self.qd):
            start = (i * per) % blocks
            out.append((start * self.bs, min(blocks, start + per) * self.bs))
        return out


@dataclass
class JobResult:
    engine: str                # "fio" or "python"
    engine_detail: str         # e.g. "fio-3.33 ioengine=libaio" or "python threads (os.preadv)"
    bytes: int
    seconds: float
    ios: int
    latency: LatencyHistogram | None = None    # per-request latency (built-in engine)
    latency_summary: dict | None = None        # HDR-style summary in seconds
    latency_cdf: list = field(default_factory=list)   # [[seconds, fraction], ...]
    job_file: str | None = None

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def iops(self) -> float:
        return self.ios / self.seconds if self.seconds > 0 else 0.0
