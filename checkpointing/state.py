"""Training-state sizing: presets, precision recipes, parallelism → per-rank shards.

Everything here is a pure function of a frozen ``StateSpec``, so the planner can size
checkpoints without touching storage:

    spec = preset("llama3-70b")                   # MLPerf Storage v2 parallelism
    checkpoint_bytes(spec)                         # whole checkpoint, bytes
    rank_shards(spec)                              # list of Shard boxes, one list per rank

A shard is a hyper-rectangle of one tensor component (weights, master copy, Adam m/v) with
its global shape and offsets, so a checkpoint written with one layout can be read back
with another (see ``reshard.py``).  ``scale`` shrinks every tensor while keeping the
layout, for small disks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from iobench.config import nearest
from iobench.errors import ConfigError

# numpy has no bfloat16; bf16 tensors are stored as their raw 16-bit patterns.
DTYPES = {"bf16": ("uint16", 2), "fp16": ("float16", 2), "fp32": ("float32", 4)}


@dataclass(frozen=True)
class Component:
    name: str         # weights | master | adam_m | adam_v
    dtype: str        # bf16 | fp16 | fp32
    optimizer: bool   # sharded by ZeRO stage >= 1 (weights only by stage 3)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]


RECIPES: dict[str, tuple[Component, ...]] = {
    # bf16 weights + fp32 master + Adam m, v in fp32: 14 B/param (seed's Qwen3-8B example)
    "bf16-mixed-adam": (Component("weights", "bf16", False), Component("master", "fp32", True),
                        Component("adam_m", "fp32", True), Component("adam_v", "fp32", True)),
    # MLPerf Storage: fp16 model + 12 B/param optimizer (fp32 master, m, v): 14 B/param
    "fp16-mixed-adam": (Component("weights", "fp16", False), Component("master", "fp32", True),
                        Component("adam_m", "fp32", True), Component("adam_v", "fp32", True)),
    # fp16 weights + Adam m, v, no master copy: 10 B/param (seed's 175B example)
    "fp16-adam": (Component("weights", "fp16", False), Component("adam_m", "fp32", True),
                  Component("adam_v", "fp32", True)),
    # fp32 weights + Adam: 12 B/param
    "fp32-adam": (Component("weights", "fp32", False), Component("adam_m", "fp32", True),
                  Component("adam_v", "fp32", True)),
    # weights only (inference / export)
    "bf16-weights": (Component("weights", "bf16", False),),
}


def bytes_per_param(recipe: str) -> int:
    return sum(c.itemsize for c in recipe_components(recipe))


def recipe_components(recipe: str) -> tuple[Component, ...]:
    if recipe not in RECIPES:
        raise ConfigError("recipe", f"unknown precision recipe {recipe!r}", nearest(recipe, RECIPES))
    return RECIPES[recipe]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    tp_dim: int | None = None   # dimension split by tensor parallelism; None = replicated
    stage: int = 0              # pipeline position: 0 = embedding, 1..L = layers, L+1 = head

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Architecture:
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int | None = None   # default hidden // heads
    qk_norm: bool = False         # Qwen3 normalises q and k per head
    tied_embeddings: bool = False


@dataclass(frozen=True)
class StateSpec:
    """What one training job holds: tensors, precision recipe and parallelism."""

    tensors: tuple[TensorSpec, ...]
    recipe: str = "bf16-mixed-adam"
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero_stage: int = 0
    name: str = "custom"
    scale: float = 1.0
    layers: int = 0              # number of pipeline-placed layers (stage L+1 is the head)

    def __post_init__(self):
        recipe_components(self.recipe)
        for f in ("tp", "pp", "dp"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f, f"must be a whole number >= 1, got {v!r}", "give e.g. 1, 2, 8")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError("zero_stage", f"must be 0, 1, 2 or 3, got {self.zero_stage!r}", "pick a ZeRO stage")
        if not (0 < self.scale <= 1):
            raise ConfigError("scale", f"must be in (0, 1], got {self.scale!r}", "give e.g. 0.001")
        if not self.tensors:
            raise ConfigError("params", "the state has no tensors", "give a parameter count above zero")

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def params(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def components(self) -> tuple[Component, ...]:
        return recipe_components(self.recipe)

    @property
    def bytes_per_param(self) -> int:
        return bytes_per_param(self.recipe)

    def with_parallelism(self, tp: int | None = None, pp: int | None = None, dp: int | None = None,
                         zero_stage: int | None = None) -> "StateSpec":
        return replace(self, tp=self.tp if tp is None else tp, pp=self.pp if pp is None else pp,
                       dp=self.dp if dp is None else dp,
                       zero_stage=self.zero_stage if zero_stage is None else zero_stage)

    def to_dict(self) -> dict:
        return {"name": self.name, "recipe": self.recipe, "tp": self.tp, "pp": self.pp, "dp": self.dp,
                "zero_stage": self.zero_stage, "scale": self.scale, "layers": self.layers,
                "tensors": [[t.name, list(t.shape), t.tp_dim, t.stage] for t in self.tensors]}

    @classmethod
    def from_dict(cls, d: dict) -> "StateSpec":
        tensors = tuple(TensorSpec(n, tuple(int(x) for x in s), tp_dim, int(st)) for n, s, tp_dim, st in d["tensors"])
        return cls(tensors=tensors, recipe=d["recipe"], tp=int(d["tp"]), pp=int(d["pp"]), dp=int(d["dp"]),
                   zero_stage=int(d["zero_stage"]), name=d.get("name", "custom"), scale=float(d.get("scale", 1.0)),
                   layers=int(d.get("layers", 0)))


def transformer_tensors(a: Architecture) -> tuple[TensorSpec, ...]:
    """A decoder-only transformer with grouped-query attention and a gated MLP."""
    hd = a.head_dim or a.hidden // a.heads
    q, kv = a.heads * hd, a.kv_heads * hd
    out = [TensorSpec("embed", (a.vocab, a.hidden), 0, 0)]
    for i in range(1, a.layers + 1):
        p = f"layers.{i - 1}."
        out += [TensorSpec(p + "attn_norm", (a.hidden,), None, i),
                TensorSpec(p + "attn_qkv", (q + 2 * kv, a.hidden), 0, i),
                TensorSpec(p + "attn_out", (a.hidden, q), 1, i)]
        if a.qk_norm:
            out += [TensorSpec(p + "q_norm", (hd,), None, i), TensorSpec(p + "k_norm", (hd,), None, i)]
        out += [TensorSpec(p + "mlp_norm", (a.hidden,), None, i),
                TensorSpec(p + "mlp_gate_up", (2 * a.ffn, a.hidden), 0, i),
                TensorSpec(p + "mlp_down", (a.hidden, a.ffn), 1, i)]
    out.append(TensorSpec("final_norm", (a.hidden,), None, a.layers + 1))
    if not a.tied_embeddings:
        out.append(TensorSpec("lm_head", (a.vocab, a.hidden), 0, a.layers + 1))
    return tuple(out)


def flat_tensors(params: int, layers: int = 32) -> tuple[TensorSpec, ...]:
    """A layout of exactly ``params`` elements: ``layers`` row-split matrices plus a tail vector."""
    if params < 1:
        raise ConfigError("--params", f"must be at least 1, got {params}", "give a parameter count, e.g. 8e9")
    width = 1 << max(0, min(14, int(math.log2(max(1.0, math.sqrt(params / layers))))))
    rows = params // width
    n = max(1, min(layers, rows)) if rows else 0
    out = []
    for i in range(n):
        r = rows // n + (1 if i < rows % n else 0)
        out.append(TensorSpec(f"layers.{i}.weight", (r, width), 0, i + 1))
    tail = params - rows * width
    if tail:
        out.append(TensorSpec("tail", (tail,), None, n + 1))
    return tuple(out)


@dataclass(frozen=True)
class Preset:
    arch: Architecture | None
    params: int | None
    recipe: str
    tp: int
    pp: int
    dp: int
    zero_stage: int
    note: str = ""
    mlperf_bytes: int | None = field(default=None)   # MLPerf Storage v2 table, where it gives one


# MLPerf reports GiB labelled "GB" and thousands of GiB labelled "TB".
_GiB = 1024**3

PRESETS: dict[str, Preset] = {
    # MLPerf Storage v2.0 checkpointing (Table 2): TP×PP×DP, ZeRO stage; fp16 model + 12 B/param optimizer.
    "llama3-8b": Preset(Architecture(4096, 32, 14336, 32, 8, 128256), None, "fp16-mixed-adam", 1, 1, 8, 3,
                        "MLPerf Storage v2: 1×1×8, ZeRO 3", 105 * _GiB),
    "llama3-70b": Preset(Architecture(8192, 80, 28672, 128, 8, 128256), None, "fp16-mixed-adam", 8, 1, 8, 3,
                         "MLPerf Storage v2: 8×1×8, ZeRO 3", 912 * _GiB),
    "llama3-405b": Preset(Architecture(16384, 126, 53248, 128, 8, 128256), None, "fp16-mixed-adam", 8, 32, 2, 1,
                          "MLPerf Storage v2: 8×32×2, ZeRO 1", 5290 * _GiB),
    "llama3-1t": Preset(Architecture(25872, 128, 98304, 192, 32, 128256, head_dim=134), None, "fp16-mixed-adam",
                        8, 64, 2, 1, "MLPerf Storage v2: 8×64×2, ZeRO 1", 18000 * _GiB),
    # Seed ch. 4: Qwen3-8B, 8,190,735,360 parameters, 14 B/param → 114,670,295,040 bytes.
    "qwen3-8b": Preset(Architecture(4096, 36, 12288, 32, 8, 151936, head_dim=128, qk_norm=True), None,
                       "bf16-mixed-adam", 1, 1, 8, 3, "seed: 14 B/param ≈ 115 GB"),
    # Seed ch. 4: 175B, fp16 weights + Adam m, v = 10 B/param → 1,750 GB; 256 nodes with ZeRO-3.
    "gpt-175b": Preset(None, 175_000_000_000, "fp16-adam", 1, 1, 256, 3, "seed: 1,750 GB over 256 nodes"),
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def preset(name: str, *, recipe: str | None = None, tp: int | None = None, pp: int | None = None,
           dp: int | None = None, zero_stage: int | None = None, scale: float = 1.0) -> StateSpec:
    """The named model with its usual parallelism; any argument given overrides the preset."""
    if name not in PRESETS:
        raise ConfigError("--preset", f"unknown preset {name!r}", nearest(name, PRESETS))
    p = PRESETS[name]
    tensors = transformer_tensors(p.arch) if p.arch else flat_tensors(p.params or 0)
    layers = p.arch.layers if p.arch else max(t.stage for t in tensors) - 1
    spec = StateSpec(tensors=tensors, recipe=recipe or p.recipe, tp=tp or p.tp, pp=pp or p.pp, dp=dp or p.dp,
                     zero_stage=p.zero_stage if zero_stage is None else zero_stage, name=name, layers=layers)
    return scaled(spec, scale)


def from_params(params: int, *, recipe: str = "bf16-mixed-adam", tp: int = 1, pp: int = 1, dp: int = 1,
                zero_stage: int = 0, scale: float = 1.0) -> StateSpec:
    tensors = flat_tensors(int(params))
    spec = StateSpec(tensors=tensors, recipe=recipe, tp=tp, pp=pp, dp=dp, zero_stage=zero_stage,
                     name=f"params-{int(params)}", layers=max(t.stage for t in tensors) - 1)
    return scaled(spec, scale)


def scaled(spec: StateSpec, scale: float) -> StateSpec:
    """Every tensor shrunk by about ``scale`` in bytes (each dimension by √scale), layout kept."""
    if scale == 1.0:
        return spec
    if not (0 < scale <= 1):
        raise ConfigError("--scale", f"must be in (0, 1], got {scale!r}", "give e.g. 0.001")
    f = math.sqrt(scale)
    out = []
    for t in spec.tensors:
        shape = []
        for d, n in enumerate(t.shape):
            floor = spec.tp if d == t.tp_dim else 1
            if d == 0:
                floor = max(floor, spec.dp)
            shape.append(max(floor, int(round(n * f))))
        out.append(replace(t, shape=tuple(shape)))
    return replace(spec, tensors=tuple(out), scale=spec.scale * scale)


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Shard:
    """One box of one tensor component that one rank saves."""

    tensor: str
    component: str
    dtype: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype][1]

    @property
    def key(self) -> str:
        return f"{self.tensor}/{self.component}"

    def to_list(self) -> list:
        return [self.tensor, self.component, self.dtype, list(self.global_shape), list(self.offsets), list(self.shape)]

    @classmethod
    def from_list(cls, v: list) -> "Shard":
        t, c, dt, g, o, s = v
        return cls(t, c, dt, tuple(g), tuple(o), tuple(s))


def split_range(n: int, parts: int, i: int) -> tuple[int, int]:
    """[start, stop) of part i when n items are split into ``parts`` nearly equal runs."""
    base, extra = divmod(n, parts)
    start = i * base + min(i, extra)
    return start, start + base + (1 if i < extra else 0)


def rank_coords(spec: StateSpec, rank: int) -> tuple[int, int, int]:
    """(tp_rank, pp_rank, dp_rank) in Megatron order: tp fastest, then pp, then dp."""
    return rank % spec.tp, (rank // spec.tp) % spec.pp, rank // (spec.tp * spec.pp)


def stage_of(spec: StateSpec, t: TensorSpec) -> int:
    """Pipeline stage holding tensor t: embedding on the first, head on the last, layers split evenly."""
    if spec.pp == 1:
        return 0
    if t.stage <= 0:
        return 0
    if t.stage > spec.layers:
        return spec.pp - 1
    base, extra = divmod(spec.layers, spec.pp)
    i = t.stage - 1
    if i < extra * (base + 1):
        return i // (base + 1)
    return extra + (i - extra * (base + 1)) // max(1, base)


@lru_cache(maxsize=16)
def _tensors_by_stage(spec: StateSpec) -> dict[int, list[TensorSpec]]:
    out: dict[int, list[TensorSpec]] = {}
    for t in spec.tensors:
        out.setdefault(stage_of(spec, t), []).append(t)
    return out


def _box_for(spec: StateSpec, t: TensorSpec, comp: Component, tp_rank: int, dp_rank: int):
    offsets = [0] * len(t.shape)
    shape = list(t.shape)
    if t.tp_dim is not None and spec.tp > 1:
        a, b = split_range(t.shape[t.tp_dim], spec.tp, tp_rank)
        offsets[t.tp_dim], shape[t.tp_dim] = a, b - a
    elif tp_rank != 0:
        return None  # replicated across TP ranks: TP rank 0 saves it
    sharded = spec.zero_stage >= 3 or (comp.optimizer and spec.zero_stage >= 1)
    if sharded and spec.dp > 1:
        d = 0
        a, b = split_range(shape[d], spec.dp, dp_rank)
        offsets[d], shape[d] = offsets[d] + a, b - a
    elif dp_rank != 0:
        return None  # replicated across DP ranks: DP rank 0 saves it
    if math.prod(shape) == 0:
        return None
    return Shard(t.name, comp.name, comp.dtype, t.shape, tuple(offsets), tuple(shape))


def shards_of_rank(spec: StateSpec, rank: int) -> list[Shard]:
    if not 0 <= rank < spec.ranks:
        raise ConfigError("rank", f"{rank} is outside 0..{spec.ranks - 1}", "check TP×PP×DP")
    tp_rank, pp_rank, dp_rank = rank_coords(spec, rank)
    out = []
    for t in _tensors_by_stage(spec).get(pp_rank, []):
        for comp in spec.components:
            box = _box_for(spec, t, comp, tp_rank, dp_rank)
            if box is not None:
                out.append(box)
    return out


def rank_shards(spec: StateSpec) -> list[list[Shard]]:
    """Per rank, the shards it saves; every element of every component is saved exactly once."""
    return [shards_of_rank(spec, r) for r in range(spec.ranks)]


def rank_bytes(spec: StateSpec) -> list[int]:
    return [sum(s.nbytes for s in shards) for shards in rank_shards(spec)]


def checkpoint_bytes(spec: StateSpec) -> int:
    """Bytes of one full checkpoint: parameters × bytes per parameter of the recipe."""
    return spec.params * spec.bytes_per_param


def max_rank_bytes(spec: StateSpec) -> int:
    """The largest per-rank shard (what the slowest local write must move)."""
    return max(rank_bytes(spec))


def mlperf_reference_bytes(name: str) -> int | None:
    """MLPerf Storage v2's published checkpoint size for a preset (binary units), or None."""
    return PRESETS[name].mlperf_bytes if name in PRESETS else None
