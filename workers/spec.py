"""What a sweep asks for, and the trials it expands to.

`SweepSpec` is the one schema for the REST API's request body, sweep YAML files and `ray
submit` scripts. `expand_trials` turns it into `TrialSpec`s; a point a mode cannot serve is
kept as a trial marked skipped with the reason, never dropped silently.

One chip is the same work whatever the CP mode, so the chips=1 points of a sweep run once per
(framework, seq_len, dtype, param_sharding, remat, layers, repeat) as trials of mode "none"
(no attn_cp, layout contiguous): the one-chip baseline that every mode's chips > 1 trials
name in `baseline_key`.

The decoder (`layers`): gdn_only (every layer GDN, what every sweep before issue 13 ran) or
hybrid (the published pattern: GDN layers beside gated full attention). Hybrid trials add the
attention layers' CP mode (`attn_cp`); every trial has a sequence `layout` (contiguous or
zigzag). Trial keys name a dimension only when it differs from what every trial ran before it
existed (gdn_only, contiguous, no attn_cp), as `repeat` and `plan/` do: stored sweeps' keys
stay what they were (resume finds them) and no two points collide (trial_key).

Admission: every number is strict (`true` or "2" is not a chip count) and bounded (MAX_CHIPS,
MAX_SEQ_LEN, ...), text refuses control characters and unpaired surrogates (check_plain_text),
and a point whose predicted memory per chip exceeds the chip is kept as skipped with the
prediction, unless the sweep sets `admit_over_memory` (chip_memory_bytes, expand_trials).
"""

from __future__ import annotations

import itertools
import math
import os
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

from gdn_core import hardware
from gdn_core.config import LAYERS, Layers, ModelConfig
from gdn_core.cp_layout import LAYOUTS, Layout, check_layout
from gdn_core.cp_modes import (ATTN_CP_MODES, CP_MODES, AttnCPMode, CPMode,
                               check_attention_cp_shape, check_cp_shape)
from gdn_core.memory.step import predict_step_memory
from gdn_core.presets import PRESETS, get_preset
from gdn_core.train_config import ComputeDType, ParamSharding, Remat, TrainConfig

Framework = Literal["jax", "torch"]
FRAMEWORKS: tuple[str, ...] = ("jax", "torch")
AcceleratorKind = Literal["cpu", "gpu", "tpu"]
DType = ComputeDType
TrialMode = Literal["none", CPMode]
"""A trial's mode: a CP mode, or "none" for the one-chip baseline (no context parallelism)."""
TRIAL_MODES: tuple[str, ...] = ("none", *CP_MODES)
TrialKind = Literal["measure", "plan"]
"""measure: the step runs and is timed. plan: the JAX step is compiled for the trial's chips
(virtual CPU chips of one process) and not run — XLA's memory estimate, the compiled FLOPs and
collective bytes, for sizes no host here could run (gdn_core.jax_gdn.plan)."""
TRIAL_KINDS: tuple[str, ...] = ("measure", "plan")
ONE_CHIP_CP_MODE: CPMode = "p2p"
"""What gdn_core runs for a mode-"none" trial: p2p on one chip exchanges nothing (D−1 = 0
rounds; its CP and weight-sync bytes are 0), so it is the plain single-chip step."""
ONE_CHIP_ATTN_CP: AttnCPMode = "all_gather_kv"
"""What gdn_core runs for the attention layers of a trial without attn_cp (the one-chip
hybrid baseline): all_gather_kv on one chip gathers nothing, plain causal attention."""

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
            hardware.peak_flops_per_chip(self.type)  # ValueError lists the accepted types
        return self


