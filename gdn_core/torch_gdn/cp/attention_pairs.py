"""The segment pairs of context-parallel attention (cp.attention): which (query segment, key
segment) pairs a rank computes against a key block, and the loops that run a kernel over them.

A segment is a run of consecutive global positions of a rank's shard (cp_layout: the shard
under contiguous, each half under zigzag). Against another rank's segment a query segment is
skipped (its keys all follow), full (its keys all precede: no mask) or causal (the same
segment). Under packed documents (cu_seqlens, gdn_core.attention_documents) each pair is cut on
the host into its visible sub-pairs: causal squares, one per document piece of a diagonal
segment, and at most one unmasked rectangle of a full pair (the first query's document
reaching back); everything between documents is skipped, so no kernel needs a mask and the
fused one (sdpa's flash op, which takes none on CUDA) serves documents as it serves causal
attention.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...attention_documents import split_pair
from ...cp_layout import Layout, segments
from ..attention_kernels import AttentionKernel, merge_into

Pair = tuple[slice, slice, bool]


def _segments(rank: int, D: int, t: int, layout: Layout) -> list[tuple[slice, int]]:
    """(local slice, first global position) of each contiguous segment of a rank's shard."""
    parts = segments(chip=rank, chips=D, layout=layout)
    size = t // len(parts)
    return [(slice(i * size, (i + 1) * size), p * size) for i, p in enumerate(parts)]


def visible_pairs(q_rank: int, k_rank: int, D: int, t: int, layout: Layout,
                  cu: Sequence[int] | None = None) -> list[Pair]:
    """(q slice, k slice, causal) for each pair of segments with a visible key: causal=True on
    the diagonal (same segment: mask within), False when every key precedes every query; pairs
    whose keys all follow the queries are skipped (no work at all). cu: the global document
    boundaries (cu_seqlens' values) or None; with them each pair becomes its visible
    sub-pairs (attention_documents.split_pair: cross-document pairs and tiles skipped)."""
    pairs = []
    for q_sl, q_start in _segments(q_rank, D, t, layout):
        for k_sl, k_start in _segments(k_rank, D, t, layout):
            if k_start > q_start:
                continue
            causal = k_start == q_start
            if cu is None:
                pairs.append((q_sl, k_sl, causal))
            else:
                pairs.extend(split_pair(q_sl, q_start, k_sl, k_start, causal, cu))
    return pairs


def attend(kernel: AttentionKernel, q, k, v, o, lse, *, pairs, scale: float) -> None:
    """Merge the attention of q [B, H, t, E] to k, v [B, G, s, E] over segment `pairs` into
    the float32 running output o [B, H, t, E] and log-sum-exp lse [B, H, t], in place."""
    for q_sl, k_sl, causal in pairs:
        o_pair, lse_pair = kernel.forward(q[:, :, q_sl], k[:, :, k_sl], v[:, :, k_sl],
                                          causal=causal, scale=scale)
        merge_into(o[:, :, q_sl], lse[:, :, q_sl], o_pair, lse_pair)


def attend_backward(kernel: AttentionKernel, do, q, k, v, o, lse, dq, dk, dv, *, pairs,
                    scale: float) -> None:
    """attend's gradient over the same pairs from the final o, lse: adds each pair's share
    into the float32 dq (like q) and dk, dv (like k, v) in place."""
    for q_sl, k_sl, causal in pairs:
        dq_pair, dk_pair, dv_pair = kernel.backward(
            do[:, :, q_sl], q[:, :, q_sl], k[:, :, k_sl], v[:, :, k_sl], o[:, :, q_sl],
            lse[:, :, q_sl], causal=causal, scale=scale)
        dq[:, :, q_sl] += dq_pair
        dk[:, :, k_sl] += dk_pair
        dv[:, :, k_sl] += dv_pair
