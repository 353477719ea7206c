"""Analytical FLOP counts of the hybrid decoder's gated full-attention layers, and what
attention context parallelism runs beyond them.

Same conventions as the rest of gdn_core.flops (2 FLOPs per MAC, matmuls only, forward; × 3
for a training step; global batch). Elementwise work is neglected: q_norm / k_norm, the rotary
embedding, softmax, the sigmoid output gate.

Causal attention is counted over the (query, key) pairs the causal mask lets through:
P(T) = T·(T + 1)/2 pairs per sequence and query head, each one q·k dot product (QKᵀ) and one
weighted add of a value row (AV), head_dim MACs each. MaxText counts half the square instead,
T²/2 (its `causal_attention_flops = noncausal / 2`, maxtext.py); the difference, T/2 pairs, is
kept in the MaxText figure so each convention is exactly its own.

Packed documents (`cu_seqlens`, int [N+1], 0 … T: gdn_core.attention_documents) make attention
block-diagonal causal: a query sees only its own document's earlier keys, so the pairs are
Σ_i d_i·(d_i + 1)/2 over the document lengths d_i = c_{i+1} − c_i, not P(T)
(document_causal_pairs). The same boundaries hold for every batch row.

Letters: B batch, T tokens, E hidden size, H query heads, G key/value heads, hd head_dim,
D chips, t = T/D local tokens, s = T/(2D) tokens of a zigzag segment.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Sequence

from ..attention_documents import cu_seqlens_values
from ..cp_layout import check_layout, segments
from ..cp_modes import check_attn_cp
from .conventions import FLOPS_PER_MAC, FWD_BWD_MULTIPLIER, check_positive


def causal_pairs(seq_len: int) -> int:
    """(query, key) pairs a causal mask keeps in a sequence of seq_len tokens: T·(T + 1)/2."""
    check_positive(seq_len=seq_len)
    return seq_len * (seq_len + 1) // 2


def document_causal_pairs(seq_len: int, cu_seqlens: Sequence[int] | None = None) -> int:
    """(query, key) pairs block-diagonal causal attention keeps in one packed sequence:
    Σ_i d_i·(d_i + 1)/2 over its documents' lengths d_i (cu_seqlens, int [N+1], 0 … seq_len;
    an empty document keeps none); None: one document, causal_pairs(seq_len). ValueError
    naming the boundaries unless they run non-decreasing from 0 to seq_len."""
    check_positive(seq_len=seq_len)
    if cu_seqlens is None:
        return causal_pairs(seq_len)
    cu = cu_seqlens_values(cu_seqlens, seq_len=seq_len)
    return sum((end - start) * (end - start + 1) // 2 for start, end in zip(cu, cu[1:]))


@dataclasses.dataclass(frozen=True, slots=True)
class AttentionLayerFlops:
    """Forward FLOPs of one gated full-attention layer."""

    q_proj: int
    """Queries and the output gate: 2·B·T·E·2·H·hd."""
    kv_proj: int
    """k_proj and v_proj: 2·B·T·E·2·G·hd."""
    o_proj: int
    """2·B·T·H·hd·E."""
    scores: int
    """QKᵀ over the causal pairs: 2·B·H·hd·P, P = P(T) (one document per row) or the packed
    documents' Σ d_i·(d_i + 1)/2 (document_causal_pairs)."""
    weighted_values: int
    """AV over the causal pairs: 2·B·H·hd·P."""

    @property
    def projections(self) -> int:
        return self.q_proj + self.kv_proj + self.o_proj

    @property
    def core(self) -> int:
        """The quadratic part: QKᵀ and AV."""
        return self.scores + self.weighted_values

    @property
    def total(self) -> int:
        return self.projections + self.core


