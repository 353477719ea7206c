"""Model geometry: the GDN layer's shape and the language model around it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

SUPPORTED_CHUNK_SIZES = (16, 32, 64, 128)


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
class ModelConfig:
    """A GDN-only language model: embedding, num_layers × (GDN + SwiGLU MLP), LM head."""

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

    def __post_init__(self) -> None:
        for name in ("num_layers", "intermediate_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name}={value!r} must be a positive integer")
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            raise ValueError(f"ModelConfig.moe={self.moe!r} must be a MoEConfig or None")

    @property
    def stand_in(self) -> "ModelConfig":
        """The model the training step runs: a MoE preset's dense stand-in (moe=None), what
        a trial allocates and measures; a dense model itself."""
        return self if self.moe is None else dataclasses.replace(self, moe=None)

    @property
    def hidden_size(self) -> int:
        return self.gdn.hidden_size
