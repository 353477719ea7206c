"""What the capacity planner takes and answers (GET /api/capacity, `gdn-sweep plan`), and the
planner form's choices and defaults (GET /api/capacity/defaults)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gdn_core import datasheets
from gdn_core.config import GDNConfig, Layers, ModelConfig
from gdn_core.cp_layout import Layout
from gdn_core.cp_modes import ATTN_CP_MODES, CP_MODES, AttnCPMode, CPMode
from gdn_core.kernels import DEFAULT_KERNELS, Kernels
from gdn_core.presets import PRESETS, get_preset
from gdn_core.train_config import (PARAM_SHARDINGS, REMATS, ComputeDType, Framework,
                                   ParamSharding, Remat)
from service.db.bounds import DbInt
from workers.sweep_spec import MAX_CHIPS, MAX_SEQ_LEN, known_preset

GDN_FIELDS = ("hidden_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")
SHAPE_FIELDS = (*GDN_FIELDS, "num_layers", "intermediate_size", "vocab_size")
"""What defines a model when no preset is given (the depth and vocabulary change a preset too)."""

Basis = Literal["measured", "estimated", "interpolated", "extrapolated", "predicted", "roofline",
                "refused"]
"""What a figure rests on. roofline: no trial answers it; the roofline at a stated efficiency
(a published run's measured MFU on the chip type, or the default range: roofline.py)."""

GDN_ONLY_BY_DEFAULT = ("tiny",)
"""Presets planned as gdn_only unless `layers` says otherwise although they carry attention
geometry: tiny is the test-sized model whose sweeps run gdn_only by default (SweepSpec.layers),
its attention there only to test the hybrid step. Every published preset (Qwen3.5, Qwen3-Next)
is trained as the hybrid decoder, and is planned so."""


class CapacityRequest(BaseModel):
    """What GET /api/capacity and `gdn-sweep plan` take."""

    model_config = ConfigDict(extra="forbid")
    seq_len: int = Field(ge=1, le=MAX_SEQ_LEN)
    accelerator: str = Field(description="chip type (h100, v5p, …, or cpu)")
    chip_memory_bytes: int | None = Field(default=None, ge=1, description="memory per "
                                                "chip (default: the chip type's HBM)")
    max_chips: int = Field(default=1024, ge=1, le=MAX_CHIPS)
    dp: list[Annotated[int, Field(ge=1, le=MAX_CHIPS)]] = Field(
        default=[], description="data-parallel replicas to plan (each chip count splits into "
                                "dp replicas of chips / dp CP chips, for every dp dividing it); "
                                "default: every power of two")
    batch_size: int = Field(default=1, ge=1, le=1024, description="sequences per replica: "
                            "a mesh of dp replicas trains dp × batch_size per step")
    dtype: ComputeDType = "bfloat16"
    frameworks: list[Framework] = Field(default=["jax"], min_length=1)
    modes: list[CPMode] = Field(default=list(CP_MODES), min_length=1)
    param_shardings: list[ParamSharding] = Field(default=list(PARAM_SHARDINGS), min_length=1)
    remats: list[Remat] = Field(default=list(REMATS), min_length=1)
    kernels: Kernels = Field(default=DEFAULT_KERNELS, description="the implementation to plan "
                             "for; evidence only from trials of it (JAX's fused GDN is the "
                             "Pallas chunk rule, composed with every CP mode: its step times "
                             "are unmeasured until a non-interpreted trial of it is)")
    num_layers: int | None = Field(default=None, ge=1, le=512)
    hidden_size: int | None = Field(default=None, ge=1, le=65536)
    num_k_heads: int | None = Field(default=None, ge=1, le=1024)
    num_v_heads: int | None = Field(default=None, ge=1, le=1024)
    head_k_dim: int | None = Field(default=None, ge=1, le=4096)
    head_v_dim: int | None = Field(default=None, ge=1, le=4096)
    intermediate_size: int | None = Field(default=None, ge=1, le=1 << 20)
    vocab_size: int | None = Field(default=None, ge=2, le=1_000_000)
    preset: str | None = Field(default=None, validate_default=True, description="a model "
                               "preset; or give the GDN shape (SHAPE_FIELDS) instead, or both "
                               "to change a preset")
    layers: list[Layers] | None = Field(
        default=None, min_length=1, description="decoders to plan (gdn_only, hybrid); default: "
        "the preset's own — hybrid for every published preset (Qwen3.5, Qwen3-Next: a "
        "full-attention layer every fourth), gdn_only for tiny and a shape given by hand")
    attn_cps: list[AttnCPMode] | None = Field(
        default=None, min_length=1, description=f"CP modes of the hybrid's attention layers "
        f"({', '.join(ATTN_CP_MODES)}); default: ring over zigzag shards, all_gather_kv and "
        "ulysses over contiguous ones (the other pairs are dominated by the analytic counts: "
        "points.UNDOMINATED_SPLITS) and any pair a trial ran, then any another of the same "
        "mesh and settings beats on fitting, memory and step time left out — so the default "
        "answer stays about the size of a GDN-only one; listed: every pair kept")
    layouts: list[Layout] | None = Field(
        default=None, min_length=1, description="sequence layouts (contiguous, zigzag: "
        "balanced causal attention); default: as attn_cps says for the hybrid; contiguous "
        "for gdn_only (the GDN work is the same under either)")
    sweep_id: list[DbInt] = Field(default=[], description="evidence only from these sweeps "
                                  "(default: every sweep)")

    @field_validator("preset")
    @classmethod
    def _a_preset_or_a_shape(cls, preset: str | None, info) -> str | None:
        """Declared after the shape fields, so they are here to check (info.data)."""
        if preset is not None:
            return known_preset(preset)
        missing = [f for f in SHAPE_FIELDS if info.data.get(f) is None]
        if missing:
            raise ValueError(f"give a preset (one of: {', '.join(PRESETS)}), or the GDN shape "
                             f"without one: {', '.join(missing)} missing")
        return None

    @field_validator("layers")
    @classmethod
    def _hybrid_needs_attention(cls, layers: list[str] | None, info) -> list[str] | None:
        """A hybrid asked of a model without attention geometry: refused, naming it."""
        if not layers or "hybrid" not in layers or "preset" not in info.data:
            return layers  # (a bad preset is refused on its own)
        preset = info.data["preset"]
        if preset is None or PRESETS[preset].attention is None:
            what = f"preset={preset!r}" if preset else "a GDN shape given by hand"
            raise ValueError(f"layers='hybrid' needs attention geometry and {what} has none; "
                             "use layers=gdn_only (or a preset with attention: "
                             + ", ".join(p for p, m in PRESETS.items() if m.attention) + ")")
        return layers

    def planned_layers(self) -> list[str]:
        """The decoders planned: `layers`, or the preset's own (GDN_ONLY_BY_DEFAULT)."""
        if self.layers:
            return list(dict.fromkeys(self.layers))
        own = (self.preset is not None and PRESETS[self.preset].attention is not None
               and self.preset not in GDN_ONLY_BY_DEFAULT)
        return ["hybrid" if own else "gdn_only"]

    @property
    def prunes_variants(self) -> bool:
        """Whether dominated attn_cp / layout variants are left out (neither was listed)."""
        return self.attn_cps is None and self.layouts is None

    @model_validator(mode="after")
    def _a_model(self) -> CapacityRequest:
        self.model()  # a preset, a whole shape, or a preset changed: ValueError names the gap
        return self

    @property
    def custom_shape(self) -> bool:
        """Whether the model differs from its preset beyond depth (no trial can be of it)."""
        return self.preset is None or any(getattr(self, f) is not None for f in SHAPE_FIELDS
                                          if f != "num_layers")

    def model(self) -> ModelConfig:
        """The model to plan for: the preset, with any shape field given replacing its own."""
        given = {f: getattr(self, f) for f in SHAPE_FIELDS if getattr(self, f) is not None}
        gdn_given = {f: v for f, v in given.items() if f in GDN_FIELDS}
        top = {f: v for f, v in given.items() if f not in GDN_FIELDS}
        if self.preset is None:
            return ModelConfig(name="custom", gdn=GDNConfig(**gdn_given), **top,
                               note="a GDN shape given by hand: no trial is of it")
        base = get_preset(self.preset)
        if set(given) - {"num_layers"}:
            top["note"] = f"{self.preset} with its shape changed by hand: no trial is of it"
        return dataclasses.replace(base, gdn=dataclasses.replace(base.gdn, **gdn_given), **top)

    @field_validator("accelerator")
    @classmethod
    def _known_chip(cls, accelerator: str) -> str:
        """The canonical chip type (h100 → h100-sxm), or cpu."""
        if accelerator.strip().lower() == "cpu":
            return "cpu"
        try:
            return datasheets.canonical_accelerator_type(accelerator)
        except ValueError as err:
            raise ValueError(f"{err}; or cpu (virtual CPU chips)") from None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Efficiency:
    """The MFU a roofline estimate assumes on a chip type, and what it rests on."""

    mfu: float
    low: float
    high: float
    published: bool
    """From a published run on this chip type (else the default range)."""
    label: str
    """How an answer names it: "MaxText's measured 27.6% MFU on v5p"."""
    source: str

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.mfu <= self.high <= 1:
            raise ValueError(f"efficiency {self.low} ≤ {self.mfu} ≤ {self.high} must lie in "
                             "(0, 1]: no chip runs above its peak")


class Figure(BaseModel):
    """One predicted number, what it rests on, and the trials behind it."""

    value: float | None
    basis: Basis
    trial_ids: list[int] = []
    note: str = ""


class Candidate(BaseModel):
    framework: str
    kernels: str = DEFAULT_KERNELS
    gdn_kernel: str = ""
    """What the GDN layers run under `kernels` in this framework (JAX fused: the Pallas chunk
    rule for the accelerator's platform)."""
    gdn_kernel_unmeasured: bool = False
    """No measured trial of this GDN kernel stands behind the step time: JAX's fused GDN (the
    Pallas chunk rule) until a non-interpreted trial of it is measured; the step time is then
    the prior's or the roofline's, and its note says so."""
    mode: str
    chips: int
    """All chips of the mesh: dp × cp_chips."""
    dp: int = 1
    """Data-parallel replicas."""
    cp_chips: int = 1
    """Chips of one replica's CP group (mode "none": 1)."""
    global_batch_size: int = 1
    """Sequences per step over all replicas (dp × the request's batch_size)."""
    param_sharding: str
    remat: str
    layers: str = "gdn_only"
    """The decoder: gdn_only, or the hybrid (full attention every fourth layer)."""
    attn_cp: str | None = None
    """The hybrid's attention CP mode; None without attention layers or without CP."""
    layout: str = "contiguous"
    """Which tokens each chip holds (contiguous, zigzag)."""
    local_tokens: int
    fits: bool
    memory_bytes_per_chip: Figure
    chip_memory_bytes: int
    step_time_s: Figure
    tokens_per_s_per_chip: Figure
    tokens_per_s: Figure
    mfu: Figure
    comm_bytes_per_step_per_chip: Figure
    chip_hours_per_billion_tokens: Figure
    """Chip-hours to train 10⁹ tokens: 10⁹ ÷ (tokens/s/chip × 3600), the same basis."""


class PlanCheck(BaseModel):
    """A plan's XLA:CPU memory estimate beside a measured trial of the same point."""

    point: str
    plan_trial_id: int
    measured_trial_id: int
    plan_estimate_bytes: int
    measured_peak_bytes: int
    measured_source: str | None
    ratio: float
    """plan estimate ÷ measured peak."""


class CapacityAnswer(BaseModel):
    request: CapacityRequest
    chip_memory_bytes: int
    chip_memory_source: str
    model_note: str
    """Where the model's numbers come from (MoE: the dense stand-in's step time)."""
    candidates: list[Candidate]
    """Every candidate that fits, fastest first; then those that do not."""
    fewest_chips: Candidate | None
    cheapest: Candidate | None
    """Fewest chip-hours per token (the highest tokens/s per chip) among those that fit;
    roofline figures count where no trial answers."""
    fastest: Candidate | None
    """The highest total tokens/s within max_chips among those that fit."""
    pareto: list[Candidate]
    """Fitting candidates no other beats on chips, total tokens/s and memory per chip (no
    worse in all three, better in one), by chips."""
    plan_checks: list[PlanCheck]
    """Points with both a plan and a measured trial: how far XLA:CPU's estimate was."""
    evidence_trials: int
    speed_basis: Efficiency | None = None
    """What `roofline` figures rest on (None on virtual CPU chips: no roofline there)."""
    variants_left_out: int = 0
    """attn_cp / layout variants left out as dominated (request.prunes_variants)."""
    caveats: list[str]


class FormDefaults(BaseModel):
    """A capacity request's fields as the stored trials suggest them (absent: none stored)."""

    preset: str | None = None
    accelerator: str | None = None
    dtype: str | None = None
    kernels: str | None = None
    layers: list[str] | None = None
    num_layers: int | None = None
    frameworks: list[str] = []
    seq_len: int | None = None
    max_chips: int | None = None


class PlannerForm(BaseModel):
    """GET /api/capacity/defaults: the form's choices and its defaults, and what they rest on."""

    layers: list[str]
    attn_cps: list[str]
    layouts: list[str]
    defaults: FormDefaults
    trials: int
    """Succeeded measured trials of the defaults' settings."""
    source: str
