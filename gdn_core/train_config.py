"""Settings of a training step, shared by the PyTorch and JAX steps."""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from .packing import check_documents

Framework = Literal["jax", "torch"]
FRAMEWORKS: tuple[str, ...] = get_args(Framework)
"""The two implementations of the step; FLOP and memory counts differ between them."""


def check_framework(framework: str) -> None:
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework={framework!r} is not one of: {', '.join(FRAMEWORKS)}")


ComputeDType = Literal["float32", "bfloat16"]
COMPUTE_DTYPES: tuple[str, ...] = get_args(ComputeDType)
ParamSharding = Literal["replicated", "zero1", "fsdp"]
PARAM_SHARDINGS: tuple[str, ...] = get_args(ParamSharding)
"""How weights, gradients and AdamW state are laid out over the CP chips (which double as the
data/FSDP axis, as MaxText's ici_fsdp × context meshes do):
replicated — every chip holds everything; gradients all-reduced.
zero1 — optimizer state sharded over the group; weights stay replicated. JAX: gradients
    reduce-scattered, each chip updates its shard, updated shards all-gathered. PyTorch:
    ZeroRedundancyOptimizer (gradients all-reduced, each rank updates its shard, updated
    parameters broadcast: more bytes than JAX's, as counted).
fsdp — parameters, gradients and optimizer state sharded; each layer's weights gathered just
    before it runs (and again in backward), gradients reduce-scattered."""
Remat = Literal["none", "full", "gdn"]
REMATS: tuple[str, ...] = get_args(Remat)
"""Activation recomputation: none — keep every activation; full — each decoder layer is
recomputed in backward (only its input is saved); gdn — only the GDN token mixer is recomputed,
as Megatron's `gdn` recompute, the MLP's activations kept."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """One training step's data and optimizer settings."""

    batch_size: int = 1
    """Sequences per step of one data-parallel replica (a CP run with CPSettings.dp replicas
    trains on a global batch of dp × batch_size sequences, replica d on sequences
    d·batch_size … (d+1)·batch_size − 1 of data.synthetic_tokens(batch_size=dp·batch_size))."""
    seq_len: int = 256
    """Global tokens per sequence (split across chips under CP)."""
    dtype: ComputeDType = "float32"
    """Compute dtype. bfloat16: bf16 weight copies and activations, bf16 matmuls accumulating
    in float32; master weights, optimizer state and the GDN state chain stay float32."""
    param_sharding: ParamSharding = "replicated"
    """Layout of weights, gradients and optimizer state over the CP chips (PARAM_SHARDINGS)."""
    remat: Remat = "none"
    """Activation recomputation policy (REMATS)."""
    learning_rate: float = 3e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    seed: int = 0
    """Seeds both the weights and the synthetic data."""
    documents: str = "single"
    """How each sequence is packed from documents (gdn_core.packing): 'single', or
    'uniform:LO-HI' (lengths drawn from `seed`; every row of the batch packed alike). The GDN
    state and attention restart at each document boundary."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name}={value!r} must be a positive integer")
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"TrainConfig.dtype={self.dtype!r} is not one of: "
                             f"{', '.join(COMPUTE_DTYPES)}")
        if self.param_sharding not in PARAM_SHARDINGS:
            raise ValueError(f"TrainConfig.param_sharding={self.param_sharding!r} is not one of: "
                             f"{', '.join(PARAM_SHARDINGS)}")
        if self.remat not in REMATS:
            raise ValueError(f"TrainConfig.remat={self.remat!r} is not one of: "
                             f"{', '.join(REMATS)}")
        check_documents(self.documents)
        if not self.learning_rate > 0:
            raise ValueError(f"TrainConfig.learning_rate={self.learning_rate!r} must be > 0")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainReport:
    """What a run of training steps measured on this process."""

    losses: list[float]
    """Loss of every step, warm-up included."""
    step_times_s: list[float]
    """Wall time of each measured step (after warm-up), device synchronised."""
    peak_memory_bytes: int | None = None
    """MEASURED peak bytes per chip over the run (verify included), None where nothing could
    say: the device allocator's peak on GPU/TPU, the process RSS high-water mark on CPU
    (divided by the chips when one JAX process drives several). Never an estimate."""
    memory_source: str = "unknown"
    """What peak_memory_bytes measured (gdn_core.device_memory): cuda_max_allocated,
    jax_peak_bytes_in_use, process_rss_peak, process_rss_peak/{n}_chips, …"""
    estimated_memory_bytes: int | None = None
    """JAX: XLA's compile-time memory analysis of the step per chip (arguments + outputs +
    temporaries − aliased); None for torch (nothing compiles)."""
    estimated_memory_source: str | None = None
    """"xla_memory_analysis" beside estimated_memory_bytes, else None."""
    compile_time_s: float = 0.0
    """Seconds this process spent lowering and compiling (JAX: the step, its comm reference
    and any verify programs); 0 for torch's eager step."""

    @property
    def step_time_s(self) -> float:
        """Median of the measured step times."""
        times = sorted(self.step_times_s)
        mid = len(times) // 2
        return times[mid] if len(times) % 2 else 0.5 * (times[mid - 1] + times[mid])


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CPTrainReport(TrainReport):
    """A TrainReport from one CP run (one rank in PyTorch, one process's chips in JAX)."""

    mode: str
    """CP mode (gdn_core.cp_modes.CP_MODES)."""
    chips: int
    """All chips of the step's mesh (dp × the CP group's chips)."""
    dp: int = 1
    """Data-parallel replicas (CPSettings.dp); the CP group of each has chips // dp chips."""
    cp_comm_bytes_per_step: int
    """Bytes this chip received per step in the mode's exchanges (forward + backward, halo
    included; docs/architecture.md's table)."""
    grad_sync_bytes_per_step: int
    """Bytes this chip received per step for the weights themselves, apart from CP traffic:
    the gradient all-reduce (replicated; ring convention 2·(D−1)/D × gradient bytes), or the
    reduce-scatter of gradients plus the all-gathers of weights (zero1: updated shards; fsdp:
    every layer's weights, forward and backward)."""
    comm_source: str = "unknown"
    """How the bytes were found: counted collectives (torch) or the compiled HLO (jax)."""
    attn_cp: str | None = None
    """The attention layers' CP mode the run used (gdn_core.cp_modes.ATTN_CP_MODES); None when
    the model has no attention layers (a gdn_only decoder)."""
    layout: str = "contiguous"
    """How the sequence was laid over the chips (gdn_core.cp_layout): contiguous, or zigzag
    (chip r holds segments r and 2D−1−r)."""
    max_rel_err: float | None = None
    """verify=True: max relative error of the CP loss and gradients against one chip, on the
    first verified_seq_len tokens of every sequence."""
    verified_seq_len: int | None = None
    """Tokens per sequence the verify compared: seq_len when one chip could hold the whole
    sequence, else the longest prefix that fits (memory.verify.verify_seq_len); None when
    verify=False or not even the shortest prefix fits (max_rel_err is then None too)."""
    gdn_kernel: str | None = None
    """What the GDN layers ran, named with its version (gdn_core.kernels.ResolvedKernels.gdn),
    as the step resolved it where it ran; a trial's result stores it."""
    attention_kernel: str | None = None
    """What the attention layers ran (ResolvedKernels.attention); None without attention
    layers (a gdn_only decoder)."""

    @property
    def comm_bytes_per_step(self) -> int:
        """Everything this chip received per step (comm_bytes_per_step_per_chip:
        docs/architecture.md, Metrics)."""
        return self.cp_comm_bytes_per_step + self.grad_sync_bytes_per_step
