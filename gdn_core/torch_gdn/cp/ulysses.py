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
"""

from __future__ import annotations

import torch

from ...cp_modes import UlyssesHeads
from ..chunk import chunk_gated_delta_rule
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
    return x_BtGd.index_select(2, torch.tensor(heads, device=x_BtGd.device))


def seq_to_heads(xs_BtHd: list[torch.Tensor], *, group) -> list[torch.Tensor]:
    """Sequence shards [B, t, H, d] → head shards [B, D·t, H/D, d]; one all-to-all per dtype."""
    _, D = rank_size(group)
    out: list[torch.Tensor | None] = [None] * len(xs_BtHd)
    for dtype in dict.fromkeys(x.dtype for x in xs_BtHd):
        idx = [i for i, x in enumerate(xs_BtHd) if x.dtype == dtype]
        blocks = [_to_dest_blocks(xs_BtHd[i], D) for i in idx]
        recv_DX = all_to_all_single(torch.cat(blocks, dim=1), group=group, op="ulysses")
        for i, piece in zip(idx, recv_DX.split([blk.shape[1] for blk in blocks], dim=1)):
            B, t, H, d = xs_BtHd[i].shape
            # row s came from rank s = sequence shard s: [D, B, t, H/D, d] → [B, D·t, H/D, d]
            piece = piece.reshape(D, B, t, H // D, d).permute(1, 0, 2, 3, 4)
            out[i] = piece.reshape(B, D * t, H // D, d).contiguous()
    return out


def heads_to_seq(o_BTHV: torch.Tensor, *, group) -> torch.Tensor:
    """Head shard [B, D·t, H/D, V] → sequence shard [B, t, H, V] (one all-to-all)."""
    _, D = rank_size(group)
    B, T, Hl, V = o_BTHV.shape
    send = o_BTHV.reshape(B, D, T // D, Hl, V).permute(1, 0, 2, 3, 4).reshape(D, -1)
    recv = all_to_all_single(send, group=group, op="ulysses")
    # row s is head group s of this rank's tokens: [D, B, t, Hl, V] → [B, t, D·Hl, V]
    recv = recv.reshape(D, B, T // D, Hl, V).permute(1, 2, 0, 3, 4)
    return recv.reshape(B, T // D, D * Hl, V).contiguous()


def chunk_gated_delta_rule_ulysses(q, k, v, g, beta, *, group, h0_BHKV: torch.Tensor,
                                   output_final_state: bool, use_qk_l2norm: bool,
                                   chunk_size: int):
    """This rank's shard of o ([B, T/D, Hv, Dv], q's dtype) and the global final state (or None).

    Value heads must be divisible by D (checked by the caller via check_cp_shape).
    """
    rank, D = rank_size(group)
    plan = UlyssesHeads(num_k_heads=k.shape[2], num_v_heads=v.shape[2], chips=D)
    q_h, k_h, v_h, g_h, beta_h = seq_to_heads(
        [key_heads_for_chips(q, plan), key_heads_for_chips(k, plan), v, g.unsqueeze(-1),
         beta.unsqueeze(-1)], group=group)
    heads = plan.value_heads(rank)
    o_h, final_local = chunk_gated_delta_rule(
        q_h, k_h, v_h, g_h.squeeze(-1), beta_h.squeeze(-1),
        initial_state=h0_BHKV[:, heads.start:heads.stop], output_final_state=output_final_state,
        use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size)
    o = heads_to_seq(o_h, group=group)
    if not output_final_state:
        return o, None
    final = torch.cat(all_gather(final_local.contiguous(), group=group, op="ulysses_final_state"),
                      dim=1)
    return o, final