def attention_layer_flops(*, batch: int, seq_len: int, hidden_size: int, num_heads: int,
                          num_kv_heads: int, head_dim: int,
                          cu_seqlens: Sequence[int] | None = None) -> AttentionLayerFlops:
    """Count the forward FLOPs of one gated full-attention layer (Qwen3.5 / Qwen3-Next):
    q_proj yields H query heads and an H·hd output gate, GQA k/v with G heads, causal — per
    packed document when cu_seqlens (every row's boundaries) is given: the projections are
    per token and unchanged, QKᵀ and AV cover document_causal_pairs."""
    check_positive(batch=batch, seq_len=seq_len, hidden_size=hidden_size, num_heads=num_heads,
                   num_kv_heads=num_kv_heads, head_dim=head_dim)
    tokens, E, H, G, hd = batch * seq_len, hidden_size, num_heads, num_kv_heads, head_dim
    pair_macs = batch * H * hd * document_causal_pairs(seq_len, cu_seqlens)
    return AttentionLayerFlops(
        q_proj=FLOPS_PER_MAC * tokens * E * 2 * H * hd,
        kv_proj=FLOPS_PER_MAC * tokens * E * 2 * G * hd,
        o_proj=FLOPS_PER_MAC * tokens * H * hd * E,
        scores=FLOPS_PER_MAC * pair_macs,
        weighted_values=FLOPS_PER_MAC * pair_macs)


# --------------------------------------------------------------------------- under CP

def rank_causal_pairs(*, chip: int, chips: int, seq_len: int, layout: str) -> int:
    """Causal (query, key) pairs of chip `chip`'s queries: Σ (p + 1) over the global positions
    p it holds. Contiguous: chip r sums r·t … (r+1)·t − 1, so the last chip does about 2D − 1
    times the first's work; zigzag: segments r and 2D−1−r, every chip the same
    s·(2D·s + 1) pairs."""
    check_layout(layout, chips=chips, seq_len=seq_len)
    parts = segments(chip=chip, chips=chips, layout=layout)
    size = seq_len // (chips * len(parts))
    # Σ_{p=a}^{a+n−1} (p + 1) = n·a + n·(n + 1)/2 for a segment starting at a.
    return sum(size * (part * size) + size * (size + 1) // 2 for part in parts)


def attention_imbalance(*, chips: int, seq_len: int, layout: str) -> float:
    """max / min over chips of the per-chip causal attention work (rank_causal_pairs)."""
    pairs = [rank_causal_pairs(chip=r, chips=chips, seq_len=seq_len, layout=layout)
             for r in range(chips)]
    return max(pairs) / min(pairs)


def computed_pairs(attn_cp: str, *, chips: int, seq_len: int, layout: str) -> int:
    """(query, key) pairs gdn_core's attention CP computes per sequence and query head, summed
    over chips (masked pairs of a computed block included):
        one chip, ulysses  P(T): a causal kernel over the whole sequence (its masked corner
                           blocks counted as skipped, the same convention as the model count)
        all_gather_kv      T²: each chip's masked attention of its t queries to all T keys
        ring               every visible segment pair whole: a diagonal pair (same segment)
                           as s'² with its mask, a pair whose keys precede as s'², where s' is
                           the segment (t contiguous, s zigzag) — n(n+1)/2·s'² for n = D or 2D
                           segments"""
    check_attn_cp(attn_cp)
    check_layout(layout, chips=chips, seq_len=seq_len)
    if chips == 1 or attn_cp == "ulysses":
        return causal_pairs(seq_len)
    if attn_cp == "all_gather_kv":
        return seq_len * seq_len
    n = chips * (2 if layout == "zigzag" else 1)
    size = seq_len // n
    return n * (n + 1) // 2 * size * size


def attention_cp_extra_flops(attn_cp: str, *, chips: int, batch: int, seq_len: int,
                             num_heads: int, head_dim: int, num_layers: int,
                             layout: str = "contiguous") -> int:
    """FLOPs attention CP runs beyond the causal count, per training step (× 3: forward +
    backward), over `num_layers` attention layers: (computed_pairs − P(T)) pairs, each a QKᵀ
    and an AV of head_dim MACs, for every batch row and query head."""
    check_positive(chips=chips, batch=batch, seq_len=seq_len, num_heads=num_heads,
                   head_dim=head_dim)
    if num_layers == 0:
        return 0
    extra = computed_pairs(attn_cp, chips=chips, seq_len=seq_len, layout=layout) \
        - causal_pairs(seq_len)
    qk_and_av = 2
    return (FWD_BWD_MULTIPLIER * qk_and_av * FLOPS_PER_MAC * batch * num_heads * head_dim * extra
            * num_layers)


__all__ = ["AttentionLayerFlops", "attention_cp_extra_flops", "attention_imbalance",
           "attention_layer_flops", "causal_pairs", "computed_pairs", "document_causal_pairs",
           "rank_causal_pairs"]
