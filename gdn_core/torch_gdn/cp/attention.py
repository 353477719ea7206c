"""Causal softmax attention under context parallelism: `attention_cp(q, k, v, *, group, mode,
layout)` on this rank's sequence shard, one function per `attn_cp` mode (cp_modes.ATTN_CP_MODES).

Inputs are the rank's local shard in local order (cp_layout: contiguous, or zigzag segments r
and 2D−1−r); causality is by the tokens' GLOBAL positions (cp_layout.local_positions), so every
mode serves both layouts and nothing is re-sharded.

    all_gather_kv  all-gather K and V into one buffer (the gathered [B, T, G, E] lives on
                   every rank, by design), the local queries attend to it block by block
                   (below); backward: dK, dV one key block (one rank's t tokens) at a time,
                   reduce-scattered as a ring: block j's accumulator starts on rank j + 1 and
                   passes from rank to rank, each adding its queries' share (float32 sums,
                   K/V's dtype on the wire), home after D − 1 hops. No rank holds the whole
                   sequence's dK, dV: the peak per rank grows with T by exactly the gathered
                   K/V, B·T·G·2E·b; no [t, T] mask exists.
    ring           K/V blocks passed around the group (D−1 hops), each attended block by block
                   and merged into float32 (output, log-sum-exp) statistics; the backward (a
                   custom autograd Function) passes the K/V blocks around again, each with its
                   float32 dK/dV accumulator (added to in place, so the same buffers are live
                   at every D), so only this rank's own q, k, v, o and log-sum-exp are saved.
    ulysses        all-to-all from sequence shards to head shards (query heads H/D per rank,
                   the key/value heads they use: cp_modes.UlyssesHeads, replicated when G < D),
                   one-chip causal attention over the whole sequence (blockwise, as one rank's
                   of one), all-to-all of o back. (Not scaled_dot_product_attention: with GQA
                   in float32 on CUDA it can fall back to the math kernel's [T, T] scores.)

Blockwise attention (every mode): a rank's queries meet a key range in blocks of at most
`block` tokens (BLOCK_TOKENS, cut to the segment length), flash-style: each (query block,
key block) pair's float32 scores are merged into float32 (output, log-sum-exp) statistics; the
backward recomputes each pair's probabilities from the saved log-sum-exp (dS = P ∘ (dP − Δ),
Δ = rowsum(dO ∘ O)). Pairs whose keys all precede the queries run unmasked, pairs on the
diagonal with a causal mask of one block, pairs whose keys all follow the queries are skipped,
so both layouts do only the causal work. Saved: q, k, v (all_gather_kv: the gathered K/V), o
and the log-sum-exp; the temporaries are about two float32 tiles of [B, H, block, block]
(ulysses: H/D heads) whatever t and T, so no memory grows with t² or t·T. The price is one
Python step per tile: (t/block)·(T/block)/2 per rank and layer, about.

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

from ...cp_layout import Layout, check_layout, segments
from ...cp_modes import (
    AttnCPMode,
    UlyssesHeads,
    check_attention_cp_shape,
    check_attn_cp,
)
from .comm import nbytes, rank_size, record, send_recv
from .ulysses import heads_to_seq, key_heads_for_chips, seq_to_heads

_TAG = 80  # ring: K/V forward 80, K/V backward 81, dK/dV backward 82; all_gather_kv dK/dV 83
BLOCK_TOKENS = 512  # query / key tokens per blockwise attention tile (cut to the segment)


def check_attention_shape(*, mode: str, chips: int, seq_len: int, layout: str,
                          num_heads: int, num_kv_heads: int) -> None:
    """Raise ValueError naming the numbers when `mode` cannot split this attention over chips:
    cp_modes.check_attention_cp_shape (the mode; ulysses' query heads), the layout's sequence
    split, and GQA (query heads a multiple of key/value heads)."""
    check_attention_cp_shape(attn_cp=mode, chips=chips, num_heads=num_heads)
    check_layout(layout, chips=chips, seq_len=seq_len)
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of key/value heads "
                         f"({num_kv_heads})")


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
                 mode: AttnCPMode, layout: Layout = "contiguous",
                 scale: float | None = None, block: int = BLOCK_TOKENS) -> torch.Tensor:
    """Causal attention output o [B, t, H, E] (q's dtype) for this rank's queries.

    q [B, t, H, E], k, v [B, t, G, E]: this rank's shard in `layout`'s local order; query head
    h reads key/value head h // (H/G); scale defaults to E^−½; `block`: tokens per tile of
    the blockwise attention (the module docstring). Every rank of `group` must call it with
    the same shapes (it exchanges). Raises ValueError naming the numbers when `mode`
    cannot serve the shape (checked before any exchange, on every rank alike).
    """
    if block < 1:
        raise ValueError(f"block must be a positive number of tokens, got {block}")
    D = rank_size(group)[1]
    _, t, H, E = q_BtHE.shape
    check_attention_shape(mode=mode, chips=D, seq_len=t * D, layout=layout, num_heads=H,
                          num_kv_heads=k_BtGE.shape[2])
    scale = E ** -0.5 if scale is None else scale
    if mode == "all_gather_kv":
        return _AllGatherKVAttention.apply(q_BtHE, k_BtGE, v_BtGE, group, layout, scale,
                                           block)
    if mode == "ulysses":
        return _ulysses(q_BtHE, k_BtGE, v_BtGE, group=group, layout=layout, scale=scale,
                        block=block)
    return _RingAttention.apply(q_BtHE, k_BtGE, v_BtGE, group, layout, scale, block)


# ---------------------------------------------------------------- all_gather_kv

class _AllGatherKVAttention(torch.autograd.Function):
    """all_gather_kv: every rank's K/V block gathered into one [D, 2, B, t, G, E] buffer (a
    single-buffer all_gather, which gloo serves on any subgroup), this rank's queries against
    it blockwise; saves q, the gathered buffer, o and the log-sum-exp.

    Backward: dK, dV one key block at a time, reduce-scattered as a ring. The accumulator of
    block j starts on rank j + 1 and passes from rank to rank (each adding its queries' share,
    summed in float32, sent in K/V's dtype as a reduce-scatter would), arriving home after
    D − 1 hops. So no rank holds the whole sequence's dK, dV beside the gathered K, V: at most
    two blocks' accumulators (the one sent, the one received) at any moment, whatever D."""

    @staticmethod
    def forward(ctx, q_BtHE, k_BtGE, v_BtGE, group, layout, scale, block):
        rank, D = rank_size(group)
        kv_2BtGE = torch.stack([k_BtGE, v_BtGE])  # one message, contiguous
        # torch's single-buffer collectives stack the ranks' blocks along dim 0
        gathered = kv_2BtGE.new_empty((D * 2, *kv_2BtGE.shape[1:]))
        dist.all_gather_single(gathered, kv_2BtGE, group=group)
        record("attn_all_gather_kv", (D - 1) * nbytes(kv_2BtGE), backward=False)
        gathered = gathered.view(D, *kv_2BtGE.shape)
        del kv_2BtGE
        o, lse = _attend_gathered(q_BtHE, gathered, rank, layout, scale, block)
        ctx.save_for_backward(q_BtHE, gathered, o, lse)
        ctx.group, ctx.layout, ctx.scale, ctx.block = group, layout, scale, block
        return _ungrouped(o).to(q_BtHE.dtype)

    @staticmethod
    def backward(ctx, do_BtHE):
        q_BtHE, gathered, o, lse = ctx.saved_tensors
        rank, D = rank_size(ctx.group)
        t, G = q_BtHE.shape[1], gathered.shape[4]
        with torch.autocast(device_type=q_BtHE.device.type, enabled=False):
            q, do = _grouped(q_BtHE, G), _grouped(do_BtHE, G)
            delta = (do * o).sum(-1)  # rowsum(dO ∘ O) [B, G, r, t]
            dq = torch.zeros_like(q)
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
                _attend_backward(q, do, delta, lse, k, v, dq, dk, dv, scale=ctx.scale,
                                 pairs=_block_pairs(rank, k_rank, D, t, ctx.layout,
                                                    ctx.block))
            dk_BtGE, dv_BtGE = d_kv.to(gathered.dtype).unbind(0)
        return (_ungrouped(dq).to(q_BtHE.dtype), dk_BtGE, dv_BtGE, None, None, None, None)


def _attend_gathered(q_BtHE, gathered, rank: int, layout: Layout, scale: float, block: int):
    """float32 (o [B, G, r, t, E], log-sum-exp [B, G, r, t]) of rank `rank`'s queries against
    every rank's K/V block of the gathered [D, 2, B, t, G, E] buffer, blockwise."""
    D, G = gathered.shape[0], gathered.shape[4]
    t = q_BtHE.shape[1]
    with torch.autocast(device_type=q_BtHE.device.type, enabled=False):
        q = _grouped(q_BtHE, G)
        o, lse = q.new_zeros(q.shape), q.new_full(q.shape[:-1], float("-inf"))
        for k_rank in range(D):
            k, v = _keys_values(gathered[k_rank])
            _attend(q, k, v, _block_pairs(rank, k_rank, D, t, layout, block), scale, o, lse)
    return o, lse


class _GatheredAttention(torch.autograd.Function):
    """Rank `rank`'s queries against a given [D, 2, B, t, G, E] K/V buffer, blockwise; saves
    q, the buffer, o and the log-sum-exp; backward: the gradient of the whole buffer (float32
    while built). ulysses uses it as a lone rank: D = 1, the whole sequence of its heads
    (no whole-sequence gradient beyond that rank's own K/V)."""

    @staticmethod
    def forward(ctx, q_BtHE, gathered, rank, layout, scale, block):
        o, lse = _attend_gathered(q_BtHE, gathered, rank, layout, scale, block)
        ctx.save_for_backward(q_BtHE, gathered, o, lse)
        ctx.rank, ctx.layout, ctx.scale, ctx.block = rank, layout, scale, block
        return _ungrouped(o).to(q_BtHE.dtype)

    @staticmethod
    def backward(ctx, do_BtHE):
        q_BtHE, gathered, o, lse = ctx.saved_tensors
        D, G = gathered.shape[0], gathered.shape[4]
        t = q_BtHE.shape[1]
        with torch.autocast(device_type=q_BtHE.device.type, enabled=False):
            q, do = _grouped(q_BtHE, G), _grouped(do_BtHE, G)
            delta = (do * o).sum(-1)  # rowsum(dO ∘ O) [B, G, r, t]
            dq = torch.zeros_like(q)
            d_gathered = torch.zeros(gathered.shape, dtype=torch.float32,
                                     device=gathered.device)
            for k_rank in range(D):
                k, v = _keys_values(gathered[k_rank])
                dk, dv = _keys_values(d_gathered[k_rank])  # views: added to in place
                _attend_backward(q, do, delta, lse, k, v, dq, dk, dv, scale=ctx.scale,
                                 pairs=_block_pairs(ctx.rank, k_rank, D, t, ctx.layout,
                                                    ctx.block))
        return (_ungrouped(dq).to(q_BtHE.dtype), d_gathered.to(gathered.dtype), None, None,
                None, None)


# ---------------------------------------------------------------- ulysses

def _ulysses(q_BtHE, k_BtGE, v_BtGE, *, group, layout: Layout, scale: float, block: int):
    D = rank_size(group)[1]
    plan = UlyssesHeads(num_k_heads=k_BtGE.shape[2], num_v_heads=q_BtHE.shape[2], chips=D)
    # The whole sequence of this rank's heads, in sequence order (a local permutation under
    # zigzag): one causal segment, attended blockwise as a lone rank's (D = 1) would be.
    q_BTHE, k_BTGE, v_BTGE = seq_to_heads(
        [q_BtHE, key_heads_for_chips(k_BtGE, plan), key_heads_for_chips(v_BtGE, plan)],
        group=group, layout=layout)
    o_BTHE = _GatheredAttention.apply(q_BTHE, torch.stack([k_BTGE, v_BTGE])[None], 0,
                                      "contiguous", scale, block)
    return heads_to_seq(o_BTHE, group=group, layout=layout)


# ---------------------------------------------------------------- blockwise attention

def _segments(rank: int, D: int, t: int, layout: Layout) -> list[tuple[slice, int]]:
    """(local slice, first global position) of each contiguous segment of a rank's shard."""
    parts = segments(chip=rank, chips=D, layout=layout)
    size = t // len(parts)
    return [(slice(i * size, (i + 1) * size), p * size) for i, p in enumerate(parts)]


def _visible_pairs(q_rank: int, k_rank: int, D: int, t: int, layout: Layout):
    """(q slice, k slice, causal) for each pair of segments with a visible key: causal=True on
    the diagonal (same segment: mask within), False when every key precedes every query; pairs
    whose keys all follow the queries are skipped (no work at all)."""
    pairs = []
    for q_sl, q_start in _segments(q_rank, D, t, layout):
        for k_sl, k_start in _segments(k_rank, D, t, layout):
            if k_start < q_start:
                pairs.append((q_sl, k_sl, False))
            elif k_start == q_start:
                pairs.append((q_sl, k_sl, True))
    return pairs


def _block_pairs(q_rank: int, k_rank: int, D: int, t: int, layout: Layout,
                 block: int) -> list[tuple[slice, slice, bool]]:
    """_visible_pairs cut into (q block, k block, causal) tiles of at most `block` tokens. A
    diagonal segment pair's query and key blocks share boundaries (same segment), so its tiles
    on the diagonal are causal, those below run unmasked and those above are skipped."""
    def blocks(sl):
        return [slice(s, min(s + block, sl.stop)) for s in range(sl.start, sl.stop, block)]

    tiles = []
    for q_sl, k_sl, causal in _visible_pairs(q_rank, k_rank, D, t, layout):
        for i, q_blk in enumerate(blocks(q_sl)):
            for j, k_blk in enumerate(blocks(k_sl)):
                if not causal or j <= i:
                    tiles.append((q_blk, k_blk, causal and j == i))
    return tiles


def _scores(q_BGrsE, k_BGsE, scale: float, causal: bool) -> torch.Tensor:
    """float32 scores of one tile [B, G, r, q, k]; keys after the query −inf on a causal tile.
    Built in place (as are the tile's later steps), so one tile buffer is live, not several."""
    s = torch.einsum("bgrqe,bgke->bgrqk", q_BGrsE, k_BGsE).mul_(scale)
    if causal:
        n = s.shape[-1]
        s.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1),
                       float("-inf"))
    return s


