"""What `iobench run`'s stages hand to each other, typed.

Each stage reads the fields earlier stages filled and fills its own; nothing else passes
between stages.  Adding a field here is how a new stage publishes something for a later
one (say which stage fills it and which reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GeneratedDataset:
    """One dataset the generate stage wrote and verified."""

    name: str                           # e.g. "raw-tokens"
    format: str                         # raw | parquet | tfrecord | tar
    modality: str                       # tokens | images
    url: str
    location: str                       # "local" | "s3"
    storage_options: dict | None = field(default=None, repr=False)   # credentials (s3 only): never logged
    endpoint_url: str | None = None

    @property
    def key(self) -> str:
        return f"{self.location}/{self.name}"


@dataclass
class SuiteState:
    datasets: list[GeneratedDataset] = field(default_factory=list)   # filled by generate; read by stage, load
    tiers_file: str | None = None       # filled by stage (0600, holds credentials); read by load
    tiers_dataset: str | None = None    # the URL of the dataset stage staged; read by load
    stage_metrics: dict[str, dict] = field(default_factory=dict)     # filled by the runner; read by report
