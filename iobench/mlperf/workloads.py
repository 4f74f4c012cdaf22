"""MLPerf Storage's training workloads: one table, each value with the file it came from.

Sources (public repositories, read for this table):

- ``mlcommons/storage`` ``configs/dlio/workload/{unet3d,resnet50,cosmoflow}_{a100,h100}.yaml`` — batch,
  read threads, step (``train.computation_time``), epochs, AU threshold (``metric.au``), record length,
  shuffles (``reader.file_shuffle`` / ``sample_shuffle`` / ``shuffle_size``) and unet3d's checkpoint
  (``workflow.checkpoint``, ``checkpoint.checkpoint_after_epoch``, ``model.model_size``).
- ``argonne-lcf/dlio_benchmark`` branch ``mlperf_storage_v2.0`` — what a key left out of a config
  means (``dlio_benchmark/utils/config.py``: ``sample_shuffle`` and ``file_shuffle`` default OFF,
  ``shuffle_size`` 1024), the steps per epoch (``dlio_benchmark/main.py`` ``_train``: ``max_steps =
  floor(samples / batch / ranks)``: the remainder is dropped) and the barrier after every step (same
  function, "the barrier to simulate allreduce").

Only A100 and H100 step times exist (Submission_guidelines.md §4: "we include sleep times for NVIDIA
A100 and H100 GPUs"); another accelerator needs ``--compute-s`` and is then not rule-compliant.
A YAML file with an ``mlperf`` section (same keys as :class:`MlperfWorkload`) runs too, as an open
experiment: its values have no MLPerf source, so its runs are never rule-compliant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import build, check_choice, load_workload, nearest
from ..errors import ConfigError

NAMES = ("unet3d", "resnet50", "cosmoflow")
ACCESS = ("map", "stream")
ACCELERATORS = ("a100", "h100")

_CFG = "mlcommons/storage configs/dlio/workload/"
_DLIO = "argonne-lcf/dlio_benchmark@mlperf_storage_v2.0 "


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint written during training (unet3d): ``model_size`` bytes after epoch ``after_epoch``."""

    after_epoch: int
    model_bytes: int
    source: str


@dataclass(frozen=True)
class MlperfWorkload:
    name: str
    access: str                         # how MLPerf's loader reads it: map (PyTorch) | stream (TFRecord)
    batch_size: int
    read_threads: int                   # loader workers per accelerator
    au_threshold: float                 # a run passes when the mean AU over ranks and epochs is at least this
    record_bytes: float = 0.0           # dataset.record_length_bytes: DLIO's MB/s = samples/s x this / 2**20
    epochs: int = 5
    compute_s: dict = field(default_factory=dict)   # accelerator -> emulated compute seconds per step
    file_shuffle: bool = True
    sample_shuffle: bool = True
    shuffle_size: int = 0               # stream: the shuffle buffer (samples); 0 with sample_shuffle off
    drop_last: bool = True              # DLIO main.py _train: floor(samples / batch / ranks) steps per epoch
    checkpoint: Checkpoint | None = None
    sources: dict = field(default_factory=dict)     # field -> where its value came from
    mlperf_defined: bool = False        # False: a user's YAML, an open experiment

    def __post_init__(self) -> None:
        check_choice("mlperf.access", self.access, ACCESS)
        if self.batch_size < 1 or self.read_threads < 1 or self.epochs < 1 or self.shuffle_size < 0:
            raise ConfigError("mlperf.batch_size/read_threads/epochs", "must be at least 1 (shuffle_size >= 0)",
                              "fix the workload")
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
            hint = (f"{self.name} has step times for {', '.join(known)} (MLPerf Storage v2 covers A100 and H100); "
                    f"give --compute-s SECONDS for {accelerator!r}" if accelerator.isalnum() and len(accelerator) < 8
                    else nearest(accelerator, known))
            raise ConfigError("--accelerator", f"no compute time for {accelerator!r} on {self.name}", hint)
        return float(self.compute_s[accelerator])

    def loader_shuffle(self) -> tuple[bool, int]:
        """(shuffle, shuffle_buffer) for iobench's loader: shard order and samples, as the config says."""
        if self.access == "map":
            return self.file_shuffle or self.sample_shuffle, 0
        return self.file_shuffle or self.sample_shuffle, self.shuffle_size if self.sample_shuffle else 0

    def source(self, key: str) -> str:
        return self.sources.get(key, "")


