"""Model geometry: the GDN layer's shape and the language model around it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

SUPPORTED_CHUNK_SIZES = (16, 32, 64, 128)

LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"
"""transformers' layer_types names: a GDN layer, a gated full-attention layer."""
LAYERS = ("gdn_only", "hybrid")
Layers = Literal["gdn_only", "hybrid"]


@dataclasses.dataclass(frozen=True, slots=True)
class GDNConfig:
    """Shape of one Gated DeltaNet layer (Qwen3.5 / Qwen3-Next layout)."""

    hidden_size: int
    """Width of the residual stream."""
    num_k_heads: int
    """Query/key heads (Hk)."""
    num_v_heads: int
    """Value heads (Hv); a multiple of num_k_heads."""
    head_k_dim: int
    """Query/key head width (Dk)."""
    head_v_dim: int
    """Value head width (Dv)."""
    conv_kernel_size: int = 4
    """Depthwise causal conv kernel (K); a CP shard must hold at least K-1 tokens."""
    chunk_size: int = 64
    """Tokens per chunk of the chunked rule."""
    rms_norm_eps: float = 1e-6
    """Epsilon of the gated RMSNorm on the rule's output."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim",
                     "conv_kernel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GDNConfig.{name}={value!r} must be a positive integer")
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"GDNConfig.num_v_heads={self.num_v_heads} must be a multiple of "
                f"num_k_heads={self.num_k_heads}")
        if self.chunk_size not in SUPPORTED_CHUNK_SIZES:
            raise ValueError(
                f"GDNConfig.chunk_size={self.chunk_size!r} is not one of {SUPPORTED_CHUNK_SIZES}")

    @property
    def key_dim(self) -> int:
        """Hk·Dk: width of the q (and of the k) projection."""
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        """Hv·Dv: width of the v and z projections."""
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv (q, k and v together)."""
        return 2 * self.key_dim + self.value_dim

    def conv_channels(self, key_heads: Sequence[int], value_heads: range) -> np.ndarray:
        """Conv channels [q of key_heads | k of key_heads | v of value_heads] (repeats allowed):
        the rows of conv1d.weight a head group (e.g. a ulysses chip's) convolves."""
        q_rows = (np.asarray(key_heads, dtype=np.int64)[:, None] * self.head_k_dim
                  + np.arange(self.head_k_dim)).ravel()
        v_rows = np.arange(value_heads.start * self.head_v_dim, value_heads.stop * self.head_v_dim)
        return np.concatenate([q_rows, self.key_dim + q_rows, 2 * self.key_dim + v_rows])

    @classmethod
    def from_hf(cls, hf_config: Any, *, chunk_size: int = 64) -> "GDNConfig":
        """Read a transformers Qwen3.5 / Qwen3-Next config (or its text_config)."""
        text = getattr(hf_config, "text_config", None) or hf_config
        try:
            return cls(
                hidden_size=text.hidden_size,
                num_k_heads=text.linear_num_key_heads,
                num_v_heads=text.linear_num_value_heads,
                head_k_dim=text.linear_key_head_dim,
                head_v_dim=text.linear_value_head_dim,
                conv_kernel_size=text.linear_conv_kernel_dim,
                chunk_size=chunk_size,
                rms_norm_eps=text.rms_norm_eps,
            )
        except AttributeError as err:
            raise ValueError(
                f"{type(text).__name__} is not a Qwen3.5 / Qwen3-Next config "
                f"(missing {err.name!r}); expected linear_num_key_heads, linear_num_value_heads, "
                "linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim") from err


