"""CP mode `ulysses`: all-to-all from sequence shards to head shards, the rule, and back.

Rank j holds tokens [j·t, (j+1)·t) of every head (t = T/D) and receives the whole sequence of
value heads j·Hv/D … and of the G key (and query) heads they use (`cp_modes.UlyssesHeads`:
G = Hk/D when D divides Hk; with fewer key heads than chips a key head goes to every chip whose
value heads use it, as DeepSpeed-Ulysses replicates KV heads). One all-to-all per input dtype
turns q, k [B, t, Hk, Dk], v [B, t, Hv, Dv], g, beta [B, t, Hv] into [B, T, G or Hv/D, ·];
the one-chip rule runs there, and one all-to-all brings o back to [B, t, Hv, Dv]. The final
state, if asked, is an all-gather over heads. Received per rank and direction:
    (D−1)·B·t·(2·G·Dk·|q| + (Hv/D)·(Dv·|v| + |g| + |β|) + (Hv/D)·Dv·|o|)   bytes
(|x| the item size) — (D−1)/D of the local tokens × channels, with D·G key heads for Hk.

Under layout='zigzag' the all-to-all is the same (the same bytes); what arrives is the whole
sequence in shard order (rank 0's two segments, then rank 1's, …), which each rank puts in
sequence order before the rule (a local permutation) and back in shard order before the
all-to-all that returns o.
"""

from __future__ import annotations

import numpy as np
import torch

from ...cp_layout import Layout, shard_order
from ...cp_modes import UlyssesHeads
from ..chunk import chunk_gated_delta_rule
from ..device_index import device_index
from .comm import all_gather, all_to_all_single, rank_size


def _to_dest_blocks(x_BtHd: torch.Tensor, D: int) -> torch.Tensor:
    """[B, t, H, d] → [D, B·t·(H/D)·d]: block j holds head group j (what rank j receives)."""
    B, t, H, d = x_BtHd.shape
    return x_BtHd.reshape(B, t, D, H // D, d).permute(2, 0, 1, 3, 4).reshape(D, -1)


def key_heads_for_chips(x_BtGd: torch.Tensor, plan: UlyssesHeads) -> torch.Tensor:
    """[B, t, Hk, d] → [B, t, D·G, d]: block j holds chip j's key heads (copies where shared).

    Its backward sums the copies' gradients locally (index_select's), so nothing more crosses.
    """
    heads = plan.send_key_heads
    if heads == tuple(range(x_BtGd.shape[2])):
        return x_BtGd
    return x_BtGd.index_select(2, device_index(tuple, heads, device=x_BtGd.device))


def _shard_order(layout: Layout, D: int, T: int) -> np.ndarray:
    """The sequence's positions in shard order (rank 0's tokens, then rank 1's, …)."""
    return shard_order(chips=D, seq_len=T, layout=layout)


def _sequence_order(layout: Layout, D: int, T: int) -> np.ndarray:
    """Where the sequence's tokens lie in the shard-ordered [B, T, …]."""
    return _shard_order(layout, D, T).argsort()


def seq_to_heads(xs_BtHd: list[torch.Tensor], *, group,
                 layout: Layout = "contiguous") -> list[torch.Tensor]:
    """Sequence shards [B, t, H, d] → head shards [B, D·t, H/D, d] in sequence order; one
    all-to-all per dtype."""
    _, D = rank_size(group)
    to_sequence = None if layout == "contiguous" else device_index(
        _sequence_order, layout, D, D * xs_BtHd[0].shape[1], device=xs_BtHd[0].device)
    out: list[torch.Tensor | None] = [None] * len(xs_BtHd)
    for dtype in dict.fromkeys(x.dtype for x in xs_BtHd):
        idx = [i for i, x in enumerate(xs_BtHd) if x.dtype == dtype]
        blocks = [_to_dest_blocks(xs_BtHd[i], D) for i in idx]
        recv_DX = all_to_all_single(torch.cat(blocks, dim=1), group=group, op="ulysses")
        for i, piece in zip(idx, recv_DX.split([blk.shape[1] for blk in blocks], dim=1)):
            B, t, H, d = xs_BtHd[i].shape
            # row s came from rank s = sequence shard s: [D, B, t, H/D, d] → [B, D·t, H/D, d]
            piece = piece.reshape(D, B, t, H // D, d).permute(1, 0, 2, 3, 4)
            piece = piece.reshape(B, D * t, H // D, d)
            out[i] = (piece if to_sequence is None else piece.index_select(1, to_sequence)
                      ).contiguous()
    return out


def heads_to_seq(o_BTHV: torch.Tensor, *, group, layout: Layout = "contiguous") -> torch.Tensor:
    """Head shard [B, D·t, H/D, V] in sequence order → sequence shard [B, t, H, V] (one
    all-to-all)."""
    _, D = rank_size(group)
    B, T, Hl, V = o_BTHV.shape
    if layout != "contiguous":  # into shard order: row block s goes to rank s
        o_BTHV = o_BTHV.index_select(1, device_index(_shard_order, layout, D, T,
                                                      device=o_BTHV.device))
    send = o_BTHV.reshape(B, D, T // D, Hl, V).permute(1, 0, 2, 3, 4).reshape(D, -1)
    recv = all_to_all_single(send, group=group, op="ulysses")
    # row s is head group s of this rank's tokens: [D, B, t, Hl, V] → [B, t, D·Hl, V]
    recv = recv.reshape(D, B, T // D, Hl, V).permute(1, 2, 0, 3, 4)
    return recv.reshape(B, T // D, D * Hl, V).contiguous()


def chunk_gated_delta_rule_ulysses(q, k, v, g, beta, *, group, h0_BHKV: torch.Tensor,
                                   output_final_state: bool, use_qk_l2norm: bool,
                                   chunk_size: int, layout: Layout = "contiguous", kernel=None,
                                   cu_seqlens=None):
    """This rank's shard of o ([B, T/D, Hv, Dv], q's dtype) and the global final state (or None).

    Value heads must be divisible by D (checked by the caller via check_cp_shape). `kernel`
    (gdn_kernels.GDNRuleKernel, its own chunk size): one call of it on this rank's heads over
    the whole sequence; None: this package's chunk_gated_delta_rule; either takes the global
    cu_seqlens as they are (the rule sees the whole sequence in sequence order).
    """
    rank, D = rank_size(group)
    plan = UlyssesHeads(num_k_heads=k.shape[2], num_v_heads=v.shape[2], chips=D)
    q_h, k_h, v_h, g_h, beta_h = seq_to_heads(
        [key_heads_for_chips(q, plan), key_heads_for_chips(k, plan), v, g.unsqueeze(-1),
         beta.unsqueeze(-1)], group=group, layout=layout)
    heads = plan.value_heads(rank)
    h0_local = h0_BHKV[:, heads.start:heads.stop]
    if kernel is None:
        o_h, final_local = chunk_gated_delta_rule(
            q_h, k_h, v_h, g_h.squeeze(-1), beta_h.squeeze(-1), initial_state=h0_local,
            output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm,
            chunk_size=chunk_size, cu_seqlens=cu_seqlens)
    else:
        o_h, final_local = kernel(
            q_h, k_h, v_h, g_h.squeeze(-1), beta_h.squeeze(-1), initial_state=h0_local,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm,
            cu_seqlens=cu_seqlens)
    o = heads_to_seq(o_h, group=group, layout=layout)
    if not output_final_state:
        return o, None
    final = torch.cat(all_gather(final_local.contiguous(), group=group, op="ulysses_final_state"),
                      dim=1)
    return o, final
