"""What a sweep asks for: `SweepSpec`, the one schema for the REST API's request body, sweep
YAML files and `ray submit` scripts, with the model (`ModelSpec`) and chips
(`AcceleratorSpec`) it names, and the grid of points it spans (`SweepSpec.grid`). The trials
it expands to are workers.grid's.

Input checks: every number is strict (`true` or "2" is not a chip count) and bounded
(MAX_CHIPS, MAX_SEQ_LEN, ...), and text refuses control characters and unpaired surrogates
(check_plain_text).
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from gdn_core import datasheets
from gdn_core.config import Layers
from gdn_core.cp_layout import LAYOUTS, Layout
from gdn_core.cp_modes import ATTN_CP_MODES, AttnCPMode, CPMode
from gdn_core.kernels import DEFAULT_KERNELS, KERNELS, Kernels
from gdn_core.packing import DOCUMENTS_HELP, SINGLE_DOCUMENT, check_documents
from gdn_core.presets import PRESETS
from gdn_core.train_config import FRAMEWORKS, ComputeDType, Framework, ParamSharding, Remat

AcceleratorKind = Literal["cpu", "gpu", "tpu"]
DType = ComputeDType
TrialKind = Literal["measure", "plan"]
"""measure: the step runs and is timed. plan: the JAX step is compiled for the trial's chips
(virtual CPU chips of one process) and not run — XLA's memory estimate, the compiled FLOPs and
collective bytes, for sizes no host here could run (gdn_core.jax_gdn.plan)."""
TRIAL_KINDS: tuple[str, ...] = ("measure", "plan")

MAX_CHIPS = 16_384
"""Most chips a trial may ask for: the biggest pods are ~9k chips (a TPU v5p pod has 8,960),
so 2^14 leaves room while refusing counts no cluster has."""
MAX_SEQ_LEN = 2 ** 30
"""Longest seq_len: the Integer seq_len columns (int32 on PostgreSQL) hold it; memory
admission refuses far shorter sequences for any real model on any chip."""

_REFUSED_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def check_plain_text(value):
    """`value`, unless it is text holding a control character (C0 with NUL, DEL, C1) or an
    unpaired surrogate: PostgreSQL cannot store NUL, no UTF-8 encoder writes a lone surrogate,
    and neither belongs in a name or a filter. (A JSON pair like "\\ud83d\\ude00" arrives as
    one character, so any surrogate left is unpaired.) Run before the type check, which would
    refuse a surrogate without saying where it is."""
    bad = _REFUSED_CHARACTERS.search(value) if isinstance(value, str) else None
    if bad is not None:
        char = bad.group()
        kind = "an unpaired surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
        raise ValueError(f"the text contains {kind}, U+{ord(char):04X}, at position "
                         f"{bad.start()}; use printable text (no control characters, no "
                         "unpaired surrogates)")
    return value


def known_preset(preset: str) -> str:
    """`preset`, if gdn_core.presets has it (ValueError listing them otherwise)."""
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not one of: {', '.join(PRESETS)}")
    return preset


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("the name is blank; use at least one character that is not a space")
    return text


PlainText = Annotated[StrictStr, BeforeValidator(check_plain_text)]
"""A string without control characters or unpaired surrogates (check_plain_text)."""

Name = Annotated[StrictStr, Field(min_length=1, max_length=200),
                 BeforeValidator(check_plain_text), AfterValidator(_not_blank)]


def _known_documents(documents: str) -> str:
    check_documents(documents)  # ValueError naming the value and what is accepted
    return documents


Documents = Annotated[StrictStr, Field(max_length=40), BeforeValidator(check_plain_text),
                      AfterValidator(_known_documents)]
"""A packing of each sequence (gdn_core.packing): single, or uniform:LO-HI. 40 characters hold
any LO-HI up to MAX_SEQ_LEN; a trial key must still fit its column (grid.MAX_KEY_CHARS)."""


def _grid_list(field: str, default: str):
    """A grid dimension: a list, named in the plural; the singular name and a single value
    (as sweeps written before it was a dimension say it) are accepted too."""
    return Field(default=[default], min_length=1,
                 validation_alias=AliasChoices(field, field.removesuffix("s")))


class ModelSpec(BaseModel):
    """The model a sweep trains: a preset, optionally with another depth or vocabulary."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    preset: PlainText = Field(default="tiny", max_length=64)
    num_layers: StrictInt | None = Field(default=None, ge=1, le=512)
    vocab_size: StrictInt | None = Field(default=None, ge=2, le=1_000_000)

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str) -> str:
        return known_preset(preset)


