"""The closed set of context-parallel modes, the shape rules each one imposes, and the one
config a CP training step takes (CPSettings).

Same names in both frameworks, the API, the database and the dashboard. A trial without
context parallelism is stored with mode NO_CP ("none"); cp_settings_for_trial and trial_mode
are the one translation between a trial's names and gdn_core's, both ways.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal, get_args

from .cp_layout import Layout, check_layout
from .kernels import DEFAULT_KERNELS, Kernels, check_kernels

if TYPE_CHECKING:
    from .config import ModelConfig

CPMode = Literal["ulysses", "p2p", "all_gather", "log_scan"]
CP_MODES: tuple[str, ...] = get_args(CPMode)
SEQUENCE_SHARDED_MODES: tuple[str, ...] = ("p2p", "all_gather", "log_scan")


AttnCPMode = Literal["all_gather_kv", "ring", "ulysses"]
"""Context parallelism of the hybrid decoder's full-attention layers (`attn_cp`), beside the
GDN layers' `mode` on the same CP group: gather K and V, pass K/V blocks around a ring, or
all-to-all to head shards."""
ATTN_CP_MODES: tuple[str, ...] = get_args(AttnCPMode)
ONE_CHIP_CP_MODE: CPMode = "p2p"
"""The mode a step without context parallelism runs as: p2p on one chip exchanges nothing (D−1
= 0 rounds; its CP and weight-sync bytes are 0), so it is the plain single-chip step. The one
name for it (a trial's mode "none", the planner's and the benchmarks' one-chip points)."""
ONE_CHIP_ATTN_CP: AttnCPMode = "all_gather_kv"
"""The attention layers' CP mode of a step without it (the one-chip hybrid): all_gather_kv on
one chip gathers nothing, plain causal attention."""
NO_CP = "none"
"""A trial's mode without context parallelism (one chip per replica: the one-chip baseline,
or pure data parallel), as the API, the database and the dashboard name it; gdn_core runs it
as ONE_CHIP_CP_MODE (cp_settings_for_trial) and trial_mode names it back."""


def gdn_mode(trial_mode: str) -> CPMode:
    """The GDN CP mode gdn_core runs for a trial's stored mode: ONE_CHIP_CP_MODE for NO_CP,
    the mode itself otherwise."""
    return ONE_CHIP_CP_MODE if trial_mode == NO_CP else trial_mode


def trial_mode(mode: str, *, cp_chips: int) -> str:
    """The inverse of gdn_mode: the mode a trial stores for a step of GDN `mode` whose replicas
    each have cp_chips chips — NO_CP when there is no sequence split (cp_chips 1)."""
    return NO_CP if cp_chips == 1 else mode


def check_mode(mode: str) -> None:
    if mode not in CP_MODES:
        raise ValueError(f"mode={mode!r} is not one of: {', '.join(CP_MODES)}")


def check_attn_cp(attn_cp: str) -> None:
    if attn_cp not in ATTN_CP_MODES:
        raise ValueError(f"attn_cp={attn_cp!r} is not one of: {', '.join(ATTN_CP_MODES)}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CPSettings:
    """How a training step splits its sequence over chips: what run_cp_training takes (torch
    and JAX), checked once here instead of at every call it passes through. Shape rules that
    need the model and seq_len (check_cp_shape, cp_layout.check_layout) stay with the step."""

    mode: CPMode
    """The GDN layers' CP mode (CP_MODES)."""
    chips: int
    """All chips of the step's mesh: dp replicas × cp_chips CP chips each. The process group
    (torch) or mesh (JAX) the step runs on has this many."""
    attn_cp: AttnCPMode = "all_gather_kv"
    """The full-attention layers' CP mode (ATTN_CP_MODES); a gdn_only model has no attention
    layers and ignores it."""
    layout: Layout = "contiguous"
    """Which tokens each chip holds (cp_layout.LAYOUTS)."""
    kernels: Kernels = DEFAULT_KERNELS
    """Which implementation the step runs (kernels.KERNELS): it travels with how the step is
    split, since a fused kernel composes with the CP exchanges."""
    dp: int = 1
    """Data-parallel replicas (torchtitan's dp_shard, MaxText's data/fsdp axis): each holds
    TrainConfig.batch_size sequences of the global batch (dp × batch_size) and splits them
    over its own cp_chips; weights, gradients and optimizer state are laid out
    (param_sharding) over all `chips`, gradients summed over all of them, CP exchanges stay
    within a replica. dp must divide chips."""

    def __post_init__(self) -> None:
        check_mode(self.mode)
        check_attn_cp(self.attn_cp)
        check_layout(self.layout)
        check_kernels(self.kernels)
        if isinstance(self.chips, bool) or not isinstance(self.chips, int) or self.chips < 1:
            raise ValueError(f"chips={self.chips!r} is not a chip count; use an integer >= 1")
        check_dp(self.dp, chips=self.chips)

    @property
    def cp_chips(self) -> int:
        """Chips of one replica's CP group (D in the mode's formulas): chips // dp."""
        return self.chips // self.dp

    @classmethod
    def one_chip(cls, *, kernels: Kernels = DEFAULT_KERNELS) -> CPSettings:
        """The step without context parallelism on one chip (ONE_CHIP_CP_MODE and
        ONE_CHIP_ATTN_CP: no exchange)."""
        return cls(mode=ONE_CHIP_CP_MODE, chips=1, attn_cp=ONE_CHIP_ATTN_CP, kernels=kernels)

    def check_shape(self, model_cfg: ModelConfig, seq_len: int) -> None:
        """Raise ValueError naming the numbers when these settings cannot split seq_len global
        tokens of model_cfg's decoder over one replica's cp_chips: the GDN layers
        (check_cp_shape with the conv halo, under the layout) and, in a hybrid decoder, the
        attention layers (check_attention_cp_shape). The one shape check of a step, both
        frameworks; with dp > 1 the message says the split is per replica."""
        gdn = model_cfg.gdn
        try:
            check_cp_shape(mode=self.mode, chips=self.cp_chips, seq_len=seq_len,
                           num_k_heads=gdn.num_k_heads, num_v_heads=gdn.num_v_heads,
                           conv_kernel_size=gdn.conv_kernel_size, layout=self.layout)
            if model_cfg.layers == "hybrid":
                attention = model_cfg.attention
                check_attention_cp_shape(attn_cp=self.attn_cp, chips=self.cp_chips,
                                         num_heads=attention.num_heads,
                                         num_kv_heads=attention.num_kv_heads,
                                         seq_len=seq_len, layout=self.layout)
        except ValueError as error:
            if self.dp == 1:
                raise
            raise ValueError(f"{error}; each of dp={self.dp} replicas splits the sequence over "
                             f"cp_chips={self.cp_chips} = chips={self.chips} / dp={self.dp}"
                             ) from error


def cp_settings_for_trial(*, mode: str, attn_cp: str | None, layout: Layout, chips: int,
                          kernels: Kernels = DEFAULT_KERNELS, dp: int = 1) -> CPSettings:
    """What gdn_core runs for a trial point (the one place a trial's names become gdn_core's):
    mode NO_CP runs as ONE_CHIP_CP_MODE (gdn_mode); attn_cp None (no attention layers, or no
    CP) as ONE_CHIP_ATTN_CP, which a gdn_only model ignores; the rest passes through."""
    return CPSettings(mode=gdn_mode(mode),
                      attn_cp=ONE_CHIP_ATTN_CP if attn_cp is None else attn_cp,
                      layout=layout, chips=chips, kernels=kernels, dp=dp)


def check_dp(dp: int, *, chips: int) -> None:
    """Raise ValueError naming the numbers unless dp is a positive integer dividing chips."""
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"dp={dp!r} is not a replica count; use an integer >= 1")
    if chips % dp:
        divisors = [d for d in range(1, chips + 1) if chips % d == 0]
        raise ValueError(f"dp={dp} does not divide chips={chips}: dp must be one of "
                         f"{', '.join(map(str, divisors))}")


def check_cp_shape(*, mode: str, chips: int, seq_len: int, num_k_heads: int, num_v_heads: int,
                   conv_kernel_size: int | None = None, layout: str = "contiguous") -> None:
    """Raise ValueError naming the numbers when `mode` cannot split this shape over `chips` in
    `layout` (the one copy of these rules: rule, layer and step checks all call it).

    seq_len is the global sequence; conv_kernel_size is given for layers (not for the bare
    rule), whose causal conv needs K−1 tokens of halo from the previous chip — under zigzag
    from before each of a chip's two segments, so each segment must hold it (ulysses moves
    heads, not halos). The layout must split seq_len (cp_layout.check_layout).
    """
    check_mode(mode)
    check_layout(layout)
    if not isinstance(chips, int) or chips < 1:
        raise ValueError(f"chips={chips!r} must be a positive integer")
    if seq_len % chips:
        raise ValueError(f"seq_len={seq_len} is not divisible by chips={chips}")
    if mode == "ulysses":
        _check_ulysses_heads(num_v_heads=num_v_heads, chips=chips)
    halo = 0 if conv_kernel_size is None else conv_kernel_size - 1
    if chips > 1 and seq_len // chips < max(halo, 1):
        raise ValueError(
            f"local shard of {seq_len // chips} tokens (seq_len={seq_len} / chips={chips}) is "
            f"shorter than the conv halo of {halo} tokens (conv_kernel_size={conv_kernel_size})")
    check_layout(layout, chips=chips, seq_len=seq_len)  # zigzag: seq_len divisible by 2D
    segment = seq_len // (2 * chips)
    if layout == "zigzag" and mode != "ulysses" and chips > 1 and segment < halo:
        raise ValueError(
            f"zigzag segment of {segment} tokens (seq_len={seq_len} / (2 × chips="
            f"{chips})) is shorter than the conv halo of {halo} tokens (conv_kernel_size="
            f"{conv_kernel_size}); use fewer chips or a longer sequence")


def _check_ulysses_heads(*, num_v_heads: int, chips: int) -> None:
    if num_v_heads % chips:
        divisors = [d for d in range(1, num_v_heads + 1) if num_v_heads % d == 0]
        raise ValueError(
            f"mode='ulysses' needs value heads ({num_v_heads}) divisible by chips={chips}; "
            f"chips must be one of {', '.join(map(str, divisors))}")


def check_attention_cp_shape(*, attn_cp: str, chips: int, num_heads: int,
                             num_kv_heads: int | None = None, seq_len: int | None = None,
                             layout: str = "contiguous") -> None:
    """Raise ValueError naming the numbers when `attn_cp` cannot split the hybrid decoder's
    full-attention layers over `chips` (ulysses: query heads divisible by chips; KV heads are
    replicated when there are fewer than chips), when num_kv_heads (if given) does not divide
    the query heads (GQA), or when `layout` cannot split seq_len (if given:
    cp_layout.check_layout). The one copy of these rules for both frameworks."""
    check_attn_cp(attn_cp)
    check_layout(layout, chips=chips, seq_len=seq_len)
    if attn_cp == "ulysses" and num_heads % chips:
        divisors = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
        more = (f"more chips ({chips}) than query heads ({num_heads}); " if chips > num_heads
                else "")
        raise ValueError(f"attn_cp='ulysses' needs query heads ({num_heads}) divisible by "
                         f"chips={chips}: {more}chips must be one of "
                         f"{', '.join(map(str, divisors))}")
    if num_kv_heads is not None and (num_kv_heads < 1 or num_heads % num_kv_heads):
        raise ValueError(f"query heads ({num_heads}) must be a multiple of key/value heads "
                         f"({num_kv_heads})")


@dataclasses.dataclass(frozen=True, slots=True)
class UlyssesHeads:
    """The heads chip j holds under ulysses (one plan for both frameworks).

    Value heads j·Hl … (j+1)·Hl − 1 (Hl = Hv/D), and the G key (and query) heads they use,
    `key_heads(j)`, ordered so that local value head i uses local key head i // (Hl/G) — the
    single-chip rule's GQA layout. Value head h uses key head h // r (r = Hv/Hk). Three cases:
        D divides Hk:   G = Hk/D, the contiguous key heads j·G … (nothing replicated);
        Hk divides D:   G = 1, key head j // (D/Hk) (each sent to D/Hk chips, as
                        DeepSpeed-Ulysses replicates KV heads);
        otherwise:      G = Hl, one key head per value head (repeats where they share one).
    The all-to-all sends D·G key heads (`send_key_heads`, block j for chip j) instead of Hk.
    """

    num_k_heads: int
    num_v_heads: int
    chips: int

    def __post_init__(self):
        if not isinstance(self.chips, int) or self.chips < 1:
            raise ValueError(f"chips={self.chips!r} must be a positive integer")
        _check_ulysses_heads(num_v_heads=self.num_v_heads, chips=self.chips)
        if self.num_k_heads < 1 or self.num_v_heads % self.num_k_heads:
            raise ValueError(f"num_v_heads={self.num_v_heads} must be a multiple of "
                             f"num_k_heads={self.num_k_heads}")

    @property
    def value_heads_per_chip(self) -> int:
        return self.num_v_heads // self.chips

    @property
    def key_heads_per_chip(self) -> int:
        Hk, D = self.num_k_heads, self.chips
        return Hk // D if Hk % D == 0 else 1 if D % Hk == 0 else self.value_heads_per_chip

    def value_heads(self, chip: int) -> range:
        Hl = self.value_heads_per_chip
        return range(chip * Hl, (chip + 1) * Hl)

    def key_heads(self, chip: int) -> tuple[int, ...]:
        """The key heads chip `chip` receives, in its local order (length G)."""
        Hk, D, G = self.num_k_heads, self.chips, self.key_heads_per_chip
        if Hk % D == 0:
            return tuple(range(chip * G, (chip + 1) * G))
        if D % Hk == 0:
            return (chip // (D // Hk),)
        r = self.num_v_heads // Hk
        return tuple(h // r for h in self.value_heads(chip))

    @property
    def send_key_heads(self) -> tuple[int, ...]:
        """Key heads in all-to-all order: chip 0's G, then chip 1's, … (D·G in all)."""
        return tuple(h for chip in range(self.chips) for h in self.key_heads(chip))
