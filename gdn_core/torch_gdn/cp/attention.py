"""Causal softmax attention under context parallelism: `attention_cp(q, k, v, *, group, mode,
layout)` on this rank's sequence shard, one function per `attn_cp` mode (cp_modes.ATTN_CP_MODES).

Inputs are the rank's local shard in local order (cp_layout: contiguous, or zigzag segments r
and 2D−1−r); causality is by the tokens' GLOBAL positions (cp_layout.local_positions), so every
mode serves both layouts and nothing is re-sharded.

    all_gather_kv  all-gather K and V into one buffer (the gathered [B, T, G, E] lives on
                   every rank, by design), the local queries attend to it pair by pair
                   (below); backward: dK, dV one key block (one rank's t tokens) at a time,
                   reduce-scattered as a ring: block j's accumulator starts on rank j + 1 and
                   passes from rank to rank, each adding its queries' share (float32 sums,
                   K/V's dtype on the wire), home after D − 1 hops. No rank holds the whole
                   sequence's dK, dV: the peak per rank grows with T by exactly the gathered
                   K/V, B·T·G·2E·b; no [t, T] mask exists.
    ring           K/V blocks passed around the group (D−1 hops), each attended pair by pair
                   and merged into float32 (output, log-sum-exp) statistics; the backward (a
                   custom autograd Function) passes the K/V blocks around again, each with its
                   float32 dK/dV accumulator (added to in place, so the same buffers are live
                   at every D), so only this rank's own q, k, v, o and log-sum-exp are saved.
    ulysses        all-to-all from sequence shards to head shards (query heads H/D per rank,
                   the key/value heads they use: cp_modes.UlyssesHeads, replicated when G < D),
                   one-chip causal attention over the whole sequence (one causal segment
                   pair, as one rank's of one, through the kernel), all-to-all of o back. (Not
                   plain scaled_dot_product_attention: with GQA in float32 on CUDA it can fall
                   back to the math kernel's [T, T] scores; `sdpa` calls the flash op itself.)

Kernels (every mode): a rank's queries meet a key block segment pair by segment pair
(attention_pairs.visible_pairs: pairs whose keys all precede the queries unmasked, diagonal
pairs causal, pairs whose keys all follow skipped, so both layouts do only the causal work;
under packed documents, `cu_seqlens`, each pair cut into its visible sub-pairs, the work
between documents skipped, so no kernel takes a mask); each pair is one call
of an attention kernel (torch_gdn.attention_kernels: `tiles`, the blockwise reference, or
`sdpa`, one fused SDPA flash call), whose (output, log-sum-exp) are merged into float32
statistics. The backward calls the kernel's backward per pair with the FINAL merged output
and log-sum-exp (P recomputed from it, Δ = rowsum(dO ∘ O)), summing the pairs' dq, dk, dv in
float32. Saved: q, k, v (all_gather_kv: the gathered K/V), o and the log-sum-exp; q, k, v stay
in their dtype (bf16 runs bf16 attention with float32 statistics, in both kernels). Under
`tiles` the temporaries are about two float32 tiles of [B, H, block, block] (ulysses: H/D
heads) plus pair-sized float32 statistics, whatever t and T, so no memory grows with t² or
t·T; the price is one Python step per tile: (t/block)·(T/block)/2 per rank and layer, about.

Bytes each rank RECEIVES per attention layer (t = T/D local tokens, b the item size of q/k/v,
Gl = key/value heads per rank under ulysses: G/D if D divides G, 1 if G divides D, else H/D),
`attention_comm_bytes`:
    all_gather_kv  forward (D−1)·B·t·G·2E·b;  backward (the ring reduce-scatter of dK, dV,
                   in K/V's dtype) the same
    ring           forward (D−1)·B·t·G·2E·b;  backward (D−1)·B·t·G·2E·(b + 4): K/V again and
                   the float32 dK/dV accumulators (D−2 hops on, one hop home)
    ulysses        forward (D−1)·B·t·E·b·(2·H/D + 2·Gl);  backward the same
Dependent rounds: all_gather_kv 1 (forward; backward D−1 ring hops), ring D−1 (forward;
backward D−1 more), ulysses 2 all-to-all.
Shape legend: B batch, t local tokens, T global tokens, H query heads, G key/value heads,
E head_dim, r = H/G queries per key/value head.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...attention_documents import cu_seqlens_values
from ...cp_layout import Layout
from ...cp_modes import (
    AttnCPMode,
    UlyssesHeads,
    check_attention_cp_shape,
    check_attn_cp,
)
from ..attention_kernels import (
    BLOCK_TOKENS,
    AttentionKernel,
    AttentionKernelName,
    attention_kernel,
)
from .attention_pairs import attend as _attend
from .attention_pairs import attend_backward as _attend_backward
from .attention_pairs import visible_pairs as _visible_pairs
from .comm import nbytes, no_deprecation_warning, rank_size, record, send_recv
from .ulysses import heads_to_seq, key_heads_for_chips, seq_to_heads

_TAG = 80  # ring: K/V forward 80, K/V backward 81, dK/dV backward 82; all_gather_kv dK/dV 83


def ulysses_kv_heads_per_chip(*, num_heads: int, num_kv_heads: int, chips: int) -> int:
    """Key/value heads each rank receives under ulysses (replicated when G < D)."""
    return UlyssesHeads(num_k_heads=num_kv_heads, num_v_heads=num_heads,
                        chips=chips).key_heads_per_chip


def attention_comm_bytes(mode: AttnCPMode, *, chips: int, batch: int, local_tokens: int,
                         num_heads: int, num_kv_heads: int, head_dim: int,
                         itemsize: int = 4) -> tuple[int, int]:
    """(forward, backward) bytes one rank receives for one attention layer (the module
    docstring's formulas; any layout: every rank receives the same)."""
    check_attn_cp(mode)
    D, B, t, H, G, E, b = chips, batch, local_tokens, num_heads, num_kv_heads, head_dim, itemsize
    kv_block = B * t * G * 2 * E
    if mode == "all_gather_kv":
        return (D - 1) * kv_block * b, (D - 1) * kv_block * b
    if mode == "ring":
        return (D - 1) * kv_block * b, (D - 1) * kv_block * (b + 4)
    Gl = ulysses_kv_heads_per_chip(num_heads=H, num_kv_heads=G, chips=D)
    each = (D - 1) * B * t * E * b * (2 * H // D + 2 * Gl)
    return each, each


def attention_cp(q_BtHE: torch.Tensor, k_BtGE: torch.Tensor, v_BtGE: torch.Tensor, *, group,
                 mode: AttnCPMode, layout: Layout = "contiguous", scale: float | None = None,
                 kernel: AttentionKernelName = "tiles", block: int = BLOCK_TOKENS,
                 cu_seqlens=None) -> torch.Tensor:
    """Causal attention output o [B, t, H, E] (q's dtype) for this rank's queries.

    q [B, t, H, E], k, v [B, t, G, E]: this rank's shard in `layout`'s local order; query head
    h reads key/value head h // (H/G); scale defaults to E^−½; `kernel`: the attention kernel
    of each segment pair (attention_kernels: "tiles", the reference, or "sdpa", fused);
    `block`: tokens per tile of the tiles kernel; `cu_seqlens`: None (one causal sequence:
    today's work, unchanged) or packed documents, the GLOBAL boundaries (int [N+1], 0 … T =
    t·D, flash-linear-attention's convention; a tensor, array or sequence, the same on every
    rank, read on the host): attention is then block-diagonal causal (a query sees the keys of
    its own document at or before it; gdn_core.attention_documents), the pairs that cross
    documents are skipped (attention_pairs.visible_pairs). Rotary positions stay global (the
    caller's). Every rank of `group` must call it with the same shapes, kernel and
    cu_seqlens (it exchanges). Raises ValueError naming the numbers when `mode` cannot serve
    the shape or cu_seqlens is malformed (checked before any exchange, on every rank alike).
    """
    attn_kernel = attention_kernel(kernel, block=block)
    D = rank_size(group)[1]
    _, t, H, E = q_BtHE.shape
    check_attention_cp_shape(attn_cp=mode, chips=D, num_heads=H, num_kv_heads=k_BtGE.shape[2],
                             seq_len=t * D, layout=layout)
    scale = E ** -0.5 if scale is None else scale
    cu = None if cu_seqlens is None else cu_seqlens_values(cu_seqlens, seq_len=t * D)
    if mode == "all_gather_kv":
        return _AllGatherKVAttention.apply(q_BtHE, k_BtGE, v_BtGE, group, layout, scale,
                                           attn_kernel, cu)
    if mode == "ulysses":
        return _ulysses(q_BtHE, k_BtGE, v_BtGE, group=group, layout=layout, scale=scale,
                        kernel=attn_kernel, cu=cu)
    return _RingAttention.apply(q_BtHE, k_BtGE, v_BtGE, group, layout, scale, attn_kernel, cu)


def _no_autocast(x: torch.Tensor):
    """The kernels choose their own precision: autocast must not recast their operands."""
    return torch.autocast(device_type=x.device.type, enabled=False)


# ---------------------------------------------------------------- all_gather_kv

class _AllGatherKVAttention(torch.autograd.Function):
    """all_gather_kv: every rank's K/V block gathered into one [D, 2, B, t, G, E] buffer (a
    single-buffer all_gather, which gloo serves on any subgroup), this rank's queries against
    it pair by pair; saves q, the gathered buffer, o and the log-sum-exp.

    Backward: dK, dV one key block at a time, reduce-scattered as a ring. The accumulator of
    block j starts on rank j + 1 and passes from rank to rank (each adding its queries' share,
    summed in float32, sent in K/V's dtype as a reduce-scatter would), arriving home after
    D − 1 hops. So no rank holds the whole sequence's dK, dV beside the gathered K, V: at most
    two blocks' accumulators (the one sent, the one received) at any moment, whatever D."""

    @staticmethod
    def forward(ctx, q_BtHE, k_BtGE, v_BtGE, group, layout, scale, kernel, cu):
        rank, D = rank_size(group)
        kv_2BtGE = torch.stack([k_BtGE, v_BtGE])  # one message, contiguous
        # torch's single-buffer collectives stack the ranks' blocks along dim 0
        gathered = kv_2BtGE.new_empty((D * 2, *kv_2BtGE.shape[1:]))
        with no_deprecation_warning():
            dist.all_gather_into_tensor(gathered, kv_2BtGE, group=group)
        record("attn_all_gather_kv", (D - 1) * nbytes(kv_2BtGE), backward=False)
        gathered = gathered.view(D, *kv_2BtGE.shape)
        del kv_2BtGE
        o, lse = _attend_gathered(q_BtHE, gathered, rank, layout, scale, kernel, cu)
        ctx.save_for_backward(q_BtHE, gathered, o, lse)
        ctx.group, ctx.layout, ctx.scale, ctx.kernel, ctx.cu = group, layout, scale, kernel, cu
        return _tokens_first(o, q_BtHE.dtype)

    @staticmethod
    def backward(ctx, do_BtHE):
        q_BtHE, gathered, o, lse = ctx.saved_tensors
        rank, D = rank_size(ctx.group)
        t = q_BtHE.shape[1]
        with _no_autocast(q_BtHE):
            q, do = _heads_first(q_BtHE), _heads_first(do_BtHE)
            dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            d_kv = None  # float32 [2, B, t, G, E]: the accumulator of the block held
            for hop in range(D):
                k_rank = (rank - 1 - hop) % D  # block `rank` comes last, home
                if hop:  # send the accumulator just added to, receive the next block's
                    d_kv = _pass_on(d_kv.to(gathered.dtype), group=ctx.group, tag=_TAG + 3,
                                    backward=True, op="attn_all_gather_kv").float()
                else:
                    d_kv = torch.zeros(gathered.shape[1:], dtype=torch.float32,
                                       device=gathered.device)
                k, v = _keys_values(gathered[k_rank])
                dk, dv = _keys_values(d_kv)  # views: added to in place
                _attend_backward(ctx.kernel, do, q, k, v, o, lse, dq, dk, dv,
                                 scale=ctx.scale,
                                 pairs=_visible_pairs(rank, k_rank, D, t, ctx.layout, ctx.cu))
            dk_BtGE, dv_BtGE = d_kv.to(gathered.dtype).unbind(0)
        return (_tokens_first(dq, q_BtHE.dtype), dk_BtGE, dv_BtGE, None, None, None, None,
                None)


def _attend_gathered(q_BtHE, gathered, rank: int, layout: Layout, scale: float,
                     kernel: AttentionKernel, cu=None):
    """float32 (o [B, H, t, E], log-sum-exp [B, H, t]) of rank `rank`'s queries against every
    rank's K/V block of the gathered [D, 2, B, t, G, E] buffer (cu: document boundaries)."""
    D, t = gathered.shape[0], q_BtHE.shape[1]
    with _no_autocast(q_BtHE):
        q = _heads_first(q_BtHE)
        o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        for k_rank in range(D):
            k, v = _keys_values(gathered[k_rank])
            _attend(kernel, q, k, v, o, lse, scale=scale,
                    pairs=_visible_pairs(rank, k_rank, D, t, layout, cu))
    return o, lse


class _GatheredAttention(torch.autograd.Function):
    """Rank `rank`'s queries against a given [D, 2, B, t, G, E] K/V buffer, pair by pair;
    saves q, the buffer, o and the log-sum-exp; backward: the gradient of the whole buffer
    (float32 while built). ulysses uses it as a lone rank: D = 1, the whole sequence of its
    heads (no whole-sequence gradient beyond that rank's own K/V)."""

    @staticmethod
    def forward(ctx, q_BtHE, gathered, rank, layout, scale, kernel, cu=None):
        o, lse = _attend_gathered(q_BtHE, gathered, rank, layout, scale, kernel, cu)
        ctx.save_for_backward(q_BtHE, gathered, o, lse)
        ctx.rank, ctx.layout, ctx.scale, ctx.kernel, ctx.cu = rank, layout, scale, kernel, cu
        return _tokens_first(o, q_BtHE.dtype)

    @staticmethod
    def backward(ctx, do_BtHE):
        q_BtHE, gathered, o, lse = ctx.saved_tensors
        D, t = gathered.shape[0], q_BtHE.shape[1]
        with _no_autocast(q_BtHE):
            q, do = _heads_first(q_BtHE), _heads_first(do_BtHE)
            dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            d_gathered = torch.zeros(gathered.shape, dtype=torch.float32,
                                     device=gathered.device)
            for k_rank in range(D):
                k, v = _keys_values(gathered[k_rank])
                dk, dv = _keys_values(d_gathered[k_rank])  # views: added to in place
                _attend_backward(ctx.kernel, do, q, k, v, o, lse, dq, dk, dv,
                                 pairs=_visible_pairs(ctx.rank, k_rank, D, t, ctx.layout,
                                                      ctx.cu), scale=ctx.scale)
        return (_tokens_first(dq, q_BtHE.dtype), d_gathered.to(gathered.dtype), None, None,
                None, None, None)


# ---------------------------------------------------------------- ulysses

def _ulysses(q_BtHE, k_BtGE, v_BtGE, *, group, layout: Layout, scale: float,
             kernel: AttentionKernel, cu=None):
    D = rank_size(group)[1]
    plan = UlyssesHeads(num_k_heads=k_BtGE.shape[2], num_v_heads=q_BtHE.shape[2], chips=D)
    # The whole sequence of this rank's heads, in sequence order (a local permutation under
    # zigzag): one causal segment, attended as a lone rank's (D = 1) would be; documents'
    # global boundaries apply to it as they are.
    q_BTHE, k_BTGE, v_BTGE = seq_to_heads(
        [q_BtHE, key_heads_for_chips(k_BtGE, plan), key_heads_for_chips(v_BtGE, plan)],
        group=group, layout=layout)
    o_BTHE = _GatheredAttention.apply(q_BTHE, torch.stack([k_BTGE, v_BTGE])[None], 0,
                                      "contiguous", scale, kernel, cu)
    return heads_to_seq(o_BTHE, group=group, layout=layout)


def _keys_values(kv_2BtGE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[2, B, t, G, E] → views k, v [B, G, t, E] (dtype kept)."""
    return kv_2BtGE.transpose(2, 3).unbind(0)


def _heads_first(x_BtHE: torch.Tensor) -> torch.Tensor:
    """[B, t, H, E] → a view [B, H, t, E] (the kernels' layout, dtype kept)."""
    return x_BtHE.transpose(1, 2)


def _tokens_first(x_BHtE: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, H, t, E] → contiguous [B, t, H, E] in `dtype` (a collective's backward may receive
    it: gloo's needs contiguous gradients)."""
    return x_BHtE.transpose(1, 2).to(dtype).contiguous()


# ---------------------------------------------------------------- ring

def _pass_on(x: torch.Tensor, *, group, tag: int, backward: bool, op: str) -> torch.Tensor:
    """Send x to the next rank, return the previous rank's (one ring hop)."""
    rank, D = rank_size(group)
    received = torch.empty_like(x, memory_format=torch.contiguous_format)
    send_recv(x, (rank + 1) % D, received, (rank - 1) % D, group=group, tag=tag, op=op,
              backward=backward)
    return received


class _RingAttention(torch.autograd.Function):
    """Ring attention; saves q, k, v, o and the float32 log-sum-exp of this rank only."""

    @staticmethod
    def forward(ctx, q_BtHE, k_BtGE, v_BtGE, group, layout, scale, kernel, cu):
        rank, D = rank_size(group)
        t = q_BtHE.shape[1]
        with _no_autocast(q_BtHE):
            q = _heads_first(q_BtHE)
            o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
            kv = torch.stack([k_BtGE, v_BtGE]).contiguous()  # [2, B, t, G, E], one message
            for hop in range(D):
                if hop:
                    kv = _pass_on(kv, group=group, tag=_TAG, backward=False, op="attn_ring")
                k, v = _keys_values(kv)
                _attend(kernel, q, k, v, o, lse, scale=scale,
                        pairs=_visible_pairs(rank, (rank - hop) % D, D, t, layout, cu))
        ctx.save_for_backward(q_BtHE, k_BtGE, v_BtGE, o, lse)
        ctx.group, ctx.layout, ctx.scale, ctx.kernel, ctx.cu = group, layout, scale, kernel, cu
        return _tokens_first(o, q_BtHE.dtype)

    @staticmethod
    def backward(ctx, do_BtHE):
        q_BtHE, k_BtGE, v_BtGE, o, lse = ctx.saved_tensors
        group, layout = ctx.group, ctx.layout
        rank, D = rank_size(group)
        t = q_BtHE.shape[1]
        with _no_autocast(q_BtHE):
            q, do = _heads_first(q_BtHE), _heads_first(do_BtHE)
            dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            kv = torch.stack([k_BtGE, v_BtGE]).contiguous()
            own_dkv = dkv = None
            for hop in range(D):
                if hop:
                    kv = _pass_on(kv, group=group, tag=_TAG + 1, backward=True, op="attn_ring")
                k, v = _keys_values(kv)  # [B, G, t, E]
                if hop >= 2:  # the accumulator of the block now held, from the previous rank
                    dkv = _pass_on(dkv, group=group, tag=_TAG + 2, backward=True, op="attn_ring")
                else:  # hop 0: this rank's own block; hop 1: the block's first visit after
                    # its owner. Later hops add into the accumulator that arrives, so the same
                    # float32 buffers are live at every D.
                    dkv = torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device)
                dk, dv = dkv.unbind(0)  # float32 [B, G, t, E] each, added to in place
                _attend_backward(ctx.kernel, do, q, k, v, o, lse, dq, dk, dv, scale=ctx.scale,
                                 pairs=_visible_pairs(rank, (rank - hop) % D, D, t, layout,
                                                      ctx.cu))
                if hop == 0:
                    own_dkv, dkv = dkv, None
            if D > 1:  # the last accumulator goes home: rank + 1 owns the block held now
                own_dkv += _pass_on(dkv, group=group, tag=_TAG + 2, backward=True,
                                    op="attn_ring")
            dk_BtGE, dv_BtGE = own_dkv.transpose(2, 3).unbind(0)
        return (_tokens_first(dq, q_BtHE.dtype), dk_BtGE.to(k_BtGE.dtype),
                dv_BtGE.to(v_BtGE.dtype), None, None, None, None, None)


def ring_saved_bytes_bound(*, batch: int, local_tokens: int, num_heads: int,
                           num_kv_heads: int, head_dim: int, itemsize: int = 4) -> int:
    """Bytes the ring's forward saves for backward: q, k, v (itemsize), o and the log-sum-exp
    (float32) of this rank's shard — independent of D."""
    B, t, H, G, E = batch, local_tokens, num_heads, num_kv_heads, head_dim
    return B * t * (H * E + 2 * G * E) * itemsize + B * t * H * (E + 1) * 4