@dataclasses.dataclass(frozen=True, slots=True)
class MoEConfig:
    """The published mixture of experts that a preset's dense MLP stands in for.

    Every layer of the modelled MoE models is a MoE layer (Qwen3NextSparseMoeBlock, which
    Qwen3.5 MoE reuses): a router (hidden → num_experts), num_experts SwiGLU experts of width
    expert_intermediate_size, and a shared SwiGLU expert of width
    shared_expert_intermediate_size (when > 0) with its sigmoid gate (hidden → 1). The step
    computes with the dense stand-in (ModelConfig.intermediate_size = active_intermediate_size
    wide), so step time and FLOPs are the stand-in's; the memory predictor counts these
    experts' parameters, gradients and optimizer state instead of the stand-in's MLP.
    """

    num_experts: int
    """Routed experts per layer (transformers: num_experts)."""
    experts_per_token: int
    """Routed experts each token is sent to (num_experts_per_tok)."""
    expert_intermediate_size: int
    """SwiGLU width of one routed expert (moe_intermediate_size)."""
    shared_expert_intermediate_size: int
    """SwiGLU width of the shared expert every token passes through; 0: none."""
    source: str
    """Where the numbers come from, and which of them are assumed rather than checked."""

    def __post_init__(self) -> None:
        for name in ("num_experts", "experts_per_token", "expert_intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"MoEConfig.{name}={value!r} must be a positive integer")
        shared = self.shared_expert_intermediate_size
        if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
            raise ValueError(f"MoEConfig.shared_expert_intermediate_size={shared!r} must be a "
                             "non-negative integer (0: no shared expert)")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"MoEConfig.experts_per_token={self.experts_per_token} exceeds "
                             f"num_experts={self.num_experts}")
        if not self.source.strip():
            raise ValueError("MoEConfig.source must name where the numbers come from")

    @property
    def active_intermediate_size(self) -> int:
        """MLP width one token passes through: its routed experts and the shared expert (the
        dense stand-in's width)."""
        return (self.experts_per_token * self.expert_intermediate_size
                + self.shared_expert_intermediate_size)


@dataclasses.dataclass(frozen=True, slots=True)
class AttentionConfig:
    """Shape of the gated full-attention layers of a hybrid decoder (transformers'
    Qwen3_5Attention / Qwen3NextAttention): q_proj yields the queries and a sigmoid output
    gate, per-head q_norm / k_norm over head_dim, rotary embedding on the first
    partial_rotary_factor of each head, grouped-query (num_kv_heads ≤ num_heads), causal."""

    num_heads: int
    """Query heads (transformers: num_attention_heads)."""
    num_kv_heads: int
    """Key/value heads (num_key_value_heads); divides num_heads."""
    head_dim: int = 256
    """Width of one query/key/value head."""
    rope_theta: float = 10_000_000.0
    """Rotary base (rope_parameters["rope_theta"])."""
    partial_rotary_factor: float = 0.25
    """Share of head_dim that is rotated; the rest passes through."""
    full_attention_interval: int = 4
    """Every full_attention_interval-th decoder layer is full attention (layers 3, 7, … at 4),
    the others GDN, unless ModelConfig.layer_types lists the pattern."""
    attention_bias: bool = False
    """Biases on q/k/v/o_proj (False in every published model)."""

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_kv_heads", "head_dim", "full_attention_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"AttentionConfig.{name}={value!r} must be a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"AttentionConfig.num_heads={self.num_heads} must be a multiple "
                             f"of num_kv_heads={self.num_kv_heads}")
        if not self.rope_theta > 0:
            raise ValueError(f"AttentionConfig.rope_theta={self.rope_theta!r} must be positive")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(f"AttentionConfig.partial_rotary_factor="
                             f"{self.partial_rotary_factor!r} must be in (0, 1]")
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ValueError(f"AttentionConfig: head_dim={self.head_dim} × partial_rotary_factor="
                             f"{self.partial_rotary_factor} = {self.rotary_dim} rotated channels; "
                             "must be a positive even number")

    @property
    def rotary_dim(self) -> int:
        """Channels of each head that are rotated (transformers: int(head_dim × factor))."""
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_types(self, num_layers: int) -> tuple[str, ...]:
        """The interval pattern over num_layers (transformers' default layer_types)."""
        return tuple(FULL_ATTENTION if (i + 1) % self.full_attention_interval == 0
                     else LINEAR_ATTENTION for i in range(num_layers))


