"""Analytical FLOP counts of a GDN training step, MaxText's convention beside ours, MFU.

Conventions (one definition for code, database and dashboard; see ARCHITECTURE.md, Metrics):
- 2 FLOPs per multiply-accumulate (MAC). Only matmul-shaped work is counted. Elementwise work is
  neglected: decays and masks, exp, the q/k L2 norm, SiLU, the gated RMSNorm on the rule's
  output, the other RMSNorms, residual adds and the loss. It is O(tokens × channels), next to
  O(tokens × channels × width) for the matmuls.
- The embedding is a row lookup: 0 matmul FLOPs. The LM head is a matmul and is counted.
- forward + backward = 3 × forward: the backward of a matmul is two matmuls of the same size.
- Counts cover the whole global batch of one step (`batch` sequences of `seq_len` tokens).
  For a per-chip figure the caller divides by the chip count: every chip of a CP group does
  1/chips of the sequence.
- The GDN rule is counted as our chunked implementation runs it (gdn_core.torch_gdn.chunk),
  once, with the sequence padded up to a multiple of the chunk as the code pads it. No CP
  overhead is included there; `cp_overhead_flops` counts that extra work separately.

- The hybrid decoder (ModelConfig.layers "hybrid") counts its gated full-attention layers
  with gdn_core.attention_flops: projections, and QKᵀ and AV over the causal pairs
  T·(T + 1)/2 (MaxText's figure: half the square, T²/2); GDN work only in its GDN layers.

Letters: B batch, T tokens, E hidden size, Hk / Hv key / value heads, Dk / Dv head widths,
C chunk, N = ceil(T / C) chunks, K conv taps, I MLP width, L layers.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from .attention_flops import (attention_cp_extra_flops, attention_layer_flops,
                              maxtext_attention_flops)
from .config import FULL_ATTENTION, LINEAR_ATTENTION, SUPPORTED_CHUNK_SIZES, ModelConfig
from .cp_layout import check_layout
from .cp_modes import check_attention_cp_shape, check_cp_shape, check_mode
from .train_config import check_framework

FLOPS_PER_MAC = 2
"""A multiply-accumulate is a multiply and an add."""
FWD_BWD_MULTIPLIER = 3
"""Forward + backward = 3 × forward: a matmul's backward is two matmuls of its size (dX, dW)."""


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")


def _check_chunk(chunk_size: int) -> None:
    if chunk_size not in SUPPORTED_CHUNK_SIZES:
        raise ValueError(f"chunk_size={chunk_size!r} is not one of {SUPPORTED_CHUNK_SIZES}")


def _sum_fields(obj) -> int:
    return sum(getattr(obj, f.name) for f in dataclasses.fields(obj))


