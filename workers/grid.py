"""The trials a sweep expands to: `TrialSpec`, its key, and `expand_trials`.

A point a mode cannot serve is kept as a trial marked skipped with the reason, never dropped
silently: a shape its CP modes or layout cannot split (cp_shape_problem), a plan of what the
planner does not compile, or a measured point predicted not to fit its chip
(memory_admission, unless the sweep sets `admit_over_memory`).

One chip is the same work whatever the CP mode, so the chips=1 points of a sweep run once per
(framework, seq_len, dtype, param_sharding, remat, layers, kernels, documents, repeat) as
trials of mode "none" (no attn_cp, layout contiguous): the one-chip baseline that every
mode's chips > 1 trials name in `baseline_key`. A pure data-parallel mesh (dp = chips: one
chip per replica, no CP) runs once the same way. What gdn_core runs for a trial's names (mode
"none", attn_cp None) is decided in one place, gdn_core.cp_modes.cp_settings_for_trial.

`dp` (data-parallel replicas) splits a trial's `chips` into dp replicas of chips / dp CP chips
(gdn_core.cp_modes.CPSettings): the shape rules, attention CP and layout apply to the CP
chips, weights are laid out over all chips, each replica trains batch_size sequences.

The decoder (`layers`): gdn_only (every layer GDN, what every sweep before issue 13 ran) or
hybrid (the published pattern: GDN layers beside gated full attention). Hybrid trials add the
attention layers' CP mode (`attn_cp`); every trial has a sequence `layout` (contiguous or
zigzag). Trial keys name a dimension only when it differs from what every trial ran before it
existed (gdn_only, contiguous, no attn_cp, reference kernels), as `repeat` and `plan/` do:
stored sweeps' keys stay what they were (resume finds them) and no two points collide
(trial_key).

`kernels` (gdn_core.kernels: reference | fused) is a dimension of every measured point, the
one-chip baseline included (a fused trial's speed-up is against the fused one chip). Whether a
fused kernel can serve a point depends on the device and packages of the worker that runs it,
so it is resolved there (trial_runner), not here; plans compile the reference step only.

`documents` (gdn_core.packing: single | uniform:LO-HI) is a step setting like dtype: every
point, plans and the one-chip baseline included (a packed trial's speed-up is against the
packed one chip), runs its step with TrainConfig.documents; the boundaries come from the
step's seed, so every process and the baseline pack the same documents.
"""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gdn_core.config import Layers, ModelConfig
from gdn_core.cp_layout import Layout
from gdn_core.cp_modes import (CP_MODES, NO_CP, AttnCPMode, CPMode, CPSettings, check_dp,
                               cp_settings_for_trial)
from gdn_core.kernels import DEFAULT_KERNELS, Kernels
from gdn_core.packing import SINGLE_DOCUMENT
from gdn_core.presets import get_preset
from gdn_core.train_config import ParamSharding, Remat, TrainConfig

from .memory_admission import memory_problem
from .sweep_spec import AcceleratorKind, Documents, DType, Framework, SweepSpec, TrialKind

TrialMode = Literal["none", CPMode]
"""A trial's mode: a CP mode, or "none" for the one-chip baseline (no context parallelism)."""
TRIAL_MODES: tuple[str, ...] = (NO_CP, *CP_MODES)
MAX_KEY_CHARS = 200
"""Longest trial key: the width of the trials.key column (service/db/models.py; a test checks
they agree). Every other dimension's longest values fit in 181 characters; a long documents
value on top of them may not, and such a point is refused rather than cut."""


def trial_key(*, framework: str, mode: str, chips: int, seq_len: int, dtype: str,
              param_sharding: str, remat: str, repeat: int | None = None,
              kind: str = "measure", layers: str = "gdn_only", attn_cp: str | None = None,
              layout: str = "contiguous", kernels: str = DEFAULT_KERNELS, dp: int = 1,
              documents: str = SINGLE_DOCUMENT) -> str:
    """Identity of a grid point within its sweep (used to resume and to refuse duplicates):
    every grid dimension, so no two points collide. A dimension added after keys were first
    stored is named only when it differs from what every trial ran before it existed: plan
    trials start with `plan/`, `/dp=n` (n > 1 replicas) follows the chips, and
    `/layers=hybrid`, `/attn_cp=…` (hybrid trials with attention CP), `/layout=zigzag`,
    `/kernels=fused`, `/documents=…` (packed) and `/repeat=r` (repeats > 1) follow the step
    settings — so keys of sweeps that have none of them stay as they were, and resume finds
    them. The omitted values are fixed (dp 1, gdn_only, no attn_cp, contiguous, reference,
    single), so keys stay distinct."""
    mesh = f"chips={chips}" if dp == 1 else f"chips={chips}/dp={dp}"
    key = (f"{framework}/{mode}/{mesh}/seq_len={seq_len}"
           f"/dtype={dtype}/param_sharding={param_sharding}/remat={remat}")
    key = key if kind == "measure" else f"{kind}/{key}"
    if layers != "gdn_only":
        key += f"/layers={layers}"
    if attn_cp is not None:
        key += f"/attn_cp={attn_cp}"
    if layout != "contiguous":
        key += f"/layout={layout}"
    if kernels != DEFAULT_KERNELS:
        key += f"/kernels={kernels}"
    if documents != SINGLE_DOCUMENT:
        key += f"/documents={documents}"
    return key if repeat is None else f"{key}/repeat={repeat}"