@dataclasses.dataclass(frozen=True, slots=True)
class ModelConfig:
    """A language model: embedding, num_layers × (token mixer + SwiGLU MLP), LM head. Every
    mixer is a GDN layer (layers="gdn_only", the default), or, in the published hybrid
    (layers="hybrid"), GDN and gated full attention in layer_pattern's order."""

    name: str
    """Preset name, or 'custom'."""
    gdn: GDNConfig
    """Geometry of every GDN layer."""
    num_layers: int
    """Decoder layers, each a GDN block followed by an MLP block."""
    intermediate_size: int
    """SwiGLU MLP width."""
    vocab_size: int
    """Embedding rows and LM-head columns."""
    note: str = ""
    """What the preset stands in for (e.g. a dense MLP in place of a MoE)."""
    moe: MoEConfig | None = None
    """The published MoE the dense MLP stands in for (memory counts its experts); None for a
    dense model."""
    attention: AttentionConfig | None = None
    """The published model's gated full-attention layers; None: a GDN-only model. Only the
    hybrid decoder (torch_gdn.HybridLanguageModel) reads it."""
    layers: Layers = "gdn_only"
    """Which decoder the config describes: gdn_only (every layer GDN, what GDNLanguageModel and
    the training step build) or hybrid (GDN and full attention in layer_pattern's order)."""
    layer_types: tuple[str, ...] | None = None
    """The hybrid pattern layer by layer, when it is not attention.full_attention_interval's
    (from_hf keeps a config's own list only then)."""
    tie_word_embeddings: bool = False
    """The LM head shares the embedding's weight (hybrid decoder only)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "intermediate_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name}={value!r} must be a positive integer")
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            raise ValueError(f"ModelConfig.moe={self.moe!r} must be a MoEConfig or None")
        if self.attention is not None and not isinstance(self.attention, AttentionConfig):
            raise ValueError(f"ModelConfig.attention={self.attention!r} must be an "
                             "AttentionConfig or None")
        if self.layers not in LAYERS:
            raise ValueError(f"ModelConfig.layers={self.layers!r} is not one of: "
                             f"{', '.join(LAYERS)}")
        if self.layers == "hybrid" and self.attention is None:
            raise ValueError(f"ModelConfig {self.name!r}: layers='hybrid' needs the attention "
                             "geometry (attention=AttentionConfig(...)); this config has none")
        if self.layer_types is not None:
            kinds = tuple(self.layer_types)
            if len(kinds) != self.num_layers or set(kinds) - {LINEAR_ATTENTION, FULL_ATTENTION}:
                raise ValueError(
                    f"ModelConfig.layer_types={list(kinds)!r} must list num_layers="
                    f"{self.num_layers} entries, each {LINEAR_ATTENTION!r} or {FULL_ATTENTION!r}")
            object.__setattr__(self, "layer_types", kinds)

    @property
    def layer_pattern(self) -> tuple[str, ...]:
        """Each decoder layer's kind (LINEAR_ATTENTION or FULL_ATTENTION) in the decoder this
        config describes: all GDN under gdn_only, else layer_types or the attention interval."""
        if self.layers == "gdn_only":
            return (LINEAR_ATTENTION,) * self.num_layers
        if self.layer_types is not None:
            return self.layer_types
        return self.attention.layer_types(self.num_layers)

    @classmethod
    def from_hf(cls, hf_config: Any, *, chunk_size: int = 64, name: str = "custom",
                layers: Layers = "hybrid") -> "ModelConfig":
        """Read a whole transformers Qwen3.5 / Qwen3.5-MoE / Qwen3-Next config (or its
        text_config): the GDN geometry, the attention geometry and layer pattern, the MLP
        (a MoE's dense stand-in, with the experts in `moe`), vocabulary and head tying."""
        text = getattr(hf_config, "text_config", None) or hf_config
        gdn = GDNConfig.from_hf(text, chunk_size=chunk_size)
        kind = type(text).__name__
        rope = dict(getattr(text, "rope_parameters", None) or {})
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"{kind}.rope_parameters rope_type={rope['rope_type']!r} is not "
                             "supported; expected 'default' (plain rotary, as published)")
        try:
            num_layers = text.num_hidden_layers
            num_heads = text.num_attention_heads
            attention = AttentionConfig(
                num_heads=num_heads,
                num_kv_heads=text.num_key_value_heads,
                head_dim=getattr(text, "head_dim", None) or text.hidden_size // num_heads,
                rope_theta=float(rope.get("rope_theta", getattr(text, "rope_theta", 10_000.0))),
                partial_rotary_factor=float(rope.get(
                    "partial_rotary_factor", getattr(text, "partial_rotary_factor", 1.0))),
                full_attention_interval=_full_attention_interval(text),
                attention_bias=bool(getattr(text, "attention_bias", False)))
            moe = _moe_from_hf(text)
            intermediate = text.intermediate_size if moe is None else moe.active_intermediate_size
            kinds = tuple(text.layer_types)
            vocab_size = text.vocab_size
        except AttributeError as err:
            raise ValueError(f"{kind} is not a Qwen3.5 / Qwen3-Next config (missing "
                             f"{err.name!r}); expected num_hidden_layers, num_attention_heads, "
                             "num_key_value_heads, intermediate_size, layer_types") from err
        note = ""
        if moe is not None:
            note = (f"MoE model: the MLP is a dense SwiGLU stand-in {intermediate} wide for the "
                    f"experts active per token; {moe.source}")
        return cls(
            name=name, gdn=gdn, num_layers=num_layers, intermediate_size=intermediate,
            vocab_size=vocab_size, note=note, moe=moe, attention=attention, layers=layers,
            layer_types=None if kinds == attention.layer_types(num_layers) else kinds,
            tie_word_embeddings=bool(getattr(text, "tie_word_embeddings", False)))

    @property
    def stand_in(self) -> "ModelConfig":
        """The model the training step runs: a MoE preset's dense stand-in (moe=None), what
        a trial allocates and measures; a dense model itself."""
        return self if self.moe is None else dataclasses.replace(self, moe=None)

    @property
    def hidden_size(self) -> int:
        return self.gdn.hidden_size


