"""What a sweep asks for, and the trials it expands to.

`SweepSpec` is the one schema for the REST API's request body, sweep YAML files and `ray
submit` scripts. `expand_trials` turns it into `TrialSpec`s; a point a mode cannot serve is
kept as a trial marked skipped with the reason, never dropped silently.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from gdn_core import hardware
from gdn_core.cp_modes import CP_MODES, CPMode, check_cp_shape
from gdn_core.presets import PRESETS, get_preset
from gdn_core.config import ModelConfig
from gdn_core.train_config import ComputeDType, ParamSharding, Remat, TrainConfig

Framework = Literal["jax", "torch"]
FRAMEWORKS: tuple[str, ...] = ("jax", "torch")
AcceleratorKind = Literal["cpu", "gpu", "tpu"]
DType = ComputeDType


def _grid_list(field: str, default: str):
    """A grid dimension: a list, named in the plural; the singular name and a single value
    (as sweeps written before it was a dimension say it) are accepted too."""
    return Field(default=[default], min_length=1,
                 validation_alias=AliasChoices(field, field.removesuffix("s")))


class ModelSpec(BaseModel):
    """The model a sweep trains: a preset, optionally with another depth or vocabulary."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    preset: str = "tiny"
    num_layers: int | None = Field(default=None, ge=1, le=512)
    vocab_size: int | None = Field(default=None, ge=2, le=1_000_000)

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str) -> str:
        if preset not in PRESETS:
            raise ValueError(f"preset={preset!r} is not one of: {', '.join(PRESETS)}")
        return preset


class AcceleratorSpec(BaseModel):
    """Where trials run: cpu (virtual chips on CPU hosts), gpu or tpu, plus the chip type."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: AcceleratorKind = "cpu"
    type: str = Field(default="cpu", description="chip type for the peak table, e.g. h100, v5p; "
                      "'cpu' for CPU hosts (peak measured by a GEMM calibration)")

    @model_validator(mode="after")
    def _type_matches_kind(self) -> "AcceleratorSpec":
        if self.kind == "cpu":
            if self.type != "cpu":
                raise ValueError(f"accelerator.type={self.type!r} must be 'cpu' when kind='cpu'")
        else:
            hardware.peak_flops_per_chip(self.type)  # ValueError lists the accepted types
        return self


class SweepSpec(BaseModel):
    """A grid of trials: frameworks × modes × chips × seq_lens × dtypes × param_shardings ×
    remats, for one model and batch."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=200)
    frameworks: list[Framework] = Field(default=["jax", "torch"], min_length=1)
    modes: list[CPMode] = Field(default=["all_gather"], min_length=1)
    chips: list[int] = Field(min_length=1)
    seq_lens: list[int] = Field(min_length=1)
    model: ModelSpec = ModelSpec()
    batch_size: int = Field(default=1, ge=1, le=1024)
    dtypes: list[DType] = _grid_list("dtypes", "float32")
    param_shardings: list[ParamSharding] = _grid_list("param_shardings", "replicated")
    remats: list[Remat] = _grid_list("remats", "none")
    steps: int = Field(default=3, ge=1, le=10_000)
    warmup_steps: int = Field(default=1, ge=0, le=1_000)
    accelerator: AcceleratorSpec = AcceleratorSpec()
    verify: bool = False
    trial_timeout_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)

    @field_validator("chips", "seq_lens")
    @classmethod
    def _positive_unique(cls, values: list[int], info) -> list[int]:
        bad = [v for v in values if v < 1]
        if bad:
            raise ValueError(f"{info.field_name} has non-positive values {bad}; use integers >= 1")
        return sorted(set(values))

    @field_validator("dtypes", "param_shardings", "remats", mode="before")
    @classmethod
    def _one_value_is_a_list(cls, value):
        return [value] if isinstance(value, str) else value

    @field_validator("frameworks", "modes", "dtypes", "param_shardings", "remats")
    @classmethod
    def _unique(cls, values: list[str]) -> list[str]:
        return list(dict.fromkeys(values))

    def _dimensions(self) -> tuple[list, ...]:
        return (self.frameworks, self.modes, self.chips, self.seq_lens, self.dtypes,
                self.param_shardings, self.remats)

    def grid(self):
        """Every grid point as (framework, mode, chips, seq_len, dtype, param_sharding, remat),
        in a stable order."""
        return itertools.product(*self._dimensions())

    @property
    def grid_size(self) -> int:
        return math.prod(len(values) for values in self._dimensions())