def _attend(q, k, v, pairs, scale: float, o, lse) -> None:
    """Merge the attention of q [B, G, r, t, E] to k, v [B, G, s, E] over `pairs` (tiles) into
    the float32 running output o [B, G, r, t, E] and log-sum-exp lse [B, G, r, t], in place."""
    for q_sl, k_sl, causal in pairs:
        p = _scores(q[..., q_sl, :], k[..., k_sl, :], scale, causal)
        lse_blk = torch.logsumexp(p, dim=-1)  # finite: every row sees at least one key
        o_blk = torch.einsum("bgrqk,bgke->bgrqe", p.sub_(lse_blk[..., None]).exp_(),
                             v[..., k_sl, :])
        del p
        merged = torch.logaddexp(lse[..., q_sl], lse_blk)
        o[..., q_sl, :] = (o[..., q_sl, :] * torch.exp(lse[..., q_sl] - merged)[..., None]
                           + o_blk * torch.exp(lse_blk - merged)[..., None])
        lse[..., q_sl] = merged


def _attend_backward(q, do, delta, lse, k, v, dq, dk, dv, *, scale: float, pairs) -> None:
    """_attend's gradient over the same tiles, each tile's probabilities recomputed from the
    final log-sum-exp: adds into dq (like q) and dk, dv (like k, v) in place."""
    for q_sl, k_sl, causal in pairs:
        p = _scores(q[..., q_sl, :], k[..., k_sl, :], scale, causal)
        p.sub_(lse[..., q_sl, None]).exp_()
        do_blk = do[..., q_sl, :]
        dv[..., k_sl, :] += torch.einsum("bgrqk,bgrqe->bgke", p, do_blk)
        ds = torch.einsum("bgrqe,bgke->bgrqk", do_blk, v[..., k_sl, :])  # dP, then dS
        ds.sub_(delta[..., q_sl, None]).mul_(p).mul_(scale)
        del p
        dq[..., q_sl, :] += torch.einsum("bgrqk,bgke->bgrqe", ds, k[..., k_sl, :])
        dk[..., k_sl, :] += torch.einsum("bgrqk,bgrqe->bgke", ds, q[..., q_sl, :])


