"""Causal softmax attention under context parallelism: `attention_cp(q, k, v, *, group, mode,
layout)` on this rank's sequence shard, one function per `attn_cp` mode (cp_modes.ATTN_CP_MODES).

Inputs are the rank's local shard in local order (cp_layout: contiguous, or zigzag segments r
and 2D−1−r); causality is by the tokens' GLOBAL positions (cp_layout.local_positions), so every
mode serves both layouts and nothing is re-sharded.

    all_gather_kv  all-gather K and V (the gathered [B, T, G, E] lives on every rank, by
                   design), one masked attention for the local queries.
    ring           K/V blocks passed around the group (D−1 hops), merged into float32
                   (output, log-sum-exp) statistics; the backward (a custom autograd Function)
                   passes the K/V blocks around again, each with its float32 dK/dV accumulator,
                   so only this rank's own q, k, v, o and log-sum-exp are saved.
    ulysses        all-to-all from sequence shards to head shards (query heads H/D per rank,
                   the key/value heads they use: cp_modes.UlyssesHeads, replicated when G < D),
                   one-chip causal attention over the whole sequence, all-to-all of o back.

Bytes each rank RECEIVES per attention layer (t = T/D local tokens, b the item size of q/k/v,
Gl = key/value heads per rank under ulysses: G/D if D divides G, 1 if G divides D, else H/D),
`attention_comm_bytes`:
    all_gather_kv  forward (D−1)·B·t·G·2E·b;  backward (reduce-scatter of dK, dV) the same
    ring           forward (D−1)·B·t·G·2E·b;  backward (D−1)·B·t·G·2E·(b + 4): K/V again and
                   the float32 dK/dV accumulators (D−2 hops on, one hop home)
    ulysses        forward (D−1)·B·t·E·b·(2·H/D + 2·Gl);  backward the same
Dependent rounds: all_gather_kv 1, ring D−1 (forward; backward D−1 more), ulysses 2 all-to-all.
Shape legend: B batch, t local tokens, T global tokens, H query heads, G key/value heads,
E head_dim, r = H/G queries per key/value head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...cp_layout import Layout, check_layout, local_positions, segments, shard_order
from ...cp_modes import AttnCPMode, UlyssesHeads, check_attn_cp
from .comm import all_gather, rank_size, send_recv
from .ulysses import heads_to_seq, key_heads_for_chips, seq_to_heads

_TAG = 80  # ring: K/V forward 80, K/V backward 81, dK/dV backward 82


def check_attention_shape(*, mode: str, chips: int, seq_len: int, layout: str,
                          num_heads: int, num_kv_heads: int) -> None:
    """Raise ValueError naming the numbers when `mode` cannot split this attention over chips."""
    check_attn_cp(mode)
    check_layout(layout, chips=chips, seq_len=seq_len)
    if num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of key/value heads "
                         f"({num_kv_heads})")
    if mode == "ulysses" and num_heads % chips:
        divisors = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
        raise ValueError(
            f"attn_cp='ulysses' needs query heads ({num_heads}) divisible by chips={chips}; "
            f"chips must be one of {', '.join(map(str, divisors))}")


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


def _positions(rank: int, D: int, t: int, layout: Layout, device) -> torch.Tensor:
    return torch.from_numpy(local_positions(chip=rank, chips=D, seq_len=t * D,
                                            layout=layout)).to(device)


def attention_cp(q_BtHE: torch.Tensor, k_BtGE: torch.Tensor, v_BtGE: torch.Tensor, *, group,
                 mode: AttnCPMode, layout: Layout = "contiguous",
                 scale: float | None = None) -> torch.Tensor:
    """Causal attention output o [B, t, H, E] (q's dtype) for this rank's queries.

    q [B, t, H, E], k, v [B, t, G, E]: this rank's shard in `layout`'s local order; query head
    h reads key/value head h // (H/G); scale defaults to E^−½. Every rank of `group` must call
    it with the same shapes (it exchanges). Raises ValueError naming the numbers when `mode`
    cannot serve the shape (checked before any exchange, on every rank alike).
    """
    rank, D = rank_size(group)
    B, t, H, E = q_BtHE.shape
    check_attention_shape(mode=mode, chips=D, seq_len=t * D, layout=layout, num_heads=H,
                          num_kv_heads=k_BtGE.shape[2])
    scale = E ** -0.5 if scale is None else scale
    if mode == "all_gather_kv":
        return _all_gather_kv(q_BtHE, k_BtGE, v_BtGE, group=group, layout=layout, scale=scale)
    if mode == "ulysses":
        return _ulysses(q_BtHE, k_BtGE, v_BtGE, group=group, layout=layout, scale=scale)
    return _RingAttention.apply(q_BtHE, k_BtGE, v_BtGE, group, layout, scale)


# ---------------------------------------------------------------- all_gather_kv

def _all_gather_kv(q_BtHE, k_BtGE, v_BtGE, *, group, layout: Layout, scale: float):
    rank, D = rank_size(group)
    t = q_BtHE.shape[1]
    kv_parts = all_gather(torch.stack([k_BtGE, v_BtGE]), group=group, op="attn_all_gather_kv")
    k_BTGE, v_BTGE = torch.cat(kv_parts, dim=2).unbind(0)  # [2, B, T, G, E] in shard order
    q_pos = _positions(rank, D, t, layout, q_BtHE.device)
    k_pos = torch.from_numpy(shard_order(chips=D, seq_len=t * D, layout=layout)).to(q_pos.device)
    visible_tT = q_pos[:, None] >= k_pos[None, :]
    o_BHtE = F.scaled_dot_product_attention(
        q_BtHE.transpose(1, 2), k_BTGE.transpose(1, 2), v_BTGE.transpose(1, 2),
        attn_mask=visible_tT, scale=scale, enable_gqa=True)
    return o_BHtE.transpose(1, 2)


# ---------------------------------------------------------------- ulysses

def _ulysses(q_BtHE, k_BtGE, v_BtGE, *, group, layout: Layout, scale: float):
    D = rank_size(group)[1]
    plan = UlyssesHeads(num_k_heads=k_BtGE.shape[2], num_v_heads=q_BtHE.shape[2], chips=D)
    # The whole sequence of this rank's heads, in sequence order (a local permutation under
    # zigzag), so SDPA's own causal mask applies.
    q_BTHE, k_BTGE, v_BTGE = seq_to_heads(
        [q_BtHE, key_heads_for_chips(k_BtGE, plan), key_heads_for_chips(v_BtGE, plan)],
        group=group, layout=layout)
    o_BHTE = F.scaled_dot_product_attention(
        q_BTHE.transpose(1, 2), k_BTGE.transpose(1, 2), v_BTGE.transpose(1, 2),
        is_causal=True, scale=scale, enable_gqa=True)
    return heads_to_seq(o_BHTE.transpose(1, 2).contiguous(), group=group, layout=layout)


# ---------------------------------------------------------------- ring

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


def _scores(q_BGrsE, k_BGsE, scale: float, causal: bool) -> torch.Tensor:
    s = torch.einsum("bgrqe,bgke->bgrqk", q_BGrsE, k_BGsE) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
    return s


def _grouped(x_BtHE: torch.Tensor, G: int) -> torch.Tensor:
    """[B, t, H, E] → float32 [B, G, r, t, E] (head h = g·r + i)."""
    B, t, H, E = x_BtHE.shape
    return x_BtHE.float().reshape(B, t, G, H // G, E).permute(0, 2, 3, 1, 4)


def _ungrouped(x_BGrtE: torch.Tensor) -> torch.Tensor:
    B, G, r, t, E = x_BGrtE.shape
    return x_BGrtE.permute(0, 3, 1, 2, 4).reshape(B, t, G * r, E)


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
    def forward(ctx, q_BtHE, k_BtGE, v_BtGE, group, layout, scale):
        rank, D = rank_size(group)
        B, t, H, E = q_BtHE.shape
        G = k_BtGE.shape[2]
        with torch.autocast(device_type=q_BtHE.device.type, enabled=False):
            q = _grouped(q_BtHE, G)
            o = q.new_zeros(q.shape)
            lse = q.new_full(q.shape[:-1], float("-inf"))
            kv = torch.stack([k_BtGE, v_BtGE]).contiguous()  # [2, B, t, G, E], one message
            for hop in range(D):
                if hop:
                    kv = _pass_on(kv, group=group, tag=_TAG, backward=False, op="attn_ring")
                k, v = kv.float().permute(0, 1, 3, 2, 4).unbind(0)  # [B, G, t, E]
                for q_sl, k_sl, causal in _visible_pairs(rank, (rank - hop) % D, D, t, layout):
                    s = _scores(q[..., q_sl, :], k[..., k_sl, :], scale, causal)
                    lse_blk = torch.logsumexp(s, dim=-1)
                    o_blk = torch.einsum("bgrqk,bgke->bgrqe", torch.exp(s - lse_blk[..., None]),
                                         v[..., k_sl, :])
                    merged = torch.logaddexp(lse[..., q_sl], lse_blk)
                    o[..., q_sl, :] = (o[..., q_sl, :] * torch.exp(lse[..., q_sl] - merged)[..., None]
                                       + o_blk * torch.exp(lse_blk - merged)[..., None])
                    lse[..., q_sl] = merged
        ctx.save_for_backward(q_BtHE, k_BtGE, v_BtGE, o, lse)
        ctx.group, ctx.layout, ctx.scale = group, layout, scale
        return _ungrouped(o).to(q_BtHE.dtype)

    @staticmethod
    def backward(ctx, do_BtHE):
        q_BtHE, k_BtGE, v_BtGE, o, lse = ctx.saved_tensors
        group, layout, scale = ctx.group, ctx.layout, ctx.scale
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
                if hop >= 2:  # the accumulator of the block now held, from the previous rank
                    dkv = _pass_on(dkv, group=group, tag=_TAG + 2, backward=True, op="attn_ring")
                elif hop == 1:  # it starts at the block's first visit after its owner
                    dkv = None
                k, v = kv.float().permute(0, 1, 3, 2, 4).unbind(0)  # [B, G, t, E]
                dk, dv = torch.zeros_like(k), torch.zeros_like(v)
                for q_sl, k_sl, causal in _visible_pairs(rank, (rank - hop) % D, D, t, layout):
                    s = _scores(q[..., q_sl, :], k[..., k_sl, :], scale, causal)
                    p = torch.exp(s - lse[..., q_sl, None])
                    do_blk = do[..., q_sl, :]
                    dv[..., k_sl, :] += torch.einsum("bgrqk,bgrqe->bgke", p, do_blk)
                    dp = torch.einsum("bgrqe,bgke->bgrqk", do_blk, v[..., k_sl, :])
                    ds = p * (dp - delta[..., q_sl, None]) * scale
                    dq[..., q_sl, :] += torch.einsum("bgrqk,bgke->bgrqe", ds, k[..., k_sl, :])
                    dk[..., k_sl, :] += torch.einsum("bgrqk,bgrqe->bgke", ds, q[..., q_sl, :])
                here = torch.stack([dk, dv])  # float32 [2, B, G, t, E]
                if hop == 0:
                    own_dkv = here
                else:
                    dkv = here if dkv is None else dkv + here
            if D > 1:  # the last accumulator goes home: rank + 1 owns the block held now
                own_dkv = own_dkv + _pass_on(dkv, group=group, tag=_TAG + 2, backward=True,
                                             op="attn_ring")
            dk_BtGE, dv_BtGE = own_dkv.permute(0, 1, 3, 2, 4).unbind(0)
        return (_ungrouped(dq).to(q_BtHE.dtype), dk_BtGE.to(k_BtGE.dtype),
                dv_BtGE.to(v_BtGE.dtype), None, None, None)


def ring_saved_bytes_bound(*, batch: int, local_tokens: int, num_heads: int,
                           num_kv_heads: int, head_dim: int, itemsize: int = 4) -> int:
    """Bytes the ring's forward saves for backward: q, k, v (itemsize), o and the log-sum-exp
    (float32) of this rank's shard — independent of D."""
    B, t, H, G, E = batch, local_tokens, num_heads, num_kv_heads, head_dim
    return B * t * (H * E + 2 * G * E) * itemsize + B * t * H * (E + 1) * 4


