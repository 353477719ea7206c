"""Settings of a training step, shared by the PyTorch and JAX steps."""

from __future__ import annotations

import dataclasses
from typing import Literal

ComputeDType = Literal["float32", "bfloat16"]
COMPUTE_DTYPES: tuple[str, ...] = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """One training step's data and optimizer settings."""

    batch_size: int = 1
    """Sequences per step."""
    seq_len: int = 256
    """Global tokens per sequence (split across chips under CP)."""
    dtype: ComputeDType = "float32"
    """Compute dtype; master weights and optimizer state stay float32, GDN state stays float32."""
    learning_rate: float = 3e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    seed: int = 0
    """Seeds both the weights and the synthetic data."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name}={value!r} must be a positive integer")
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"TrainConfig.dtype={self.dtype!r} is not one of: "
                             f"{', '.join(COMPUTE_DTYPES)}")
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
    """Peak memory of this process's chip(s), if known."""
    memory_source: str = "unknown"
    """Where peak_memory_bytes came from (cuda_max_allocated, xla_memory_analysis, rss, …)."""

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
    """Chips in the CP group."""
    cp_comm_bytes_per_step: int
    """Bytes this chip received per step in the mode's exchanges (forward + backward, halo
    included; ARCHITECTURE.md's table)."""
    grad_sync_bytes_per_step: int
    """Bytes this chip received per step summing gradients over the CP group (ring all-reduce
    convention: 2·(D−1)/D × gradient bytes)."""
    comm_source: str = "unknown"
    """How the bytes were found: counted collectives (torch) or the compiled HLO (jax)."""
    max_rel_err: float | None = None
    """verify=True: max relative error of the CP loss and gradients against one chip."""

    @property
    def comm_bytes_per_step(self) -> int:
        """Everything this chip received per step (ARCHITECTURE.md comm_bytes_per_step_per_chip)."""
        return self.cp_comm_bytes_per_step + self.grad_sync_bytes_per_step