def _full_attention_interval(text: Any) -> int:
    """A config's full_attention_interval: its own field, else where its first full-attention
    layer sits (transformers keeps only layer_types), else 4 (transformers' default)."""
    interval = getattr(text, "full_attention_interval", None)
    if interval:
        return int(interval)
    kinds = list(getattr(text, "layer_types", None) or [])
    return kinds.index(FULL_ATTENTION) + 1 if FULL_ATTENTION in kinds else 4


def _moe_from_hf(text: Any) -> MoEConfig | None:
    """The experts of a MoE text config (every layer a MoE layer), None for a dense one."""
    num_experts = getattr(text, "num_experts", None)
    if not num_experts:
        return None
    kind = type(text).__name__
    if getattr(text, "mlp_only_layers", None) or getattr(text, "decoder_sparse_step", 1) != 1:
        raise ValueError(f"{kind} mixes dense and MoE layers (mlp_only_layers="
                         f"{getattr(text, 'mlp_only_layers', None)!r}, decoder_sparse_step="
                         f"{getattr(text, 'decoder_sparse_step', 1)!r}); only all-MoE models "
                         "are modelled")
    return MoEConfig(num_experts=num_experts, experts_per_token=text.num_experts_per_tok,
                     expert_intermediate_size=text.moe_intermediate_size,
                     shared_expert_intermediate_size=text.shared_expert_intermediate_size,
                     source=f"read from {kind} by ModelConfig.from_hf")
