"""What a sweep asks for, and the trials it expands to.

`SweepSpec` is the one schema for the REST API's request body, sweep YAML files and `ray
submit` scripts. `expand_trials` turns it into `TrialSpec`s; a point a mode cannot serve is
kept as a trial marked skipped with the reason, never dropped silently.
"""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gdn_core import hardware
from gdn_core.cp_modes import CP_MODES, CPMode, check_cp_shape
from gdn_core.presets import PRESETS, get_preset

Framework = Literal["jax", "torch"]
FRAMEWORKS: tuple[str, ...] = ("jax", "torch")
AcceleratorKind = Literal["cpu", "gpu", "tpu"]
DType = Literal["float32", "bfloat16"]


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
    """A grid of trials: frameworks × modes × chips × seq_lens, one model and step setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=200)
    frameworks: list[Framework] = Field(default=["jax", "torch"], min_length=1)
    modes: list[CPMode] = Field(default=["all_gather"], min_length=1)
    chips: list[int] = Field(min_length=1)
    seq_lens: list[int] = Field(min_length=1)
    model: ModelSpec = ModelSpec()
    batch_size: int = Field(default=1, ge=1, le=1024)
    dtype: DType = "float32"
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

    @field_validator("frameworks", "modes")
    @classmethod
    def _unique(cls, values: list[str]) -> list[str]:
        return list(dict.fromkeys(values))

    @property
    def grid_size(self) -> int:
        return len(self.frameworks) * len(self.modes) * len(self.chips) * len(self.seq_lens)


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
    steps: int
    warmup_steps: int
    accelerator_kind: AcceleratorKind
    accelerator_type: str
    verify: bool
    timeout_s: float
    skip_reason: str | None = None

    @property
    def key(self) -> str:
        """Identity of the point within its sweep (used to resume and to refuse duplicates)."""
        return (f"{self.framework}/{self.mode}/chips={self.chips}/seq_len={self.seq_len}")


def expand_trials(spec: SweepSpec) -> list[TrialSpec]:
    """All grid points in a stable order; points a mode cannot serve carry skip_reason."""
    model_cfg = get_preset(spec.model.preset, num_layers=spec.model.num_layers,
                           vocab_size=spec.model.vocab_size)
    gdn = model_cfg.gdn
    trials = []
    for framework, mode, chips, seq_len in itertools.product(
            spec.frameworks, spec.modes, spec.chips, spec.seq_lens):
        try:
            check_cp_shape(mode=mode, chips=chips, seq_len=seq_len, num_k_heads=gdn.num_k_heads,
                           num_v_heads=gdn.num_v_heads, conv_kernel_size=gdn.conv_kernel_size)
            skip_reason = None
        except ValueError as err:
            skip_reason = str(err)
        trials.append(TrialSpec(
            framework=framework, mode=mode, chips=chips, seq_len=seq_len,
            batch_size=spec.batch_size, preset=model_cfg.name, num_layers=model_cfg.num_layers,
            vocab_size=model_cfg.vocab_size, dtype=spec.dtype, steps=spec.steps,
            warmup_steps=spec.warmup_steps, accelerator_kind=spec.accelerator.kind,
            accelerator_type=spec.accelerator.type, verify=spec.verify,
            timeout_s=spec.trial_timeout_s, skip_reason=skip_reason))
    return trials


__all__ = ["AcceleratorSpec", "CP_MODES", "FRAMEWORKS", "ModelSpec", "SweepSpec", "TrialSpec",
           "expand_trials"]