class AcceleratorSpec(BaseModel):
    """Where trials run: cpu (virtual chips on CPU hosts), gpu or tpu, plus the chip type."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: AcceleratorKind = "cpu"
    type: PlainText = Field(default="cpu", max_length=64, description="chip type for the peak "
                            "table, e.g. h100, v5p; 'cpu' for CPU hosts (peak measured by a "
                            "GEMM calibration)")

    @model_validator(mode="after")
    def _type_matches_kind(self) -> "AcceleratorSpec":
        if self.kind == "cpu":
            if self.type != "cpu":
                raise ValueError(f"accelerator.type={self.type!r} must be 'cpu' when kind='cpu'")
        else:
            datasheets.peak_flops_per_chip(self.type)  # ValueError lists the accepted types
        return self


class SweepSpec(BaseModel):
    """A grid of trials: kinds × frameworks × kernels × layers × modes × attn_cps (hybrid
    only) × layouts × meshes (chips × dp, where dp divides chips) × seq_lens × dtypes ×
    param_shardings × remats × documents, for one model and batch (per data-parallel
    replica), each measured point run `repeats` times (chips=1 once for all modes, attn_cps
    and layouts: the one-chip baseline; a pure data-parallel mesh, dp = chips, likewise once).
    Plan trials are JAX's reference step only and made once: a compile says the same every
    time."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: Name
    kinds: list[TrialKind] = _grid_list("kinds", "measure")
    frameworks: list[Framework] = Field(default=list(FRAMEWORKS), min_length=1)
    modes: list[CPMode] = Field(default=["all_gather"], min_length=1)
    layers: list[Layers] = Field(default=["gdn_only"], min_length=1,
                                 description="the decoder: gdn_only (every layer GDN) and/or "
                                 "hybrid (the published GDN + gated full-attention pattern)")
    attn_cps: list[AttnCPMode] = Field(
        default=["all_gather_kv"], min_length=1,
        validation_alias=AliasChoices("attn_cps", "attn_cp"),
        description=f"CP modes of the hybrid's attention layers ({', '.join(ATTN_CP_MODES)}); "
                    "hybrid trials only")
    layouts: list[Layout] = Field(
        default=["contiguous"], min_length=1, validation_alias=AliasChoices("layouts", "layout"),
        description=f"sequence layouts over the chips ({', '.join(LAYOUTS)}; zigzag: chip r "
                    "holds chunks r and 2D−1−r)")
    chips: list[StrictInt] = Field(min_length=1, description=f"chip counts, 1 to {MAX_CHIPS}: "
                                   "all chips of a trial's mesh (dp × its CP chips)")
    dp: list[StrictInt] = Field(
        default=[1], min_length=1,
        description="data-parallel replicas per mesh: each of a trial's chips counts splits "
                    "into dp replicas of chips / dp CP chips (only the dp values dividing it); "
                    "each replica trains batch_size sequences, weights and optimizer state "
                    "are laid out over all chips, CP exchanges stay within a replica")
    seq_lens: list[StrictInt] = Field(min_length=1,
                                      description=f"global tokens per sequence, 1 to {MAX_SEQ_LEN}")
    model: ModelSpec = ModelSpec()
    batch_size: StrictInt = Field(default=1, ge=1, le=1024)
    dtypes: list[DType] = _grid_list("dtypes", "float32")
    param_shardings: list[ParamSharding] = _grid_list("param_shardings", "replicated")
    remats: list[Remat] = _grid_list("remats", "none")
    kernels: list[Kernels] = Field(
        default=[DEFAULT_KERNELS], min_length=1,
        validation_alias=AliasChoices("kernels", "kernel"),
        description=f"implementations ({', '.join(KERNELS)}): reference is this project's "
                    "torch / JAX code; fused runs library kernels where they compose with CP "
                    "(a point none can serve is recorded skipped with the reason)")
    documents: list[Documents] = Field(
        default=[SINGLE_DOCUMENT], min_length=1,
        description=f"how each sequence is packed: {DOCUMENTS_HELP}; the GDN state and "
                    "attention restart at each document boundary")
    steps: StrictInt = Field(default=3, ge=1, le=10_000)
    warmup_steps: StrictInt = Field(default=1, ge=0, le=1_000)
    accelerator: AcceleratorSpec = AcceleratorSpec()
    verify: StrictBool = False
    trial_timeout_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600, strict=True)
    repeats: StrictInt = Field(default=1, ge=1, le=20)
    """Times each grid point runs, as separate trials (TrialSpec.repeat 0 … repeats−1), to
    show how much a measurement varies between runs; keys gain `/repeat=r` when > 1."""
    one_chip_baseline: StrictBool = True
    """True: chips=1 runs once per (framework, seq_len, dtype, param_sharding, remat, kernels,
    documents, repeat) as mode "none", the baseline every mode's rows refer to
    (`baseline_key`). False: one chip per mode, as sweeps stored before the baseline existed
    ran (migration 0003 marks them so). Either way a sweep whose `chips` lacks 1 has no
    baseline: none is added for it."""
    profile: StrictBool = Field(default=False, description="run one extra step after the "
                                "measured ones under jax.profiler / torch.profiler and keep its "
                                "trace with the trial (in no metric)")
    """True: every measured trial runs one more step after its timed ones, under its
    framework's profiler on process 0, and its result keeps the trace file and a summary (top
    ops; compute, collective and idle time). Trial keys do not change."""
    admit_over_memory: StrictBool = Field(default=False, description="run grid points "
                                          "predicted not to fit the chip's memory (else they "
                                          "are recorded skipped, with the prediction)")
    """False: a point whose predicted memory per chip (gdn_core.memory) exceeds the
    chip's memory (memory_admission.chip_memory_bytes) is recorded skipped, the reason naming both. True: run
    such points anyway (to find where the prediction is wrong, or to record the OOM)."""

    @field_validator("chips", "seq_lens", "dp")
    @classmethod
    def _in_range_unique(cls, values: list[int], info) -> list[int]:
        high = MAX_SEQ_LEN if info.field_name == "seq_lens" else MAX_CHIPS
        bad = [v for v in values if not 1 <= v <= high]
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (", …" if len(bad) > 5 else "")
            raise ValueError(f"{info.field_name} has values outside 1…{high}: [{shown}]; use "
                             f"integers >= 1 and <= {high}")
        return sorted(set(values))

    @field_validator("kinds", "dtypes", "param_shardings", "remats", "layers", "attn_cps",
                     "layouts", "kernels", "documents", mode="before")
    @classmethod
    def _one_value_is_a_list(cls, value):
        return [value] if isinstance(value, str) else value

    @field_validator("kinds", "frameworks", "modes", "dtypes", "param_shardings", "remats",
                     "layers", "attn_cps", "layouts", "kernels", "documents")
    @classmethod
    def _unique(cls, values: list[str]) -> list[str]:
        return list(dict.fromkeys(values))

    @field_validator("warmup_steps")
    @classmethod
    def _fused_kernels_warm_up(cls, warmup_steps: int, info) -> int:
        # A library kernel tunes itself on its first call (fla's Triton autotune, cuDNN's plan
        # choice): a timed first step would time the tuning. A field validator, so a stored
        # sweep nested in another model is not re-checked (see _torch_not_on_tpu).
        if (warmup_steps < 1 and "fused" in info.data.get("kernels", ())
                and "measure" in info.data.get("kinds", ("measure",))):
            raise ValueError(
                f"warmup_steps={warmup_steps} with kernels including 'fused': a fused kernel "
                "tunes itself on its first call (fla's Triton autotune), which must not be "
                "timed; use warmup_steps >= 1 (accepted: 1 to 1000), or kernels: [reference]")
        return warmup_steps

    @field_validator("accelerator")
    @classmethod
    def _torch_not_on_tpu(cls, accelerator: AcceleratorSpec, info) -> AcceleratorSpec:
        # A field validator, not a model one: pydantic re-runs "after" model validators on an
        # instance nested in another model, which would make a stored sweep unreadable.
        if "torch" in info.data.get("frameworks", ()) and accelerator.kind == "tpu":
            raise ValueError(
                "frameworks includes 'torch' but accelerator.kind='tpu': there is no "
                "torch-on-TPU path (torch ranks would run on the TPU hosts' CPUs while "
                "reporting per-TPU-chip figures); use frameworks: [jax] on TPU, or run torch "
                "on accelerator.kind gpu or cpu")
        return accelerator

    @model_validator(mode="after")
    def _plans_are_jax(self) -> "SweepSpec":
        if "plan" in self.kinds and "jax" not in self.frameworks:
            raise ValueError(f"kinds includes 'plan' but frameworks={self.frameworks}: a plan "
                             "compiles the JAX step; add 'jax' to frameworks")
        if "plan" in self.kinds and DEFAULT_KERNELS not in self.kernels:
            raise ValueError(f"kinds includes 'plan' but kernels={self.kernels}: a plan "
                             f"compiles the reference step on virtual CPU chips (no GPU or TPU "
                             f"kernel compiles there); add {DEFAULT_KERNELS!r} to kernels")
        return self

    @model_validator(mode="after")
    def _every_dp_makes_a_mesh(self) -> "SweepSpec":
        lonely = [d for d in self.dp if not any(c % d == 0 for c in self.chips)]
        if lonely:
            raise ValueError(f"dp={lonely} divides none of chips={self.chips}: a mesh of dp "
                             f"replicas needs a chip count that is a multiple of dp; add such "
                             f"chips or drop those dp values")
        return self

    @model_validator(mode="after")
    def _attention_needs_hybrid(self) -> "SweepSpec":
        if "hybrid" in self.layers and PRESETS[self.model.preset].attention is None:
            raise ValueError(f"layers includes 'hybrid' but preset={self.model.preset!r} has no "
                             "attention geometry; use layers: gdn_only")
        # attn_cps without hybrid layers is not refused: stored specs carry its default, and
        # a dumped spec (which names every field) must validate again; gdn_only ignores it.
        return self

    def frameworks_of(self, kind: str) -> list[str]:
        """The frameworks trials of `kind` run in (plans: JAX only)."""
        return self.frameworks if kind == "measure" else ["jax"]

    def kernels_of(self, kind: str) -> list[str]:
        """The kernels trials of `kind` run (plans: the reference step only)."""
        return self.kernels if kind == "measure" else [DEFAULT_KERNELS]

    def attn_cps_of(self, layers: str) -> list[str | None]:
        """The attention CP modes trials of `layers` run: none without attention layers."""
        return list(self.attn_cps) if layers == "hybrid" else [None]

    @property
    def meshes(self) -> list[tuple[int, int]]:
        """(chips, dp) of every mesh the sweep spans: each chip count with each dp dividing it."""
        return [(chips, dp) for chips in self.chips for dp in self.dp if chips % dp == 0]

    def grid(self, kind: str = "measure"):
        """Every grid point of `kind` as (framework, kernels, layers, mode, attn_cp, layout,
        (chips, dp), seq_len, dtype, param_sharding, remat, documents), in a stable order
        (before the baseline folds meshes without CP into one mode, and before repeats: see
        grid.expand_trials); attn_cp is None for gdn_only."""
        for framework, kernels, layers in itertools.product(
                self.frameworks_of(kind), self.kernels_of(kind), self.layers):
            yield from itertools.product(
                [framework], [kernels], [layers], self.modes, self.attn_cps_of(layers),
                self.layouts, self.meshes, self.seq_lens, self.dtypes, self.param_shardings,
                self.remats, self.documents)

    @property
    def has_baseline(self) -> bool:
        """Whether chips=1 runs once as mode "none" rather than once per mode (a sweep whose
        chips or dp lack 1 has no one-chip point)."""
        return self.one_chip_baseline and (1, 1) in self.meshes

    def runs_once(self, chips: int, dp: int) -> bool:
        """Whether a mesh runs once as mode "none" rather than once per mode, attn_cp and
        layout: it has no CP (one chip per replica), and is either pure data parallel or the
        one-chip baseline."""
        return chips == dp and (dp > 1 or self.has_baseline)

    @property
    def once_meshes(self) -> list[tuple[int, int]]:
        """The meshes that run once (runs_once: the one-chip baseline, pure data parallel)."""
        return [(chips, dp) for chips, dp in self.meshes if self.runs_once(chips, dp)]

    def grid_factors(self, kind: str) -> dict[str, int]:
        """How many values of each dimension every point of `kind` is multiplied by: repeats
        (plans: 1), frameworks (plans: JAX), kernels (plans: reference), seq_lens, dtypes,
        param_shardings, remats, documents."""
        return {"repeats": self.repeats if kind == "measure" else 1,
                "frameworks": len(self.frameworks_of(kind)),
                "kernels": len(self.kernels_of(kind)), "seq_lens": len(self.seq_lens),
                "dtypes": len(self.dtypes), "param_shardings": len(self.param_shardings),
                "remats": len(self.remats), "documents": len(self.documents)}

    def cp_factors(self, layers: str) -> dict[str, int]:
        """How many values of each CP dimension a decoder of `layers` multiplies: modes,
        attn_cps (hybrid only), layouts, and the meshes run once per mode ("cp_meshes": those
        that do not run once)."""
        factors = {"modes": len(self.modes)}
        if layers == "hybrid":
            factors["attn_cps"] = len(self.attn_cps)
        return {**factors, "layouts": len(self.layouts),
                "cp_meshes": len(self.meshes) - len(self.once_meshes)}

    @property
    def grid_size(self) -> int:
        """Trials the sweep expands to (len(grid.expand_trials(self)), skipped points
        included)."""
        return sum(self.grid_size_of(kind) for kind in self.kinds)

    def grid_size_of(self, kind: str) -> int:
        """Trials of `kind`, the one count of the grid (admission's message breaks it down by
        the same factors): grid_factors × Σ over layers of (cp_factors + the once_meshes,
        each counted once)."""
        points = sum(math.prod(self.cp_factors(layers).values()) + len(self.once_meshes)
                     for layers in self.layers)
        return math.prod(self.grid_factors(kind).values()) * points


__all__ = ["AcceleratorKind", "AcceleratorSpec", "DType", "Documents", "FRAMEWORKS", "Framework",
           "MAX_CHIPS", "MAX_SEQ_LEN", "ModelSpec", "Name", "PlainText", "SweepSpec",
           "TRIAL_KINDS", "TrialKind", "check_plain_text", "known_preset"]