def trial_key(*, framework: str, mode: str, chips: int, seq_len: int, dtype: str,
              param_sharding: str, remat: str) -> str:
    """Identity of a grid point within its sweep (used to resume and to refuse duplicates):
    every grid dimension, so no two points collide."""
    return (f"{framework}/{mode}/chips={chips}/seq_len={seq_len}"
            f"/dtype={dtype}/param_sharding={param_sharding}/remat={remat}")


class TrialSpec(BaseModel):
    """One point of a sweep: everything a worker needs to run it, nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    framework: Framework
    mode: CPMode
    chips: int
    seq_len: int
    batch_size: int
    preset: str
    num_layers: int
    vocab_size: int
    dtype: DType
    param_sharding: ParamSharding = "replicated"
    remat: Remat = "none"
    steps: int
    warmup_steps: int
    accelerator_kind: AcceleratorKind
    accelerator_type: str
    verify: bool
    timeout_s: float
    skip_reason: str | None = None

    @property
    def key(self) -> str:
        """Identity of the point within its sweep (trial_key)."""
        return trial_key(framework=self.framework, mode=self.mode, chips=self.chips,
                         seq_len=self.seq_len, dtype=self.dtype,
                         param_sharding=self.param_sharding, remat=self.remat)

    def to_model_config(self) -> ModelConfig:
        """The model this trial trains (its preset, depth and vocabulary)."""
        return get_preset(self.preset, num_layers=self.num_layers, vocab_size=self.vocab_size)

    def to_train_config(self) -> TrainConfig:
        """The training-step settings this trial runs with."""
        return TrainConfig(batch_size=self.batch_size, seq_len=self.seq_len, dtype=self.dtype,
                           param_sharding=self.param_sharding, remat=self.remat)


def expand_trials(spec: SweepSpec) -> list[TrialSpec]:
    """All grid points in a stable order; points a mode cannot serve carry skip_reason."""
    model_cfg = get_preset(spec.model.preset, num_layers=spec.model.num_layers,
                           vocab_size=spec.model.vocab_size)
    gdn = model_cfg.gdn
    trials = []
    for framework, mode, chips, seq_len, dtype, param_sharding, remat in spec.grid():
        try:
            check_cp_shape(mode=mode, chips=chips, seq_len=seq_len, num_k_heads=gdn.num_k_heads,
                           num_v_heads=gdn.num_v_heads, conv_kernel_size=gdn.conv_kernel_size)
            skip_reason = None
        except ValueError as err:
            skip_reason = str(err)
        trials.append(TrialSpec(
            framework=framework, mode=mode, chips=chips, seq_len=seq_len,
            batch_size=spec.batch_size, preset=model_cfg.name, num_layers=model_cfg.num_layers,
            vocab_size=model_cfg.vocab_size, dtype=dtype, param_sharding=param_sharding,
            remat=remat, steps=spec.steps,
            warmup_steps=spec.warmup_steps, accelerator_kind=spec.accelerator.kind,
            accelerator_type=spec.accelerator.type, verify=spec.verify,
            timeout_s=spec.trial_timeout_s, skip_reason=skip_reason))
    return trials


__all__ = ["AcceleratorSpec", "CP_MODES", "FRAMEWORKS", "ModelSpec", "SweepSpec", "TrialSpec",
           "expand_trials", "trial_key"]
