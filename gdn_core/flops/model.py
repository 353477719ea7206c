"""model_flops_per_step: the model's analytical cost of a training step, component by component.

The GDN rule in the standard chunked form, one GDN layer (projections, conv, rule), the SwiGLU
MLP, the LM head and, in the hybrid decoder, its full-attention layers (attention.py); forward,
or × 3 for a step. It depends on the model and the tokens only (how they are packed into
documents included: attention is counted per document, attention.document_causal_pairs, while
the GDN rule and every per-token matmul are linear in T and unchanged): never on the kernel
that runs the rule (`kernels`), the chip count or the CP mode, so MFU moves only with the step
time.
What an implementation runs beyond it is hardware FLOPs (rule.py, executed.py).
Conventions and letters: the package docstring (gdn_core.flops).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from .attention import attention_layer_flops
from .conventions import (FLOPS_PER_MAC, FWD_BWD_MULTIPLIER, check_chunk, check_positive, scaled,
                          sum_fields)


# --------------------------------------------------------------------------- the chunked rule

@dataclasses.dataclass(frozen=True, slots=True)
class GDNRuleFlops:
    """Forward FLOPs of the gated delta rule in the standard chunked (WY) form, one field per
    matmul, summed over the B·T tokens and Hv value heads (see gdn_rule_flops)."""

    gram: int
    """L = (β k) kᵀ inside each chunk: C·Dk MACs per token (C²·Dk per chunk, the full block)."""
    intra_chunk_attn: int
    """q kᵀ inside each chunk: C·Dk MACs per token."""
    triangular_solve: int
    """(I + L)⁻¹ applied to [β k e^G | β v] (w and u): counted as a dense C×C matrix,
    C·(Dk + Dv) MACs per token; building the inverse is implementation work (not counted)."""
    state_read: int
    """The pseudo-values u − w S_n: Dk·Dv MACs per token."""
    state_update: int
    """S_{n+1} = e^{G_C} S_n + k̃ᵀ (u − w S_n): Dk·Dv MACs per token."""
    outputs: int
    """q̃ S_n (Dk·Dv) and attn (u − w S_n) (C·Dv) MACs per token."""

    @property
    def total(self) -> int:
        return sum_fields(self)


def gdn_rule_flops(*, batch: int, seq_len: int, num_k_heads: int, num_v_heads: int,
                   head_k_dim: int, head_v_dim: int, chunk_size: int) -> GDNRuleFlops:
    """Count the forward FLOPs of the gated delta rule as the model costs it: the standard
    chunked WY form, the same for every implementation, chip count and CP mode.

    This is the form flash-linear-attention's chunk_gated_delta_rule and the Gated DeltaNet
    paper compute (WY representation w = T β k e^G, u = T β v with T = (I + L)⁻¹, then one
    pass over the chunks carrying the Dk×Dv state). Per chunk and value head (C, Dk, Dv), in
    MACs:

        gram  C²·Dk     intra-chunk attn  C²·Dk     (I+L)⁻¹ applied  C²·(Dk + Dv)
        u − w S  C·Dk·Dv     state update  C·Dk·Dv     outputs  C·Dk·Dv + C²·Dv

    that is C²·(3·Dk + 2·Dv) + 3·C·Dk·Dv per chunk, counted per token (÷ C) over the B·T
    tokens, unpadded. What an implementation runs beyond it is hardware work
    (gdn_core.flops.rule, executed.py): building (I + L)⁻¹, padding to whole chunks or
    shards, recomputation, and the reference rule's per-chunk Dk×Dk transition and state scan.
    q and k are repeated to Hv heads before any matmul, so every count is per value head and
    num_k_heads only has to divide num_v_heads.
    """
    check_positive(batch=batch, seq_len=seq_len, num_k_heads=num_k_heads,
                   num_v_heads=num_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    check_chunk(chunk_size)
    if num_v_heads % num_k_heads:
        raise ValueError(f"num_v_heads={num_v_heads} must be a multiple of "
                         f"num_k_heads={num_k_heads}")
    C, K, V = chunk_size, head_k_dim, head_v_dim
    token_heads = batch * seq_len * num_v_heads
    per_token = {
        "gram": C * K,
        "intra_chunk_attn": C * K,
        "triangular_solve": C * (K + V),
        "state_read": K * V,
        "state_update": K * V,
        "outputs": K * V + C * V,
    }
    return GDNRuleFlops(**{name: FLOPS_PER_MAC * token_heads * macs
                           for name, macs in per_token.items()})


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
    """gdn_rule_flops(...).total: the standard chunked form, whatever kernel runs it."""
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


def model_forward_flops(model_cfg: ModelConfig, *, batch: int, seq_len: int,
                        cu_seqlens: Sequence[int] | None = None) -> ModelFlops:
    """Count the forward FLOPs of the whole model on a global batch of batch × seq_len tokens
    (every layer's MLP; GDN work in the GDN layers, attention in the full-attention layers,
    per packed document when cu_seqlens, every row's boundaries, is given)."""
    gdn, (layers, attention_layers) = model_cfg.gdn, layer_counts(model_cfg)
    layer = gdn_layer_flops(batch=batch, seq_len=seq_len, hidden_size=gdn.hidden_size,
                            num_k_heads=gdn.num_k_heads, num_v_heads=gdn.num_v_heads,
                            head_k_dim=gdn.head_k_dim, head_v_dim=gdn.head_v_dim,
                            conv_kernel_size=gdn.conv_kernel_size, chunk_size=gdn.chunk_size)
    mlp = swiglu_mlp_flops(batch=batch, seq_len=seq_len, hidden_size=gdn.hidden_size,
                           intermediate_size=model_cfg.intermediate_size)
    attention = _attention_layer(model_cfg, batch=batch, seq_len=seq_len, cu_seqlens=cu_seqlens)
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


def _attention_layer(model_cfg: ModelConfig, *, batch: int, seq_len: int,
                     cu_seqlens: Sequence[int] | None):
    """One full-attention layer's forward FLOPs (None for a GDN-only decoder)."""
    if layer_counts(model_cfg)[1] == 0:
        return None
    a = model_cfg.attention
    return attention_layer_flops(batch=batch, seq_len=seq_len, hidden_size=model_cfg.hidden_size,
                                 num_heads=a.num_heads, num_kv_heads=a.num_kv_heads,
                                 head_dim=a.head_dim, cu_seqlens=cu_seqlens)


def model_flops_per_step(model_cfg: ModelConfig, *, batch: int, seq_len: int,
                         cu_seqlens: Sequence[int] | None = None) -> ModelFlops:
    """Count model_flops_per_step: 3 × forward (forward + backward), global batch, no CP work.

    MFU's numerator. It takes no kernel, framework or CP argument: a reference and a fused
    trial of the same point count the same model FLOPs (their hardware FLOPs differ:
    executed.hardware_flops_per_step). Divide by the chip count for a per-chip figure.
    cu_seqlens: the packed documents of every row (the step's packing.document_boundaries),
    None for one document per row; only the attention core depends on it (a step on
    packed documents never computes attention between them, so counting T² pairs would
    inflate its MFU).
    """
    return scaled(model_forward_flops(model_cfg, batch=batch, seq_len=seq_len,
                                      cu_seqlens=cu_seqlens), FWD_BWD_MULTIPLIER)


__all__ = ["GDNLayerFlops", "GDNRuleFlops", "ModelFlops", "depthwise_conv_flops",
           "gdn_layer_flops", "gdn_rule_flops", "layer_counts", "lm_head_flops",
           "model_flops_per_step", "model_forward_flops", "swiglu_mlp_flops"]