def _keys_values(kv_2BtGE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[2, B, t, G, E] → float32 views (copies if not float32) k, v [B, G, t, E]."""
    return kv_2BtGE.float().permute(0, 1, 3, 2, 4).unbind(0)


def _grouped(x_BtHE: torch.Tensor, G: int) -> torch.Tensor:
    """[B, t, H, E] → float32 [B, G, r, t, E] (head h = g·r + i)."""
    B, t, H, E = x_BtHE.shape
    return x_BtHE.float().reshape(B, t, G, H // G, E).permute(0, 2, 3, 1, 4)


def _ungrouped(x_BGrtE: torch.Tensor) -> torch.Tensor:
    B, G, r, t, E = x_BGrtE.shape
    return x_BGrtE.permute(0, 3, 1, 2, 4).reshape(B, t, G * r, E)


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
    def forward(ctx, q_BtHE, k_BtGE, v_BtGE, group, layout, scale, block):
        rank, D = rank_size(group)
        t, G = q_BtHE.shape[1], k_BtGE.shape[2]
        with torch.autocast(device_type=q_BtHE.device.type, enabled=False):
            q = _grouped(q_BtHE, G)
            o, lse = q.new_zeros(q.shape), q.new_full(q.shape[:-1], float("-inf"))
            kv = torch.stack([k_BtGE, v_BtGE]).contiguous()  # [2, B, t, G, E], one message
            for hop in range(D):
                if hop:
                    kv = _pass_on(kv, group=group, tag=_TAG, backward=False, op="attn_ring")
                k, v = _keys_values(kv)
                _attend(q, k, v, _block_pairs(rank, (rank - hop) % D, D, t, layout, block),
                        scale, o, lse)
        ctx.save_for_backward(q_BtHE, k_BtGE, v_BtGE, o, lse)
        ctx.group, ctx.layout, ctx.scale, ctx.block = group, layout, scale, block
        return _ungrouped(o).to(q_BtHE.dtype)

    @staticmethod
    def backward(ctx, do_BtHE):
        q_BtHE, k_BtGE, v_BtGE, o, lse = ctx.saved_tensors
        group, layout = ctx.group, ctx.layout
        rank, D = rank_size(group)
        t, G = q_BtHE.shape[1], k_BtGE.shape[2]
        with torch.autocast(device_type=q_BtHE.device.type, enabled=False):
            q, do = _grouped(q_BtHE, G), _grouped(do_BtHE, G)
            delta = (do * o).sum(-1)  # rowsum(dO ∘ O) [B, G, r, t]
            dq = torch.zeros_like(q)
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
                _attend_backward(q, do, delta, lse, k, v, dq, dk, dv, scale=ctx.scale,
                                 pairs=_block_pairs(rank, (rank - hop) % D, D, t, layout,
                                                    ctx.block))
                if hop == 0:
                    own_dkv, dkv = dkv, None
            if D > 1:  # the last accumulator goes home: rank + 1 owns the block held now
                own_dkv += _pass_on(dkv, group=group, tag=_TAG + 2, backward=True,
                                    op="attn_ring")
            dk_BtGE, dv_BtGE = own_dkv.permute(0, 1, 3, 2, 4).unbind(0)
        return (_ungrouped(dq).to(q_BtHE.dtype), dk_BtGE.to(k_BtGE.dtype),
                dv_BtGE.to(v_BtGE.dtype), None, None, None, None)


def ring_saved_bytes_bound(*, batch: int, local_tokens: int, num_heads: int,
                           num_kv_heads: int, head_dim: int, itemsize: int = 4) -> int:
    """Bytes the ring's forward saves for backward: q, k, v (itemsize), o and the log-sum-exp
    (float32) of this rank's shard — independent of D."""
    B, t, H, G, E = batch, local_tokens, num_heads, num_kv_heads, head_dim
    return B * t * (H * E + 2 * G * E) * itemsize + B * t * H * (E + 1) * 4