def _sources(cfg: str, extra: dict | None = None) -> dict:
    base = {"batch_size": f"{cfg} reader.batch_size", "read_threads": f"{cfg} reader.read_threads",
            "au_threshold": f"{cfg} metric.au", "epochs": f"{cfg} train.epochs",
            "compute_s": f"{cfg.replace('_a100', '_{a100,h100}')} train.computation_time",
            "record_bytes": f"{cfg} dataset.record_length_bytes",
            "drop_last": _DLIO + "dlio_benchmark/main.py _train (max_steps = floor(samples / batch / ranks))",
            "step_barrier": _DLIO + "dlio_benchmark/main.py _train (comm.barrier() after every step)",
            "au": _DLIO + "dlio_benchmark/utils/statscounter.py end_run (train_au_mean_percentage vs metric.au)"}
    base.update(extra or {})
    return base


# The table.  Every number below is in the file its ``sources`` entry names.
TABLE: dict[str, MlperfWorkload] = {
    "unet3d": MlperfWorkload(
        name="unet3d", access="map", batch_size=7, read_threads=4, au_threshold=0.90, record_bytes=146600628,
        epochs=5, compute_s={"a100": 0.636, "h100": 0.323}, file_shuffle=True, sample_shuffle=True,
        checkpoint=Checkpoint(after_epoch=5, model_bytes=499153191,
                              source=f"{_CFG}unet3d_h100.yaml workflow.checkpoint: True, "
                                     "checkpoint.checkpoint_after_epoch: 5, model.model_size: 499153191"),
        sources=_sources(f"{_CFG}unet3d_a100.yaml", {
            "access": f"{_CFG}unet3d_h100.yaml reader.data_loader: pytorch (map-style)",
            "shuffle": f"{_CFG}unet3d_h100.yaml reader.file_shuffle: seed, sample_shuffle: seed"}),
        mlperf_defined=True),
    "resnet50": MlperfWorkload(
        name="resnet50", access="stream", batch_size=400, read_threads=8, au_threshold=0.90,
        record_bytes=114660.07, epochs=5, compute_s={"a100": 0.435, "h100": 0.224},
        file_shuffle=False, sample_shuffle=False, shuffle_size=0,
        sources=_sources(f"{_CFG}resnet50_a100.yaml", {
            "access": f"{_CFG}resnet50_h100.yaml reader.data_loader: tensorflow (TFRecord stream)",
            "shuffle": f"{_CFG}resnet50_h100.yaml sets no shuffle; {_DLIO}dlio_benchmark/utils/config.py "
                       "file_shuffle and sample_shuffle default OFF"}),
        mlperf_defined=True),
    "cosmoflow": MlperfWorkload(
        name="cosmoflow", access="stream", batch_size=1, read_threads=4, au_threshold=0.70, record_bytes=2828486,
        epochs=5, compute_s={"a100": 0.00551, "h100": 0.0035}, file_shuffle=True, sample_shuffle=True,
        shuffle_size=2,
        sources=_sources(f"{_CFG}cosmoflow_a100.yaml", {
            "access": f"{_CFG}cosmoflow_h100.yaml reader.data_loader: tensorflow (TFRecord stream)",
            "shuffle": f"{_CFG}cosmoflow_h100.yaml reader.file_shuffle: seed, sample_shuffle: seed, "
                       "shuffle_size: 2"}),
        mlperf_defined=True),
}


def load_mlperf_workload(name: str) -> tuple[MlperfWorkload, dict]:
    """(the workload, its ``gen`` section): a shipped name from :data:`TABLE`, or a YAML file with an
    ``mlperf`` section (an open experiment)."""
    data = load_workload(name)
    gen = dict(data.get("gen") or {})
    if name in TABLE:
        return TABLE[name], gen
    section = data.get("mlperf")
    if not isinstance(section, dict):
        raise ConfigError("--workload", f"{name!r} has no mlperf section", "use one of: " + ", ".join(NAMES))
    section = {k: v for k, v in section.items() if k not in ("name", "checkpoint", "sources", "mlperf_defined")}
    wl = build(MlperfWorkload, {"name": data["mlperf"].get("name", name), **section}, "mlperf")
    return wl, gen
