"""MLPerf Storage's run rules, as far as iobench applies them.

- Dataset size: at least 5x the aggregate host memory of the client nodes, so the page
  cache cannot hold it (``datasize``).  A smaller dataset may still be measured with a cold
  cache on every epoch, but the result is marked "not rule-compliant".
- 5 epochs by default; the first step is excluded from AU; AU per accelerator, and the run
  passes when the minimum is at least the workload's threshold; 5 runs and their spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MEMORY_MULTIPLE = 5          # dataset >= 5x the clients' aggregate host memory
DEFAULT_RUNS = 5


@dataclass(frozen=True)
class DataSize:
    files: int
    samples: int
    bytes: int
    required_bytes: int            # 5x the aggregate client memory
    samples_per_file: int
    sample_bytes: int              # mean bytes per sample (unscaled unless the workload was scaled)


def datasize(client_memory_bytes: int, nodes: int, accelerators: int, samples_per_file: int,
             sample_bytes: int) -> DataSize:
    """Files needed so the dataset is at least 5x the clients' memory, rounded up to a multiple of
    the accelerators in the run (every accelerator reads an equal share of whole files)."""
    required = MEMORY_MULTIPLE * client_memory_bytes * nodes
    file_bytes = samples_per_file * sample_bytes
    files = math.ceil(required / file_bytes)
    share = max(1, accelerators * nodes)
    files = math.ceil(files / share) * share
    return DataSize(files, files * samples_per_file, files * file_bytes, required, samples_per_file, sample_bytes)


@dataclass(frozen=True)
class Compliance:
    compliant: bool
    dataset_bytes: int
    required_bytes: int
    cache: str                     # what the run did about the page cache
    notes: tuple[str, ...]


def compliance(dataset_bytes: int, client_memory_bytes: int, nodes: int, cold_every_epoch: bool,
               scale: float = 1.0) -> Compliance:
    required = MEMORY_MULTIPLE * client_memory_bytes * nodes
    notes = []
    ok = dataset_bytes >= required
    if not ok:
        notes.append(f"dataset {dataset_bytes} B is under 5x the clients' memory ({required} B): not rule-compliant")
        notes.append("page cache dropped before every epoch (cold)" if cold_every_epoch else
                     "page cache NOT dropped: reads may come from memory")
    if scale != 1.0:
        ok = False
        notes.append(f"samples scaled by {scale} (gen --scale): not rule-compliant")
    return Compliance(ok, dataset_bytes, required, "cold every epoch" if cold_every_epoch else "as-is", tuple(notes))
