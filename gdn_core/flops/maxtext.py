"""The training step's FLOPs as MaxText counts them, stored beside ours for comparison.

MaxText's `calculate_gated_delta_net_flops_per_device` (GDN layers: the rule in its recurrent
view, no chunk-size dependence) and the QWEN3_NEXT branch of
`calculate_tflops_training_per_device` (full-attention layers: causal attention as half the
square, T²/2, where our count (attention.py) takes the causal pairs T·(T + 1)/2), on explicit
integers, split as MaxText splits them (weights vs attention).
Letters: the package docstring (gdn_core.flops); H query heads, G key/value heads, hd head_dim.
"""

from __future__ import annotations

import dataclasses

from ..config import ModelConfig
from .conventions import FWD_BWD_MULTIPLIER, check_positive
from .model import layer_counts


@dataclasses.dataclass(frozen=True, slots=True)
class MaxTextGDNFlops:
    """Forward FLOPs of one GDN layer as MaxText counts them, split as MaxText splits them."""

    weight: int
    """Projections (in_proj_qkvz, in_proj_ba, out_proj) plus the conv."""
    attention: int
    """The rule, counted in the recurrent view: 8·Hv·Dk·Dv per token."""

    @property
    def total(self) -> int:
        return self.weight + self.attention


def maxtext_gdn_flops(*, batch: int, seq_len: int, hidden_size: int, num_k_heads: int,
                      num_v_heads: int, head_k_dim: int, head_v_dim: int,
                      conv_kernel_size: int) -> MaxTextGDNFlops:
    """MaxText's `calculate_gated_delta_net_flops_per_device`, on explicit integers.

    With Kd = Hk·Dk and Vd = Hv·Dv (MaxText passes per_device_batch_size as B):
        weight    = 2·B·T·E·(2·Kd + 2·Vd + 2·Hv)   in_proj_qkvz + in_proj_ba
                  + 2·B·T·E·Vd                     out_proj
                  + 2·B·T·K·(2·Kd + Vd)            depthwise conv
        attention = 8·B·T·Hv·Dk·Dv                 4 state-sized products per token (k kᵀ,
                                                   v kᵀ, the decayed S(I − β k kᵀ), S q), 2 FLOPs
                                                   per MAC (after Megatron-LM's GDN count)
    No chunk-size dependence: the chunked form's intra-chunk work is not counted.
    """
    check_positive(batch=batch, seq_len=seq_len, hidden_size=hidden_size,
                   num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim,
                   head_v_dim=head_v_dim, conv_kernel_size=conv_kernel_size)
    tokens = batch * seq_len
    key_dim, value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
    projections = (2 * tokens * hidden_size * (2 * key_dim + 2 * value_dim + 2 * num_v_heads)
                   + 2 * tokens * hidden_size * value_dim)
    conv = 2 * tokens * conv_kernel_size * (2 * key_dim + value_dim)
    attention = 8 * tokens * num_v_heads * head_k_dim * head_v_dim
    return MaxTextGDNFlops(weight=projections + conv, attention=attention)


@dataclasses.dataclass(frozen=True, slots=True)
class MaxTextAttentionFlops:
    """Forward FLOPs of one full-attention layer as MaxText's calculate_tflops_training_per_
    device counts it (QWEN3_NEXT branch), split as MaxText splits them."""

    weight: int
    """qkv_flops 2·B·T·E·(H + 2·G)·hd (the output gate's half of q_proj is not counted) +
    projection_flops 2·B·T·E·H·hd (o_proj)."""
    attention: int
    """causal_attention_flops: 4·B·T²·H·hd / 2 (half the square)."""

    @property
    def total(self) -> int:
        return self.weight + self.attention


def maxtext_attention_flops(*, batch: int, seq_len: int, hidden_size: int, num_heads: int,
                            num_kv_heads: int, head_dim: int) -> MaxTextAttentionFlops:
    """MaxText's count of one full-attention layer, on explicit integers (see the class)."""
    check_positive(batch=batch, seq_len=seq_len, hidden_size=hidden_size, num_heads=num_heads,
                   num_kv_heads=num_kv_heads, head_dim=head_dim)
    B, T, E, H, G, hd = batch, seq_len, hidden_size, num_heads, num_kv_heads, head_dim
    return MaxTextAttentionFlops(weight=2 * B * T * E * (H + 2 * G) * hd + 2 * B * T * E * H * hd,
                                 attention=4 * B * T * T * H * hd // 2)


@dataclasses.dataclass(frozen=True, slots=True)
class MaxTextModelFlops:
    """One training step as MaxText's calculate_tflops_training_per_device splits it (FLOPs)."""

    learnable_weight: int
    """3 × (MLP weight FLOPs over all layers, GDN weight FLOPs over the GDN layers, attention
    qkv and projection FLOPs over the full-attention layers, the embedding/LM-head matmul)."""
    attention: int
    """3 × (the GDN attention FLOPs over the GDN layers + the causal attention FLOPs over the
    full-attention layers)."""

    @property
    def total(self) -> int:
        return self.learnable_weight + self.attention


def maxtext_model_flops_per_step(model_cfg: ModelConfig, *, batch: int,
                                 seq_len: int) -> MaxTextModelFlops:
    """Count a training step of our GDN-only model the way MaxText counts Qwen3-Next.

    Per layer: the SwiGLU MLP as 2·B·T·I·E·2 (gate and up: two activations) + 2·B·T·I·E (down),
    and maxtext_gdn_flops; once per model "embedding_flops" 2·B·T·E·vocab (MaxText's name for
    the logits matmul); weight and attention parts each × 3 (forward + backward). A GDN-only
    decoder counts every layer as a GDN layer; the hybrid counts its full-attention layers as
    MaxText's QWEN3_NEXT branch does (maxtext_attention_flops: qkv and o_proj weights, causal
    attention as half the square). The MoE router's 2·B·T·E·experts is absent because our MLP
    is a dense stand-in. For the whole global batch: divide by chips for MaxText's per-device
    figure.
    """
    gdn, (gdn_layers, attention_layers) = model_cfg.gdn, layer_counts(model_cfg)
    per_layer = maxtext_gdn_flops(batch=batch, seq_len=seq_len, hidden_size=gdn.hidden_size,
                                  num_k_heads=gdn.num_k_heads, num_v_heads=gdn.num_v_heads,
                                  head_k_dim=gdn.head_k_dim, head_v_dim=gdn.head_v_dim,
                                  conv_kernel_size=gdn.conv_kernel_size)
    tokens, E, I = batch * seq_len, gdn.hidden_size, model_cfg.intermediate_size
    ffn = 2 * tokens * I * E * 2 + 2 * tokens * I * E
    embedding = 2 * tokens * E * model_cfg.vocab_size
    weights = ffn * model_cfg.num_layers + per_layer.weight * gdn_layers + embedding
    attention = per_layer.attention * gdn_layers
    if attention_layers:
        a = model_cfg.attention
        full = maxtext_attention_flops(batch=batch, seq_len=seq_len, hidden_size=E,
                                       num_heads=a.num_heads, num_kv_heads=a.num_kv_heads,
                                       head_dim=a.head_dim)
        weights += full.weight * attention_layers
        attention += full.attention * attention_layers
    return MaxTextModelFlops(learnable_weight=FWD_BWD_MULTIPLIER * weights,
                             attention=FWD_BWD_MULTIPLIER * attention)


__all__ = ["MaxTextAttentionFlops", "MaxTextGDNFlops", "MaxTextModelFlops",
           "maxtext_attention_flops", "maxtext_gdn_flops", "maxtext_model_flops_per_step"]