def _scaled(obj, factor: int):
    return dataclasses.replace(obj, **{f.name: getattr(obj, f.name) * factor
                                       for f in dataclasses.fields(obj)})


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
        return _sum_fields(self)


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
    `unit_lower_inverse_flops`). Model FLOPs keep this one convention for both frameworks;
    hardware FLOPs replace it by what each framework runs (`solve_flops`). The padded
    N = ceil(T / C) chunks are all counted.
    """
    _check_positive(batch=batch, seq_len=seq_len, num_k_heads=num_k_heads,
                    num_v_heads=num_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    _check_chunk(chunk_size)
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


def _rule_macs_per_block(chunk_size: int, head_k_dim: int, head_v_dim: int) -> int:
    """Total MACs of one (batch row, head, chunk) block of the rule (see gdn_rule_flops)."""
    C, K, V = chunk_size, head_k_dim, head_v_dim
    return C * C * (3 * K + 2 * V) + C * K * K + 3 * C * K * V + K * K * V


def unit_lower_inverse_flops(*, batch: int, seq_len: int, num_v_heads: int,
                             chunk_size: int) -> int:
    """Forward FLOPs the JAX rule spends building (I + L)⁻¹ explicitly (not in model FLOPs).

    As gdn_core.jax_gdn.chunk runs it: forward substitution on each 16×16 diagonal block, 15
    row steps of a 16-vector times a 16×16 block (240·16 MACs per block, C/16 blocks), then
    merges 16→32→…→C, each inv([[A,0],[X,B]]) = [[A⁻¹,0],[−B⁻¹XA⁻¹,B⁻¹]] two s×s×s matmuls:
    Σ_s (C/2s)·2s³ = C·(C² − 256)/3 MACs. Per chunk and value head: 240·C + C·(C² − 256)/3.
    Applying the inverse is already counted as `triangular_solve`. (The product form it
    replaced took 2·(log2 C − 1)·C³, 27× more at C = 64.)
    """
    _check_positive(batch=batch, seq_len=seq_len, num_v_heads=num_v_heads)
    _check_chunk(chunk_size)
    C = chunk_size
    blocks = batch * num_v_heads * math.ceil(seq_len / C)
    return FLOPS_PER_MAC * blocks * (240 * C + C * (C * C - 256) // 3)


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
        return _sum_fields(self)


def gdn_layer_flops(*, batch: int, seq_len: int, hidden_size: int, num_k_heads: int,
                    num_v_heads: int, head_k_dim: int, head_v_dim: int, conv_kernel_size: int,
                    chunk_size: int) -> GDNLayerFlops:
    """Count the forward FLOPs of one GDN layer: projections, conv, chunked rule, out_proj."""
    _check_positive(hidden_size=hidden_size, conv_kernel_size=conv_kernel_size)
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
    _check_positive(batch=batch, seq_len=seq_len, channels=channels, kernel_size=kernel_size)
    return FLOPS_PER_MAC * batch * seq_len * channels * kernel_size


def swiglu_mlp_flops(*, batch: int, seq_len: int, hidden_size: int,
                     intermediate_size: int) -> int:
    """Forward FLOPs of a SwiGLU MLP: gate, up (E→I) and down (I→E) matmuls, 3·2·B·T·E·I."""
    _check_positive(batch=batch, seq_len=seq_len, hidden_size=hidden_size,
                    intermediate_size=intermediate_size)
    return 3 * FLOPS_PER_MAC * batch * seq_len * hidden_size * intermediate_size


def lm_head_flops(*, batch: int, seq_len: int, hidden_size: int, vocab_size: int) -> int:
    """Forward FLOPs of the LM head (counted for every position, tied or not): 2·B·T·E·vocab."""
    _check_positive(batch=batch, seq_len=seq_len, hidden_size=hidden_size, vocab_size=vocab_size)
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
        return _sum_fields(self)


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
    return _scaled(model_forward_flops(model_cfg, batch=batch, seq_len=seq_len),
                   FWD_BWD_MULTIPLIER)


# --------------------------------------------------------------------------- MaxText's convention

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
    _check_positive(batch=batch, seq_len=seq_len, hidden_size=hidden_size,
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
    MaxText's QWEN3_NEXT branch does (attention_flops.maxtext_attention_flops: qkv and o_proj
    weights, causal attention as half the square). The MoE router's 2·B·T·E·experts is absent
    because our MLP is a dense stand-in. For the whole global batch: divide by chips for
    MaxText's per-device figure.
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


# --------------------------------------------------------------------------- CP overhead

@dataclasses.dataclass(frozen=True, slots=True)
class CPOverheadFlops:
    """Extra FLOPs of a CP mode over the single-chip rule, summed over chips, forward + backward."""

    fold: int
    """Composing each chip's chunk pairs into one (A, b) pair: D·(n − 1) compositions."""
    prefix: int
    """Turning the exchanged pairs into each chip's incoming state (all_gather, log_scan)."""
    state_apply: int
    """One A·h + b per chip: the incoming map (p2p: the chip's own pair) applied to a state."""
    shard_padding: int
    """Rule work on chunks added by padding each shard, not the whole sequence, to C tokens."""

    @property
    def total(self) -> int:
        return _sum_fields(self)