class TrialSpec(BaseModel):
    """One point of a sweep: everything a worker needs to run it, nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: TrialKind = "measure"
    framework: Framework
    mode: TrialMode
    """A CP mode, or "none" (cp_modes.NO_CP): the one-chip baseline (chips=1), run as
    cp_modes.ONE_CHIP_CP_MODE."""
    chips: int
    """All chips of the trial's mesh: dp replicas × chips / dp CP chips."""
    dp: int = Field(default=1, ge=1)
    """Data-parallel replicas (gdn_core.cp_modes.CPSettings.dp); divides chips."""
    seq_len: int
    batch_size: int
    """Sequences per replica: the step's global batch is dp × batch_size."""
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
    one-chip baseline (run as cp_modes.ONE_CHIP_ATTN_CP)."""
    layout: Layout = "contiguous"
    """Which tokens each chip holds (gdn_core.cp_layout)."""
    kernels: Kernels = DEFAULT_KERNELS
    """reference (this project's code) or fused (library kernels; gdn_core.kernels), resolved
    on the worker that runs the trial."""
    documents: Documents = SINGLE_DOCUMENT
    """How each sequence is packed (TrainConfig.documents; gdn_core.packing)."""
    steps: int
    warmup_steps: int
    accelerator_kind: AcceleratorKind
    accelerator_type: str
    verify: bool
    timeout_s: float
    skip_reason: str | None = None
    admit_over_memory: bool = False
    """Run it even where its predicted memory exceeds the chip's (SweepSpec.admit_over_memory):
    the worker's re-check against its device's reported memory is skipped too."""
    profile: bool = False
    """Run one extra step under the framework's profiler after the measured ones and keep its
    trace (SweepSpec.profile; workers.profiling); not part of the key: the point is the same."""
    repeat: int = Field(default=0, ge=0)
    """Which run of its grid point this is (0 … SweepSpec.repeats − 1)."""
    repeats: int = Field(default=1, ge=1)
    """How many runs its sweep asks of each point (the key names `repeat` when > 1)."""
    baseline_key: str | None = None
    """chips > 1: the key of the one-chip trial of the same framework, seq_len, step settings
    and repeat (the baseline its speed-up is measured against); None without one."""

    @model_validator(mode="after")
    def _none_is_one_chip(self) -> "TrialSpec":
        check_dp(self.dp, chips=self.chips)
        if self.mode == NO_CP and self.chips != self.dp:
            raise ValueError(f"mode='none' (no context parallelism) needs one chip per replica "
                             f"(chips = dp), got chips={self.chips}, dp={self.dp}; use one of "
                             f"{', '.join(CP_MODES)}")
        if self.repeat >= self.repeats:
            raise ValueError(f"repeat={self.repeat} must be below repeats={self.repeats}")
        if self.kind == "plan" and (self.framework != "jax" or self.kernels != DEFAULT_KERNELS):
            raise ValueError(f"kind='plan' compiles the reference JAX step; "
                             f"framework={self.framework!r}, kernels={self.kernels!r}")
        if self.attn_cp is not None and self.layers != "hybrid":
            raise ValueError(f"attn_cp={self.attn_cp!r} needs layers='hybrid' (attention "
                             f"layers to split), got layers={self.layers!r}")
        if self.mode == NO_CP and (self.attn_cp is not None or self.layout != "contiguous"):
            raise ValueError(f"mode='none' (one chip, no context parallelism) takes no attn_cp "
                             f"or layout, got attn_cp={self.attn_cp!r}, layout={self.layout!r}")
        if len(self.key) > MAX_KEY_CHARS:
            raise ValueError(f"the trial key {self.key!r} has {len(self.key)} characters, over "
                             f"the {MAX_KEY_CHARS} a stored key holds; use a shorter documents "
                             f"value ({self.documents!r}) or fewer non-default settings")
        return self

    @property
    def key(self) -> str:
        """Identity of the point within its sweep (trial_key)."""
        return trial_key(framework=self.framework, mode=self.mode, chips=self.chips,
                         seq_len=self.seq_len, dtype=self.dtype,
                         param_sharding=self.param_sharding, remat=self.remat,
                         repeat=self.repeat if self.repeats > 1 else None, kind=self.kind,
                         layers=self.layers, attn_cp=self.attn_cp, layout=self.layout,
                         kernels=self.kernels, dp=self.dp, documents=self.documents)

    @property
    def global_batch_size(self) -> int:
        """Sequences per step over all replicas: dp × batch_size."""
        return self.dp * self.batch_size

    def cp_settings(self) -> CPSettings:
        """How gdn_core splits this trial's step over its chips (cp_settings_for_trial)."""
        return cp_settings_for_trial(mode=self.mode, attn_cp=self.attn_cp, layout=self.layout,
                                 chips=self.chips, kernels=self.kernels, dp=self.dp)

    def to_model_config(self) -> ModelConfig:
        """The model this trial trains (its preset, depth, vocabulary and decoder `layers`)."""
        return get_preset(self.preset, num_layers=self.num_layers, vocab_size=self.vocab_size,
                          layers=self.layers)

    def to_train_config(self) -> TrainConfig:
        """The training-step settings this trial runs with."""
        return TrainConfig(batch_size=self.batch_size, seq_len=self.seq_len, dtype=self.dtype,
                           param_sharding=self.param_sharding, remat=self.remat,
                           documents=self.documents)


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
        seen_once = set()
        for (framework, kernels, layers, mode, attn_cp, layout, (chips, dp), seq_len, dtype,
             param_sharding, remat, documents) in spec.grid(kind):
            settings = dict(framework=framework, seq_len=seq_len, dtype=dtype,
                            param_sharding=param_sharding, remat=remat, layers=layers,
                            kernels=kernels, documents=documents)
            if spec.runs_once(chips, dp):
                if (chips, dp, *settings.values()) in seen_once:
                    continue
                seen_once.add((chips, dp, *settings.values()))
                mode, attn_cp, layout = NO_CP, None, "contiguous"
            baseline_key = None
            if chips > 1 and (1, 1) in spec.meshes and kind == "measure":
                one_chip = (dict(mode=NO_CP) if spec.has_baseline
                            else dict(mode=mode, attn_cp=attn_cp, layout=layout))
                baseline_key = trial_key(**one_chip, chips=1, **settings,
                                         repeat=repeat if spec.repeats > 1 else None)
            point = (kind, mode, attn_cp, layout, chips, dp, *settings.values())
            model_cfg = model_cfgs[layers]
            if point not in skip_reasons:
                cp = cp_settings_for_trial(mode=mode, attn_cp=attn_cp, layout=layout,
                                           chips=chips, kernels=kernels, dp=dp)
                skip_reasons[point] = _skip_reason(spec, model_cfg, cp, kind=kind, **settings)
            trials.append(TrialSpec(
                kind=kind, framework=framework, mode=mode, chips=chips, dp=dp, seq_len=seq_len,
                batch_size=spec.batch_size, preset=model_cfg.name,
                num_layers=model_cfg.num_layers, vocab_size=model_cfg.vocab_size, dtype=dtype,
                param_sharding=param_sharding, remat=remat, layers=layers, attn_cp=attn_cp,
                layout=layout, kernels=kernels, documents=documents, steps=spec.steps,
                warmup_steps=spec.warmup_steps, accelerator_kind=spec.accelerator.kind,
                accelerator_type=spec.accelerator.type,
                verify=spec.verify and chips > 1 and kind == "measure",  # 1 chip: own reference
                timeout_s=spec.trial_timeout_s, repeat=repeat,
                repeats=spec.repeats if kind == "measure" else 1,
                baseline_key=baseline_key, skip_reason=skip_reasons[point],
                admit_over_memory=spec.admit_over_memory,
                profile=spec.profile and kind == "measure"))
    return trials


def cp_shape_problem(model_cfg: ModelConfig, cp: CPSettings, *, seq_len: int) -> str | None:
    """Why the GDN mode, the attention layers' attn_cp (hybrid) or the layout of `cp` cannot
    split seq_len tokens of this model over a replica's cp.cp_chips (None: they can): the
    step's own check, CPSettings.check_shape."""
    try:
        cp.check_shape(model_cfg, seq_len)
    except ValueError as err:
        return str(err)
    return None


def _skip_reason(spec: SweepSpec, model_cfg: ModelConfig, cp: CPSettings, *, kind: str,
                 framework: str, seq_len: int, dtype: str, param_sharding: str, remat: str,
                 layers: str, kernels: str, documents: str) -> str | None:
    """Why the point cannot run: a shape its CP modes or layout cannot split, a plan of what
    the JAX planner does not compile (only the gdn_only contiguous step, on any dp × cp mesh),
    or (unless spec.admit_over_memory) a measured point's predicted memory per chip above the
    chip's — a plan allocates nothing, so any size may be planned."""
    problem = cp_shape_problem(model_cfg, cp, seq_len=seq_len)
    if problem is not None:
        return problem
    if kind == "plan" and (layers != "gdn_only" or cp.layout != "contiguous"):
        return (f"plan trials compile the gdn_only contiguous JAX step (gdn_core.jax_gdn.plan); "
                f"layers={layers!r}, layout={cp.layout!r} is not planned; use kinds: [measure]")
    if spec.admit_over_memory or kind == "plan":
        return None
    train_cfg = TrainConfig(batch_size=spec.batch_size, seq_len=seq_len, dtype=dtype,
                            param_sharding=param_sharding, remat=remat, documents=documents)
    return memory_problem(model_cfg, train_cfg, cp, framework=framework,
                          accelerator=spec.accelerator)


__all__ = ["MAX_KEY_CHARS", "TRIAL_MODES", "TrialMode", "TrialSpec", "cp_shape_problem",
           "expand_trials", "trial_key"]