class SweepSpec(BaseModel):
    """A grid of trials: kinds × frameworks × layers × modes × attn_cps (hybrid only) ×
    layouts × chips × seq_lens × dtypes × param_shardings × remats, for one model and batch,
    each measured point run `repeats` times (chips=1 once for all modes, attn_cps and layouts:
    the one-chip baseline). Plan trials are JAX's only and made once: a compile says the same
    every time."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: Name
    kinds: list[TrialKind] = _grid_list("kinds", "measure")
    frameworks: list[Framework] = Field(default=["jax", "torch"], min_length=1)
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
    chips: list[StrictInt] = Field(min_length=1, description=f"chip counts, 1 to {MAX_CHIPS}")
    seq_lens: list[StrictInt] = Field(min_length=1,
                                      description=f"global tokens per sequence, 1 to {MAX_SEQ_LEN}")
    model: ModelSpec = ModelSpec()
    batch_size: StrictInt = Field(default=1, ge=1, le=1024)
    dtypes: list[DType] = _grid_list("dtypes", "float32")
    param_shardings: list[ParamSharding] = _grid_list("param_shardings", "replicated")
    remats: list[Remat] = _grid_list("remats", "none")
    steps: StrictInt = Field(default=3, ge=1, le=10_000)
    warmup_steps: StrictInt = Field(default=1, ge=0, le=1_000)
    accelerator: AcceleratorSpec = AcceleratorSpec()
    verify: StrictBool = False
    trial_timeout_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600, strict=True)
    repeats: StrictInt = Field(default=1, ge=1, le=20)
    """Times each grid point runs, as separate trials (TrialSpec.repeat 0 … repeats−1), to
    show how much a measurement varies between runs; keys gain `/repeat=r` when > 1."""
    one_chip_baseline: StrictBool = True
    """True: chips=1 runs once per (framework, seq_len, dtype, param_sharding, remat, repeat)
    as mode "none", the baseline every mode's rows refer to (`baseline_key`). False: one chip
    per mode, as sweeps stored before the baseline existed ran (migration 0003 marks them so).
    Either way a sweep whose `chips` lacks 1 has no baseline: none is added for it."""
    admit_over_memory: StrictBool = Field(default=False, description="run grid points "
                                          "predicted not to fit the chip's memory (else they "
                                          "are recorded skipped, with the prediction)")
    """False: a point whose predicted memory per chip (gdn_core.memory) exceeds the
    chip's memory (chip_memory_bytes) is recorded skipped, the reason naming both. True: run
    such points anyway (to find where the prediction is wrong, or to record the OOM)."""

    @field_validator("chips", "seq_lens")
    @classmethod
    def _in_range_unique(cls, values: list[int], info) -> list[int]:
        high = MAX_CHIPS if info.field_name == "chips" else MAX_SEQ_LEN
        bad = [v for v in values if not 1 <= v <= high]
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (", …" if len(bad) > 5 else "")
            raise ValueError(f"{info.field_name} has values outside 1…{high}: [{shown}]; use "
                             f"integers >= 1 and <= {high}")
        return sorted(set(values))

    @field_validator("kinds", "dtypes", "param_shardings", "remats", "layers", "attn_cps",
                     "layouts", mode="before")
    @classmethod
    def _one_value_is_a_list(cls, value):
        return [value] if isinstance(value, str) else value

    @field_validator("kinds", "frameworks", "modes", "dtypes", "param_shardings", "remats",
                     "layers", "attn_cps", "layouts")
    @classmethod
    def _unique(cls, values: list[str]) -> list[str]:
        return list(dict.fromkeys(values))

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

    def attn_cps_of(self, layers: str) -> list[str | None]:
        """The attention CP modes trials of `layers` run: none without attention layers."""
        return list(self.attn_cps) if layers == "hybrid" else [None]

    def grid(self, kind: str = "measure"):
        """Every grid point of `kind` as (framework, layers, mode, attn_cp, layout, chips,
        seq_len, dtype, param_sharding, remat), in a stable order (before the baseline folds
        chips=1 into one mode, and before repeats: see expand_trials); attn_cp is None for
        gdn_only."""
        for framework, layers in itertools.product(self.frameworks_of(kind), self.layers):
            yield from itertools.product(
                [framework], [layers], self.modes, self.attn_cps_of(layers), self.layouts,
                self.chips, self.seq_lens, self.dtypes, self.param_shardings, self.remats)

    @property
    def has_baseline(self) -> bool:
        """Whether chips=1 runs once as mode "none" rather than once per mode."""
        return self.one_chip_baseline and 1 in self.chips

    @property
    def grid_size(self) -> int:
        """Trials the sweep expands to (len(expand_trials(self)), skipped points included)."""
        return sum(self.grid_size_of(kind) for kind in self.kinds)

    def grid_size_of(self, kind: str) -> int:
        """Trials of `kind`: repeats (plans: 1) × frameworks (plans: JAX) × seq_lens × dtypes
        × param_shardings × remats × Σ over layers of (modes × attn_cps (hybrid) × layouts ×
        chip counts, where chips=1 counts once when it is the baseline)."""
        multi_chip = len(self.chips) - (1 if self.has_baseline else 0)
        points = sum(len(self.modes) * len(self.attn_cps_of(layers)) * len(self.layouts)
                     * multi_chip + (1 if self.has_baseline else 0) for layers in self.layers)
        settings = math.prod(len(values) for values in (
            self.frameworks_of(kind), self.seq_lens, self.dtypes, self.param_shardings,
            self.remats))
        return (self.repeats if kind == "measure" else 1) * settings * points


def trial_key(*, framework: str, mode: str, chips: int, seq_len: int, dtype: str,
              param_sharding: str, remat: str, repeat: int | None = None,
              kind: str = "measure", layers: str = "gdn_only", attn_cp: str | None = None,
              layout: str = "contiguous") -> str:
    """Identity of a grid point within its sweep (used to resume and to refuse duplicates):
    every grid dimension, so no two points collide. A dimension added after keys were first
    stored is named only when it differs from what every trial ran before it existed: plan
    trials start with `plan/`, and `/layers=hybrid`, `/attn_cp=…` (hybrid trials with
    attention CP), `/layout=zigzag` and `/repeat=r` (repeats > 1) follow the step settings —
    so keys of sweeps that have none of them stay as they were, and resume finds them.
    The omitted values are fixed (gdn_only, no attn_cp, contiguous), so keys stay distinct."""
    key = (f"{framework}/{mode}/chips={chips}/seq_len={seq_len}"
           f"/dtype={dtype}/param_sharding={param_sharding}/remat={remat}")
    key = key if kind == "measure" else f"{kind}/{key}"
    if layers != "gdn_only":
        key += f"/layers={layers}"
    if attn_cp is not None:
        key += f"/attn_cp={attn_cp}"
    if layout != "contiguous":
        key += f"/layout={layout}"
    return key if repeat is None else f"{key}/repeat={repeat}"


class TrialSpec(BaseModel):
    """One point of a sweep: everything a worker needs to run it, nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: TrialKind = "measure"
    framework: Framework
    mode: TrialMode
    """A CP mode, or "none": the one-chip baseline (chips=1), run as ONE_CHIP_CP_MODE."""
    chips: int
    seq_len: int
    batch_size: int
    preset: str
    num_layers: int
    vocab_size: int
    dtype: DType
    param_sharding: ParamSharding = "replicated"
    remat: Remat = "none"
    layers: Layers = "gdn_only"
    """The decoder: gdn_only (every layer GDN) or hybrid (GDN + gated full attention)."""
    attn_cp: AttnCPMode | None = None
    """The attention layers' CP mode (hybrid, chips > 1); None: no attention layers, or the
    one-chip baseline (run as ONE_CHIP_ATTN_CP)."""
    layout: Layout = "contiguous"
    """Which tokens each chip holds (gdn_core.cp_layout)."""
    steps: int
    warmup_steps: int
    accelerator_kind: AcceleratorKind
    accelerator_type: str
    verify: bool
    timeout_s: float
    skip_reason: str | None = None
    repeat: int = Field(default=0, ge=0)
    """Which run of its grid point this is (0 … SweepSpec.repeats − 1)."""
    repeats: int = Field(default=1, ge=1)
    """How many runs its sweep asks of each point (the key names `repeat` when > 1)."""
    baseline_key: str | None = None
    """chips > 1: the key of the one-chip trial of the same framework, seq_len, step settings
    and repeat (the baseline its speed-up is measured against); None without one."""

    @model_validator(mode="after")
    def _none_is_one_chip(self) -> "TrialSpec":
        if self.mode == "none" and self.chips != 1:
            raise ValueError(f"mode='none' (no context parallelism) needs chips=1, got "
                             f"chips={self.chips}; use one of {', '.join(CP_MODES)}")
        if self.repeat >= self.repeats:
            raise ValueError(f"repeat={self.repeat} must be below repeats={self.repeats}")
        if self.kind == "plan" and self.framework != "jax":
            raise ValueError(f"kind='plan' compiles the JAX step; framework={self.framework!r}")
        if self.attn_cp is not None and self.layers != "hybrid":
            raise ValueError(f"attn_cp={self.attn_cp!r} needs layers='hybrid' (attention "
                             f"layers to split), got layers={self.layers!r}")
        if self.mode == "none" and (self.attn_cp is not None or self.layout != "contiguous"):
            raise ValueError(f"mode='none' (one chip, no context parallelism) takes no attn_cp "
                             f"or layout, got attn_cp={self.attn_cp!r}, layout={self.layout!r}")
        return self

    @property
    def key(self) -> str:
        """Identity of the point within its sweep (trial_key)."""
        return trial_key(framework=self.framework, mode=self.mode, chips=self.chips,
                         seq_len=self.seq_len, dtype=self.dtype,
                         param_sharding=self.param_sharding, remat=self.remat,
                         repeat=self.repeat if self.repeats > 1 else None, kind=self.kind,
                         layers=self.layers, attn_cp=self.attn_cp, layout=self.layout)

    @property
    def cp_mode(self) -> CPMode:
        """The CP mode gdn_core runs this trial with (mode "none" → ONE_CHIP_CP_MODE)."""
        return ONE_CHIP_CP_MODE if self.mode == "none" else self.mode

    @property
    def cp_attn_cp(self) -> AttnCPMode:
        """The attention CP mode gdn_core runs (None → ONE_CHIP_ATTN_CP; unused by gdn_only)."""
        return ONE_CHIP_ATTN_CP if self.attn_cp is None else self.attn_cp

    def step_kwargs(self) -> dict:
        """The CP keywords of a training step beyond `mode`: the attention layers' CP mode and
        the layout (gdn_core's defaults for a gdn_only contiguous trial, as before either
        existed)."""
        return {"attn_cp": self.cp_attn_cp, "layout": self.layout}

    def as_cp_trial(self) -> "TrialSpec":
        """This trial as the workers and gdn_core run it: mode a CP mode (see cp_mode)."""
        return self if self.mode != "none" else self.model_copy(update={"mode": self.cp_mode})

    def to_model_config(self) -> ModelConfig:
        """The model this trial trains (its preset, depth, vocabulary and decoder `layers`)."""
        return get_preset(self.preset, num_layers=self.num_layers, vocab_size=self.vocab_size,
                          layers=self.layers)

    def to_train_config(self) -> TrainConfig:
        """The training-step settings this trial runs with."""
        return TrainConfig(batch_size=self.batch_size, seq_len=self.seq_len, dtype=self.dtype,
                           param_sharding=self.param_sharding, remat=self.remat)


