"""MLPerf Storage's training workloads, from the ``mlperf`` section of a shipped workload YAML.

The numbers are MLPerf Storage v2's (public mlcommons/storage ``configs/dlio/workload/*.yaml``):
sample sizes live in the ``gen`` section, batch, read threads, AU threshold, epochs and the
per-accelerator compute time per step here.  An accelerator whose step time the configs give
but this project was not given is absent, not guessed: ``--compute-s`` supplies it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import build, check_choice, load_workload, nearest
from ..errors import ConfigError

NAMES = ("unet3d", "resnet50", "cosmoflow")
ACCESS = ("map", "stream")


@dataclass(frozen=True)
class MlperfWorkload:
    name: str
    access: str                         # how MLPerf's loader reads it: map (PyTorch) | stream (TFRecord)
    batch_size: int
    read_threads: int                   # loader workers per accelerator
    au_threshold: float                 # a run passes when every accelerator's AU is at least this
    epochs: int = 5
    compute_s: dict = field(default_factory=dict)   # accelerator -> emulated compute seconds per step

    def __post_init__(self) -> None:
        check_choice("mlperf.access", self.access, ACCESS)
        if self.batch_size < 1 or self.read_threads < 1 or self.epochs < 1:
            raise ConfigError("mlperf.batch_size/read_threads/epochs", "must be at least 1", "fix the workload")
        if not 0 < self.au_threshold <= 1:
            raise ConfigError("mlperf.au_threshold", f"{self.au_threshold} is outside (0, 1]", "give e.g. 0.90")
        for k, v in self.compute_s.items():
            if not isinstance(v, (int, float)) or v <= 0:
                raise ConfigError(f"mlperf.compute_s.{k}", f"expected a positive number of seconds, got {v!r}",
                                  "give e.g. 0.323")

    def step_compute_s(self, accelerator: str, override: float | None = None) -> float:
        """Compute seconds per step for ``accelerator`` (``override`` wins)."""
        if override is not None:
            if override <= 0:
                raise ConfigError("--compute-s", f"must be positive, got {override}", "give e.g. 0.323")
            return float(override)
        if accelerator not in self.compute_s:
            known = sorted(self.compute_s)
            hint = (f"{self.name} knows {', '.join(known)}; give --compute-s SECONDS for {accelerator!r}"
                    if accelerator in ("a100", "h100", "b200") else nearest(accelerator, known))
            raise ConfigError("--accelerator", f"no compute time for {accelerator!r} on {self.name}", hint)
        return float(self.compute_s[accelerator])


def load_mlperf_workload(name: str) -> tuple[MlperfWorkload, dict]:
    """(the workload, its ``gen`` section) for a shipped name or a YAML file with an ``mlperf`` section."""
    data = load_workload(name)
    section = data.get("mlperf")
    if not isinstance(section, dict):
        raise ConfigError("--workload", f"{name!r} has no mlperf section", "use one of: " + ", ".join(NAMES))
    section = {k: v for k, v in section.items() if k != "name"}
    wl = build(MlperfWorkload, {"name": data["mlperf"].get("name", name), **section}, "mlperf")
    return wl, dict(data.get("gen") or {})
