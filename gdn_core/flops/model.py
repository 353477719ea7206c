"""model_flops_per_step: our analytical count of a training step, component by component.

The chunked GDN rule matmul by matmul, one GDN layer (projections, conv, rule), the SwiGLU MLP,
the LM head and, in the hybrid decoder, its full-attention layers (attention.py); forward, or
× 3 for a step. No CP work, no recomputation: those are hardware FLOPs (hardware.py).
Conventions and letters: the package docstring (gdn_core.flops).
"""

from __future__ import annotations

import dataclasses
import math

from ..config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from .attention import attention_layer_flops
from .conventions import (FLOPS_PER_MAC, FWD_BWD_MULTIPLIER, check_chunk, check_positive, scaled,
                          sum_fields)


# --------------------------------------------------------------------------- the chunked rule

@dataclasses.dataclass(frozen=True, slots=True)
class GDNRuleFlops:
    """Forward FLOPs of the chunked rule, one field per matmul (summed over B · Hv · N chunks)."""

    gram: int
    """L = (β k) kᵀ inside each chunk: C·C·Dk MACs per chunk (full block, as computed)."""
    intra_chunk_attn: int
    """q kᵀ inside each chunk: C·C·Dk MACs per chunk."""
    triangular_solve: int
    """(I + L)⁻¹ applied to [β v | β k e^G]: counted as C·C·(Dv + Dk) MACs per chunk."""
    chunk_a: int
    """A_n = e^{G_C} I − k̃ᵀ w: Dk·C·Dk MACs per chunk."""
    chunk_b: int
    """b_n = k̃ᵀ u: Dk·C·Dv MACs per chunk."""
    state_scan: int
    """S_{n+1} = A_n S_n + b_n: Dk·Dk·Dv MACs per chunk (all N chunks are scanned)."""
    outputs: int
    """w S_n, q̃ S_n (C·Dk·Dv each) and attn (u − w S_n) (C·C·Dv) per chunk."""

    @property
    def total(self) -> int:
        return sum_fields(self)