def expand_trials(spec: SweepSpec) -> list[TrialSpec]:
    """All trials in a stable order; points a mode cannot serve carry skip_reason, and so do
    points predicted not to fit the chip's memory (unless spec.admit_over_memory).

    Repeats are the outer loop (every point once, then every point again, …), so a noisy
    spell of the machine spreads over different points rather than all runs of one. With the
    baseline, a chips=1 point appears once, as mode "none" (no attn_cp, contiguous), where its
    first mode had it."""
    model_cfgs = {layers: get_preset(spec.model.preset, num_layers=spec.model.num_layers,
                                     vocab_size=spec.model.vocab_size, layers=layers)
                  for layers in spec.layers}
    skip_reasons: dict[tuple, str | None] = {}  # per point, shared by its repeats
    trials = []
    for repeat, kind in itertools.product(range(spec.repeats), spec.kinds):
        if kind == "plan" and repeat > 0:
            continue  # a compile says the same every time
        seen_baselines = set()
        for (framework, layers, mode, attn_cp, layout, chips, seq_len, dtype, param_sharding,
             remat) in spec.grid(kind):
            settings = dict(framework=framework, seq_len=seq_len, dtype=dtype,
                            param_sharding=param_sharding, remat=remat, layers=layers)
            if chips == 1 and spec.has_baseline:
                if tuple(settings.values()) in seen_baselines:
                    continue
                seen_baselines.add(tuple(settings.values()))
                mode, attn_cp, layout = "none", None, "contiguous"
            baseline_key = None
            if chips > 1 and 1 in spec.chips and kind == "measure":
                one_chip = (dict(mode="none") if spec.has_baseline
                            else dict(mode=mode, attn_cp=attn_cp, layout=layout))
                baseline_key = trial_key(**one_chip, chips=1, **settings,
                                         repeat=repeat if spec.repeats > 1 else None)
            point = (kind, mode, attn_cp, layout, chips, *settings.values())
            model_cfg = model_cfgs[layers]
            if point not in skip_reasons:
                skip_reasons[point] = _skip_reason(spec, model_cfg, kind=kind, mode=mode,
                                                   attn_cp=attn_cp, layout=layout, chips=chips,
                                                   **settings)
            trials.append(TrialSpec(
                kind=kind, framework=framework, mode=mode, chips=chips, seq_len=seq_len,
                batch_size=spec.batch_size, preset=model_cfg.name,
                num_layers=model_cfg.num_layers, vocab_size=model_cfg.vocab_size, dtype=dtype,
                param_sharding=param_sharding, remat=remat, layers=layers, attn_cp=attn_cp,
                layout=layout, steps=spec.steps,
                warmup_steps=spec.warmup_steps, accelerator_kind=spec.accelerator.kind,
                accelerator_type=spec.accelerator.type,
                verify=spec.verify and chips > 1 and kind == "measure",  # 1 chip: own reference
                timeout_s=spec.trial_timeout_s, repeat=repeat,
                repeats=spec.repeats if kind == "measure" else 1,
                baseline_key=baseline_key, skip_reason=skip_reasons[point]))
    return trials