def cp_overhead_flops(mode: str, *, chips: int, batch: int, seq_len: int, num_v_heads: int,
                      head_k_dim: int, head_v_dim: int, chunk_size: int,
                      num_layers: int) -> CPOverheadFlops:
    """Count the work a CP mode adds on top of the single-chip rule (× 3 for forward + backward).

    seq_len is the global sequence; each of the D = chips chips holds T/D tokens in
    n = ceil(T / D / C) chunks. Per batch row, value head and layer, composing two affine maps
    (A·A' and A·b' + b) is Dk³ + Dk²·Dv MACs; applying one to a state (A·h + b) is Dk²·Dv.
    Counted as gdn_core's CP modes run them (torch_gdn/cp, jax_gdn/cp), summed over chips:
        fold          p2p, all_gather, log_scan  D·(n − 1) compositions (fold_chunk_pairs)
        prefix        all_gather                 D·(D − 1) applications: every chip runs the
                                                 gathered pairs over the state (the JAX scan
                                                 visits all D positions; torch stops at its own
                                                 rank unless the final state is asked for)
                      log_scan                   D·2·(ceil(log2 D) − 1) compositions: per
                                                 Hillis–Steele round after the first, one into
                                                 the exclusive and one into the sent pair (JAX
                                                 computes them on every chip under a mask;
                                                 torch skips chips that received nothing)
        state_apply   p2p, all_gather, log_scan  D applications, one per chip
        shard_padding p2p, all_gather, log_scan  rule MACs of the D·n − ceil(T / C) chunks that
                                                 padding each shard adds
    Where the implementations differ the larger count is taken, except that JAX p2p also
    computes A·h + b on every chip in each of its D − 1 rounds and discards all but one (not
    counted; Dk²·Dv each, small next to the fold). ulysses splits heads, not the sequence: no
    overhead. chips == 1 runs the single-chip rule: no overhead.
    """
    check_mode(mode)
    _check_positive(chips=chips, batch=batch, seq_len=seq_len, num_v_heads=num_v_heads,
                    head_k_dim=head_k_dim, head_v_dim=head_v_dim, num_layers=num_layers)
    _check_chunk(chunk_size)
    if seq_len % chips:
        raise ValueError(f"seq_len={seq_len} is not divisible by chips={chips}")
    if mode == "ulysses" or chips == 1:
        return CPOverheadFlops(fold=0, prefix=0, state_apply=0, shard_padding=0)
    D, K, V, C = chips, head_k_dim, head_v_dim, chunk_size
    local_chunks = math.ceil(seq_len // D / C)
    compose_macs, apply_macs = K * K * K + K * K * V, K * K * V
    prefix_macs = {
        "p2p": 0,
        "all_gather": D * (D - 1) * apply_macs,
        "log_scan": D * 2 * (math.ceil(math.log2(D)) - 1) * compose_macs,
    }[mode]
    extra_chunks = D * local_chunks - math.ceil(seq_len / C)
    scale = FWD_BWD_MULTIPLIER * FLOPS_PER_MAC * batch * num_v_heads * num_layers
    return CPOverheadFlops(
        fold=scale * D * (local_chunks - 1) * compose_macs,
        prefix=scale * prefix_macs,
        state_apply=scale * D * apply_macs,
        shard_padding=scale * extra_chunks * _rule_macs_per_block(C, K, V),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class RecomputeFlops:
    """Forward work a step runs a second time in backward (global batch, one step)."""

    layers: int
    """remat 'full': every decoder layer's forward (GDN or attention layer + MLP, CP work
    included); 'gdn': every GDN core's forward (conv and rule, its CP work included); 'none': 0."""
    lm_head: int
    """The chunked cross-entropy recomputes each token chunk's logits in backward: one more
    LM-head forward."""

    @property
    def total(self) -> int:
        return _sum_fields(self)


def recompute_flops(model_cfg: ModelConfig, *, remat: str, batch: int, seq_len: int,
                    cp_overhead: CPOverheadFlops, attention_cp: int = 0) -> RecomputeFlops:
    """Count what `remat` and the chunked loss recompute; cp_overhead is the step's GDN CP work
    and attention_cp the attention layers' (both fwd + bwd, so their forward is a
    FWD_BWD_MULTIPLIER-th)."""
    if remat not in ("none", "full", "gdn"):
        raise ValueError(f"remat={remat!r} is not one of: none, full, gdn")
    forward = model_forward_flops(model_cfg, batch=batch, seq_len=seq_len)
    cp_forward = cp_overhead.total // FWD_BWD_MULTIPLIER
    layers = {
        "none": 0,
        "full": forward.gdn_rule + forward.gdn_projections + forward.conv + forward.mlp
        + forward.attention_projections + forward.attention_core + cp_forward
        + attention_cp // FWD_BWD_MULTIPLIER,
        "gdn": forward.gdn_rule + forward.conv + cp_forward,
    }[remat]
    return RecomputeFlops(layers=layers, lm_head=forward.lm_head)


@dataclasses.dataclass(frozen=True, slots=True)
class SolveFlops:
    """(I + L)⁻¹ applied to [β v | β k e^G] as a framework runs it, against the count above.

    total = ran − counted: what hardware FLOPs add to the model count's dense-apply
    convention (negative for torch, whose triangular solve does less than a dense apply).
    """

    framework: str
    ran_forward: int
    """Forward, every rule block the step runs (padded shard chunks included)."""
    ran_backward: int
    ran_recompute: int
    """The forward again where remat recomputes the rule (gdn, full); else 0."""
    counted: int
    """What model FLOPs, CP shard padding and recompute count for it: C²·(Dv + Dk) MACs per
    block and forward, × 3 for forward + backward, + 1 forward where recomputed."""

    @property
    def total(self) -> int:
        return self.ran_forward + self.ran_backward + self.ran_recompute - self.counted


def solve_flops(framework: str, *, mode: str, chips: int, batch: int, seq_len: int,
                num_v_heads: int, head_k_dim: int, head_v_dim: int, chunk_size: int,
                num_layers: int, remat: str) -> SolveFlops:
    """Count the step's (I + L)⁻¹ work as `framework` runs it (global batch, all layers).

    Per (batch row, value head, chunk) block, with R = Dk + Dv right-hand sides (MACs):
        jax    forward   unit_lower_inverse (240·C + C·(C² − 256)/3) + apply T·rhs C²·R
               backward  apply: dT and d(rhs) C²·R each; the inverse's VJP −Tᵀ dT Tᵀ 2·C³
        torch  forward   solve_triangular, unit lower: C·(C − 1)/2 per rhs, C·(C − 1)/2·R
               backward  d(rhs): the transposed solve C·(C − 1)/2·R; dL = −d(rhs)·Xᵀ, a dense
                         C×R×C product C²·R (torch's linalg_solve_triangular_backward)
    A recomputed rule (remat gdn, full) runs its forward again. Blocks: ceil(T/C) per row and
    head (one chip, ulysses), or D·ceil(T/D/C) when the sequence is split (shard padding).
    """
    check_framework(framework)
    if remat not in ("none", "full", "gdn"):
        raise ValueError(f"remat={remat!r} is not one of: none, full, gdn")
    check_mode(mode)
    _check_positive(chips=chips, batch=batch, seq_len=seq_len, num_v_heads=num_v_heads,
                    head_k_dim=head_k_dim, head_v_dim=head_v_dim, num_layers=num_layers)
    _check_chunk(chunk_size)
    C, R = chunk_size, head_k_dim + head_v_dim
    chunks = (math.ceil(seq_len / C) if mode == "ulysses" or chips == 1
              else chips * math.ceil(seq_len // chips / C))
    blocks = batch * num_v_heads * chunks * num_layers
    apply_macs = C * C * R
    if framework == "jax":
        forward = 240 * C + C * (C * C - 256) // 3 + apply_macs
        backward = 2 * apply_macs + 2 * C ** 3
    else:
        solve = C * (C - 1) // 2 * R
        forward = solve
        backward = solve + apply_macs
    recomputed = remat in ("gdn", "full")
    counted = (FWD_BWD_MULTIPLIER + recomputed) * apply_macs
    scale = FLOPS_PER_MAC * blocks
    return SolveFlops(framework=framework, ran_forward=scale * forward,
                      ran_backward=scale * backward,
                      ran_recompute=scale * forward if recomputed else 0,
                      counted=scale * counted)


@dataclasses.dataclass(frozen=True, slots=True)
class HardwareFlops:
    """hardware_flops_per_step from the analytical count: model FLOPs, the CP work, what
    recomputation runs again, and the framework's own (I + L)⁻¹ work in place of the model
    count's convention for it."""

    model: ModelFlops
    cp_overhead: CPOverheadFlops
    recompute: RecomputeFlops
    solve: SolveFlops
    attention_cp: int = 0
    """Hybrid decoder: pairs attention CP computes beyond the causal count
    (attention_flops.attention_cp_extra_flops), fwd + bwd, all attention layers."""

    @property
    def total(self) -> int:
        return (self.model.total + self.cp_overhead.total + self.recompute.total
                + self.solve.total + self.attention_cp)


def hardware_flops_per_step(model_cfg: ModelConfig, *, mode: str, chips: int, batch: int,
                            seq_len: int, framework: str, remat: str = "none",
                            attn_cp: str = "all_gather_kv",
                            layout: str = "contiguous") -> HardwareFlops:
    """Count a step's FLOPs as run under CP `mode` on `chips` chips (global batch, fwd + bwd),
    recomputation under `remat` and the chunked loss included (HFU rises with remat, MFU not),
    with `framework`'s ("jax" or "torch", required: they run different work) (I + L)⁻¹; a
    hybrid decoder's attention layers under `attn_cp` in `layout`. The GDN CP work is
    counted for contiguous shards under either layout (zigzag's second segment per chip adds
    one state composition per chip and layer, not counted).

    Raises ValueError, like the CP modes, for a shape `mode`, `attn_cp` or `layout` cannot
    split over `chips`.
    """
    gdn, (gdn_layers, attention_layers) = model_cfg.gdn, layer_counts(model_cfg)
    check_cp_shape(mode=mode, chips=chips, seq_len=seq_len, num_k_heads=gdn.num_k_heads,
                   num_v_heads=gdn.num_v_heads, conv_kernel_size=gdn.conv_kernel_size)
    check_layout(layout, chips=chips, seq_len=seq_len)
    attention_cp = 0
    if attention_layers:
        a = model_cfg.attention
        check_attention_cp_shape(attn_cp=attn_cp, chips=chips, num_heads=a.num_heads)
        attention_cp = attention_cp_extra_flops(
            attn_cp, chips=chips, batch=batch, seq_len=seq_len, num_heads=a.num_heads,
            head_dim=a.head_dim, num_layers=attention_layers, layout=layout)
    if gdn_layers == 0:  # every layer full attention (full_attention_interval 1)
        overhead = CPOverheadFlops(fold=0, prefix=0, state_apply=0, shard_padding=0)
        solve = SolveFlops(framework=framework, ran_forward=0, ran_backward=0, ran_recompute=0,
                           counted=0)
    else:
        overhead = cp_overhead_flops(mode, chips=chips, batch=batch, seq_len=seq_len,
                                     num_v_heads=gdn.num_v_heads, head_k_dim=gdn.head_k_dim,
                                     head_v_dim=gdn.head_v_dim, chunk_size=gdn.chunk_size,
                                     num_layers=gdn_layers)
        solve = solve_flops(framework, mode=mode, chips=chips, batch=batch, seq_len=seq_len,
                            num_v_heads=gdn.num_v_heads, head_k_dim=gdn.head_k_dim,
                            head_v_dim=gdn.head_v_dim, chunk_size=gdn.chunk_size,
                            num_layers=gdn_layers, remat=remat)
    return HardwareFlops(
        model=model_flops_per_step(model_cfg, batch=batch, seq_len=seq_len),
        cp_overhead=overhead,
        recompute=recompute_flops(model_cfg, remat=remat, batch=batch, seq_len=seq_len,
                                  cp_overhead=overhead, attention_cp=attention_cp),
        solve=solve, attention_cp=attention_cp)


# --------------------------------------------------------------------------- throughput metrics

def _check_positive_number(**values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                math.isfinite(value) and value > 0):
            raise ValueError(f"{name}={value!r} must be a positive finite number")


def mfu(model_flops_per_step: float, step_time_s: float, chips: int,
        peak_flops_per_chip: float) -> float:
    """Model FLOP utilisation: model_flops_per_step / (step_time_s·chips·peak_flops_per_chip)."""
    _check_positive_number(model_flops_per_step=model_flops_per_step, step_time_s=step_time_s,
                           peak_flops_per_chip=peak_flops_per_chip)
    _check_positive(chips=chips)
    return model_flops_per_step / (step_time_s * chips * peak_flops_per_chip)


def tokens_per_s_per_chip(batch: int, seq_len: int, step_time_s: float, chips: int) -> float:
    """Training throughput per chip: batch × seq_len / step_time_s / chips."""
    _check_positive(batch=batch, seq_len=seq_len, chips=chips)
    _check_positive_number(step_time_s=step_time_s)
    return batch * seq_len / step_time_s / chips


__all__ = [
    "CPOverheadFlops", "GDNLayerFlops", "GDNRuleFlops", "HardwareFlops", "MaxTextGDNFlops",
    "MaxTextModelFlops", "ModelFlops", "RecomputeFlops", "SolveFlops", "cp_overhead_flops",
    "depthwise_conv_flops", "gdn_layer_flops", "gdn_rule_flops", "hardware_flops_per_step",
    "layer_counts", "lm_head_flops", "maxtext_gdn_flops", "maxtext_model_flops_per_step", "mfu",
    "model_flops_per_step", "model_forward_flops", "recompute_flops", "solve_flops",
    "swiglu_mlp_flops", "tokens_per_s_per_chip", "unit_lower_inverse_flops",
]