def gdn_rule_flops(*, batch: int, seq_len: int, num_k_heads: int, num_v_heads: int,
                   head_k_dim: int, head_v_dim: int, chunk_size: int) -> GDNRuleFlops:
    """Count the forward FLOPs of our chunked gated delta rule, matmul by matmul.

    q and k are repeated to Hv heads before any matmul, so every count is per value head and
    num_k_heads only has to divide num_v_heads. Per chunk and value head (C, Dk, Dv):

        gram            C²·Dk          intra-chunk attn   C²·Dk
        (I+L)⁻¹ solve   C²·(Dv + Dk)   A_n               C·Dk²      b_n   C·Dk·Dv
        state scan      Dk²·Dv         outputs           2·C·Dk·Dv + C²·Dv

    The solve convention: torch.linalg.solve_triangular of the unit-lower C×C block against
    the Dv + Dk right-hand sides is counted as applying a dense C×C matrix, C²·(Dv + Dk) MACs
    (a triangular solve does about half of that; the JAX rule applies an explicit inverse of
    exactly this size, and builds that inverse at the extra cost given by
    hardware.unit_lower_inverse_flops). Model FLOPs keep this one convention for both
    frameworks; hardware FLOPs replace it by what each framework runs (hardware.solve_flops).
    The padded
    N = ceil(T / C) chunks are all counted.
    """
    check_positive(batch=batch, seq_len=seq_len, num_k_heads=num_k_heads,
                   num_v_heads=num_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    check_chunk(chunk_size)
    if num_v_heads % num_k_heads:
        raise ValueError(f"num_v_heads={num_v_heads} must be a multiple of "
                         f"num_k_heads={num_k_heads}")
    C, K, V = chunk_size, head_k_dim, head_v_dim
    blocks = batch * num_v_heads * math.ceil(seq_len / C)  # (batch row, head, chunk) blocks
    per_block = {
        "gram": C * C * K,
        "intra_chunk_attn": C * C * K,
        "triangular_solve": C * C * (V + K),
        "chunk_a": K * C * K,
        "chunk_b": K * C * V,
        "state_scan": K * K * V,
        "outputs": 2 * C * K * V + C * C * V,
    }
    return GDNRuleFlops(**{name: FLOPS_PER_MAC * blocks * macs for name, macs in per_block.items()})


def rule_macs_per_block(chunk_size: int, head_k_dim: int, head_v_dim: int) -> int:
    """Total MACs of one (batch row, head, chunk) block of the rule (see gdn_rule_flops)."""
    C, K, V = chunk_size, head_k_dim, head_v_dim
    return C * C * (3 * K + 2 * V) + C * K * K + 3 * C * K * V + K * K * V


# --------------------------------------------------------------------------- one GDN layer

@dataclasses.dataclass(frozen=True, slots=True)
class GDNLayerFlops:
    """Forward FLOPs of one GDN layer (the gated RMSNorm is elementwise and neglected)."""

    in_proj_qkv: int
    """2·B·T·E·(2·Hk·Dk + Hv·Dv)."""
    in_proj_z: int
    """2·B·T·E·Hv·Dv."""
    in_proj_b: int
    """2·B·T·E·Hv."""
    in_proj_a: int
    """2·B·T·E·Hv."""
    conv: int
    """Depthwise causal conv over q, k and v: 2·B·T·(2·Hk·Dk + Hv·Dv)·K."""
    rule: int
    """gdn_rule_flops(...).total."""
    out_proj: int
    """2·B·T·Hv·Dv·E."""

    @property
    def projections(self) -> int:
        return self.in_proj_qkv + self.in_proj_z + self.in_proj_b + self.in_proj_a + self.out_proj

    @property
    def total(self) -> int:
        return sum_fields(self)


def gdn_layer_flops(*, batch: int, seq_len: int, hidden_size: int, num_k_heads: int,
                    num_v_heads: int, head_k_dim: int, head_v_dim: int, conv_kernel_size: int,
                    chunk_size: int) -> GDNLayerFlops:
    """Count the forward FLOPs of one GDN layer: projections, conv, chunked rule, out_proj."""
    check_positive(hidden_size=hidden_size, conv_kernel_size=conv_kernel_size)
    rule = gdn_rule_flops(batch=batch, seq_len=seq_len, num_k_heads=num_k_heads,
                          num_v_heads=num_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim,
                          chunk_size=chunk_size).total
    tokens = batch * seq_len
    key_dim, value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
    return GDNLayerFlops(
        in_proj_qkv=FLOPS_PER_MAC * tokens * hidden_size * (2 * key_dim + value_dim),
        in_proj_z=FLOPS_PER_MAC * tokens * hidden_size * value_dim,
        in_proj_b=FLOPS_PER_MAC * tokens * hidden_size * num_v_heads,
        in_proj_a=FLOPS_PER_MAC * tokens * hidden_size * num_v_heads,
        conv=depthwise_conv_flops(batch=batch, seq_len=seq_len, channels=2 * key_dim + value_dim,
                                  kernel_size=conv_kernel_size),
        rule=rule,
        out_proj=FLOPS_PER_MAC * tokens * value_dim * hidden_size,
    )


def depthwise_conv_flops(*, batch: int, seq_len: int, channels: int, kernel_size: int) -> int:
    """Forward FLOPs of a depthwise causal conv: K MACs per token and channel, 2·B·T·channels·K."""
    check_positive(batch=batch, seq_len=seq_len, channels=channels, kernel_size=kernel_size)
    return FLOPS_PER_MAC * batch * seq_len * channels * kernel_size


def swiglu_mlp_flops(*, batch: int, seq_len: int, hidden_size: int,
                     intermediate_size: int) -> int:
    """Forward FLOPs of a SwiGLU MLP: gate, up (E→I) and down (I→E) matmuls, 3·2·B·T·E·I."""
    check_positive(batch=batch, seq_len=seq_len, hidden_size=hidden_size,
                   intermediate_size=intermediate_size)
    return 3 * FLOPS_PER_MAC * batch * seq_len * hidden_size * intermediate_size


def lm_head_flops(*, batch: int, seq_len: int, hidden_size: int, vocab_size: int) -> int:
    """Forward FLOPs of the LM head (counted for every position, tied or not): 2·B·T·E·vocab."""
    check_positive(batch=batch, seq_len=seq_len, hidden_size=hidden_size, vocab_size=vocab_size)
    return FLOPS_PER_MAC * batch * seq_len * hidden_size * vocab_size


# --------------------------------------------------------------------------- the model

@dataclasses.dataclass(frozen=True, slots=True)
class ModelFlops:
    """FLOPs of the model by component, summed over layers (forward, or one training step)."""

    gdn_rule: int
    """The chunked rule in every layer."""
    gdn_projections: int
    """in_proj_qkv, in_proj_z, in_proj_b, in_proj_a and out_proj in every layer."""
    conv: int
    """The depthwise conv in every layer."""
    mlp: int
    """The SwiGLU MLP in every layer."""
    lm_head: int
    """The LM head."""
    embedding: int
    """The embedding lookup: 0 (a gather, no matmul); kept so every component has a field."""
    attention_projections: int = 0
    """Hybrid decoder: q_proj (queries and gate), k/v_proj and o_proj of every full-attention
    layer (0 for a GDN-only model)."""
    attention_core: int = 0
    """Hybrid decoder: causal QKᵀ and AV of every full-attention layer."""

    @property
    def total(self) -> int:
        return sum_fields(self)


def layer_counts(model_cfg: ModelConfig) -> tuple[int, int]:
    """(GDN layers, full-attention layers) of the config's decoder (gdn_only: (L, 0))."""
    pattern = model_cfg.layer_pattern
    return pattern.count(LINEAR_ATTENTION), pattern.count(FULL_ATTENTION)


def model_forward_flops(model_cfg: ModelConfig, *, batch: int, seq_len: int) -> ModelFlops:
    """Count the forward FLOPs of the whole model on a global batch of batch × seq_len tokens
    (every layer's MLP; GDN work in the GDN layers, attention in the full-attention layers)."""
    gdn, (layers, attention_layers) = model_cfg.gdn, layer_counts(model_cfg)
    layer = gdn_layer_flops(batch=batch, seq_len=seq_len, hidden_size=gdn.hidden_size,
                            num_k_heads=gdn.num_k_heads, num_v_heads=gdn.num_v_heads,
                            head_k_dim=gdn.head_k_dim, head_v_dim=gdn.head_v_dim,
                            conv_kernel_size=gdn.conv_kernel_size, chunk_size=gdn.chunk_size)
    mlp = swiglu_mlp_flops(batch=batch, seq_len=seq_len, hidden_size=gdn.hidden_size,
                           intermediate_size=model_cfg.intermediate_size)
    attention = _attention_layer(model_cfg, batch=batch, seq_len=seq_len)
    return ModelFlops(
        gdn_rule=layers * layer.rule,
        gdn_projections=layers * layer.projections,
        conv=layers * layer.conv,
        mlp=model_cfg.num_layers * mlp,
        lm_head=lm_head_flops(batch=batch, seq_len=seq_len, hidden_size=gdn.hidden_size,
                              vocab_size=model_cfg.vocab_size),
        embedding=0,
        attention_projections=attention_layers * attention.projections if attention else 0,
        attention_core=attention_layers * attention.core if attention else 0,
    )


def _attention_layer(model_cfg: ModelConfig, *, batch: int, seq_len: int):
    """One full-attention layer's forward FLOPs (None for a GDN-only decoder)."""
    if layer_counts(model_cfg)[1] == 0:
        return None
    a = model_cfg.attention
    return attention_layer_flops(batch=batch, seq_len=seq_len, hidden_size=model_cfg.hidden_size,
                                 num_heads=a.num_heads, num_kv_heads=a.num_kv_heads,
                                 head_dim=a.head_dim)


def model_flops_per_step(model_cfg: ModelConfig, *, batch: int, seq_len: int) -> ModelFlops:
    """Count model_flops_per_step: 3 × forward (forward + backward), global batch, no CP work.

    Divide by the chip count for a per-chip figure.
    """
    return scaled(model_forward_flops(model_cfg, batch=batch, seq_len=seq_len),
                  FWD_BWD_MULTIPLIER)


__all__ = ["GDNLayerFlops", "GDNRuleFlops", "ModelFlops", "depthwise_conv_flops",
           "gdn_layer_flops", "gdn_rule_flops", "layer_counts", "lm_head_flops",
           "model_flops_per_step", "model_forward_flops", "rule_macs_per_block",
           "swiglu_mlp_flops"]