def host_memory_bytes() -> int | None:
    """Physical memory of the host this process runs on (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def chip_memory_bytes(accelerator: AcceleratorSpec, chips: int) -> tuple[int | None, str]:
    """(bytes, what they are) of one chip of a `chips`-chip trial: the HBM of a GPU/TPU type
    (gdn_core.hardware.CHIP_SPECS); for CPU chips, the physical memory of the host that
    expands the sweep (the service's, or `gdn-sweep run`'s) shared by the trial's chips,
    virtual CPU chips being partitions of one host. None: unknown, nothing is refused."""
    if accelerator.kind != "cpu":
        hbm = hardware.hbm_bytes_per_chip(accelerator.type)
        return hbm, f"the {_gib(hbm)} HBM of one {accelerator.type} chip"
    host = host_memory_bytes()
    if host is None:
        return None, "unknown"
    return host // chips, (f"{_gib(host // chips)} per chip: this host's {_gib(host)} of RAM "
                           f"shared by {chips} CPU chip(s)")


def _gib(n: int) -> str:
    return f"{n / hardware.GIB:.1f} GiB"


def cp_shape_problem(model_cfg: ModelConfig, *, mode: str, attn_cp: str | None, layout: str,
                     chips: int, seq_len: int) -> str | None:
    """Why the GDN `mode`, the attention layers' `attn_cp` (hybrid) or the `layout` cannot
    split seq_len tokens of this model over chips (None: they can). Zigzag cuts the sequence
    into 2·chips segments, each of which needs the conv halo of tokens before it; ulysses
    attention needs query heads divisible by chips."""
    gdn = model_cfg.gdn
    try:
        check_cp_shape(mode=mode, chips=chips, seq_len=seq_len, num_k_heads=gdn.num_k_heads,
                       num_v_heads=gdn.num_v_heads, conv_kernel_size=gdn.conv_kernel_size)
        check_layout(layout, chips=chips, seq_len=seq_len)
        halo = gdn.conv_kernel_size - 1
        if layout == "zigzag" and chips > 1 and seq_len // (2 * chips) < halo:
            raise ValueError(f"layout='zigzag' segment of {seq_len // (2 * chips)} tokens "
                             f"(seq_len={seq_len} / (2 × chips={chips})) is shorter than the conv "
                             f"halo of {halo} tokens; use fewer chips or a longer sequence")
        if attn_cp is not None:
            check_attention_cp_shape(attn_cp=attn_cp, chips=chips,
                                     num_heads=model_cfg.attention.num_heads)
    except ValueError as err:
        return str(err)
    return None


def _skip_reason(spec: SweepSpec, model_cfg: ModelConfig, *, kind: str, framework: str,
                 mode: str, attn_cp: str | None, layout: str, chips: int, seq_len: int,
                 dtype: str, param_sharding: str, remat: str, layers: str) -> str | None:
    """Why the point cannot run: a shape its CP modes or layout cannot split, a plan of what
    the JAX planner does not compile (only the gdn_only contiguous step), or (unless
    spec.admit_over_memory) a measured point's predicted memory per chip above the chip's —
    a plan allocates nothing, so any size may be planned."""
    cp_mode = ONE_CHIP_CP_MODE if mode == "none" else mode
    problem = cp_shape_problem(model_cfg, mode=cp_mode, attn_cp=attn_cp, layout=layout,
                               chips=chips, seq_len=seq_len)
    if problem is not None:
        return problem
    if kind == "plan" and (layers != "gdn_only" or layout != "contiguous"):
        return (f"plan trials compile the gdn_only contiguous JAX step (gdn_core.jax_gdn.plan); "
                f"layers={layers!r}, layout={layout!r} is not planned; use kinds: [measure]")
    if spec.admit_over_memory or kind == "plan":
        return None
    available, what = chip_memory_bytes(spec.accelerator, chips)
    if available is None:
        return None
    train_cfg = TrainConfig(batch_size=spec.batch_size, seq_len=seq_len, dtype=dtype,
                            param_sharding=param_sharding, remat=remat)
    # What the trial allocates: a MoE preset's dense stand-in (the planner counts the experts).
    predicted = predict_step_memory(model_cfg.stand_in, train_cfg, mode=cp_mode, chips=chips,
                                    framework=framework,
                                    attn_cp=ONE_CHIP_ATTN_CP if attn_cp is None else attn_cp,
                                    layout=layout).total
    if predicted <= available:
        return None
    return (f"predicted memory {_gib(predicted)} per chip ({predicted} bytes, "
            f"gdn_core.memory.step.predict_step_memory) exceeds {what}; set "
            "admit_over_memory: true to run it anyway")


__all__ = ["ATTN_CP_MODES", "AcceleratorSpec", "CP_MODES", "FRAMEWORKS", "LAYERS", "LAYOUTS",
           "MAX_CHIPS", "MAX_SEQ_LEN", "ModelSpec", "ONE_CHIP_ATTN_CP", "ONE_CHIP_CP_MODE",
           "PlainText", "SweepSpec", "TRIAL_KINDS", "TRIAL_MODES", "TrialKind", "TrialMode",
           "TrialSpec", "check_plain_text", "chip_memory_bytes", "cp_shape_problem",
           "expand_trials", "known_preset", "trial_key"]
