"""CP mode `p2p`: a rank-ordered wavefront of the state, reversed in backward.

Forward, rank r (one autograd Function, `_Wavefront`):
    h_in  = h0 on rank 0, else received from r−1
    h_out = A_r h_in + b_r, sent to r+1
Backward, rank r: dh_out = (received from r+1, 0 on the last rank) + local grad of h_out,
    dA = dh_out h_inᵀ,  db = dh_out,  dh_in = grad(h_in) + A_rᵀ dh_out → sent to r−1
    (on rank 0 it is the gradient of h0).
D−1 dependent hops each way; received per non-first rank (forward) / non-last rank (backward):
one state, B·H·K·V·4 bytes. The final state is the last rank's h_out, broadcast.

Under layout='zigzag' (rank r holds segments r and 2D−1−r; `_ZigzagWavefront`) the wavefront
runs down the first segments (r−1 → r) and back up the second ones (r+1 → r); on rank D−1 the
state turns round locally (segment D follows segment D−1). 2(D−1) dependent hops each way;
received per rank and direction: one state from each neighbour it has, at most two states
(rank 0 and D−1: one). The final state is rank 0's second-segment h_out, broadcast.
"""

from __future__ import annotations

import torch

from .comm import broadcast, rank_size, send_recv
from .common import sequence_sharded

_TAG = 20


class _Wavefront(torch.autograd.Function):
    """(A [B,H,K,K], b [B,H,K,V], h0 [B,H,K,V]) → (h_in, h_out), float32, both [B,H,K,V]."""

    @staticmethod
    def forward(ctx, A_BHKK, b_BHKV, h0_BHKV, group):
        rank, D = rank_size(group)
        if rank == 0:
            h_in = h0_BHKV.detach().clone(memory_format=torch.contiguous_format)
        else:
            h_in = torch.empty_like(b_BHKV, memory_format=torch.contiguous_format)
            send_recv(None, None, h_in, rank - 1, group=group, tag=_TAG, op="p2p", backward=False)
        h_out = apply_pair_parts(A_BHKK, b_BHKV, h_in)
        if rank < D - 1:
            send_recv(h_out, rank + 1, None, None, group=group, tag=_TAG, op="p2p", backward=False)
        ctx.save_for_backward(A_BHKK, h_in)
        ctx.group = group
        return h_in, h_out

    @staticmethod
    def backward(ctx, dh_in_local, dh_out_local):
        A_BHKK, h_in = ctx.saved_tensors
        rank, D = rank_size(ctx.group)
        dh_out = dh_out_local.contiguous()
        if rank < D - 1:
            received = torch.empty_like(dh_out)
            send_recv(None, None, received, rank + 1, group=ctx.group, tag=_TAG + 1, op="p2p",
                      backward=True)
            dh_out = dh_out + received
        dA = dh_out @ h_in.transpose(-1, -2)
        dh_in = dh_in_local + A_BHKK.transpose(-1, -2) @ dh_out
        if rank > 0:
            send_recv(dh_in, rank - 1, None, None, group=ctx.group, tag=_TAG + 1, op="p2p",
                      backward=True)
            return dA, dh_out, None, None
        return dA, dh_out, dh_in, None


class _ZigzagWavefront(torch.autograd.Function):
    """(A1, b1, A2, b2, h0) → (h_in1, h_in2, h_out2), float32 [B,H,K,V]: segment r (pair 1)
    and segment 2D−1−r (pair 2) of rank r, the state running 0 → D−1 → 0."""

    @staticmethod
    def forward(ctx, A1_BHKK, b1_BHKV, A2_BHKK, b2_BHKV, h0_BHKV, group):
        rank, D = rank_size(group)
        if rank == 0:
            h_in1 = h0_BHKV.detach().clone(memory_format=torch.contiguous_format)
        else:
            h_in1 = torch.empty_like(b1_BHKV, memory_format=torch.contiguous_format)
            send_recv(None, None, h_in1, rank - 1, group=group, tag=_TAG, op="p2p", backward=False)
        h_out1 = apply_pair_parts(A1_BHKK, b1_BHKV, h_in1)
        if rank < D - 1:  # down the first segments, then wait for the way back up
            send_recv(h_out1, rank + 1, None, None, group=group, tag=_TAG, op="p2p",
                      backward=False)
            h_in2 = torch.empty_like(b2_BHKV, memory_format=torch.contiguous_format)
            send_recv(None, None, h_in2, rank + 1, group=group, tag=_TAG + 2, op="p2p",
                      backward=False)
        else:  # segment D follows segment D−1 on this rank: the turn is local
            h_in2 = h_out1
        h_out2 = apply_pair_parts(A2_BHKK, b2_BHKV, h_in2)
        if rank > 0:
            send_recv(h_out2, rank - 1, None, None, group=group, tag=_TAG + 2, op="p2p",
                      backward=False)
        ctx.save_for_backward(A1_BHKK, A2_BHKK, h_in1, h_in2)
        ctx.group = group
        return h_in1, h_in2, h_out2

    @staticmethod
    def backward(ctx, dh_in1_local, dh_in2_local, dh_out2_local):
        A1_BHKK, A2_BHKK, h_in1, h_in2 = ctx.saved_tensors
        rank, D = rank_size(ctx.group)
        # Second segments first (the forward's last hops), from rank 0 up to D−1 …
        dh_out2 = dh_out2_local.contiguous()
        if rank > 0:
            received = torch.empty_like(dh_out2)
            send_recv(None, None, received, rank - 1, group=ctx.group, tag=_TAG + 3, op="p2p",
                      backward=True)
            dh_out2 = dh_out2 + received
        dA2 = dh_out2 @ h_in2.transpose(-1, -2)
        dh_in2 = dh_in2_local + A2_BHKK.transpose(-1, -2) @ dh_out2
        if rank < D - 1:
            send_recv(dh_in2, rank + 1, None, None, group=ctx.group, tag=_TAG + 3, op="p2p",
                      backward=True)
            dh_out1 = torch.empty_like(dh_out2)
            send_recv(None, None, dh_out1, rank + 1, group=ctx.group, tag=_TAG + 1, op="p2p",
                      backward=True)
        else:
            dh_out1 = dh_in2
        # … then the first segments, from D−1 back down to rank 0.
        dA1 = dh_out1 @ h_in1.transpose(-1, -2)
        dh_in1 = dh_in1_local + A1_BHKK.transpose(-1, -2) @ dh_out1
        if rank > 0:
            send_recv(dh_in1, rank - 1, None, None, group=ctx.group, tag=_TAG + 1, op="p2p",
                      backward=True)
            return dA1, dh_out1, dA2, dh_out2, None, None
        return dA1, dh_out1, dA2, dh_out2, dh_in1, None


def apply_pair_parts(A_BHKK: torch.Tensor, b_BHKV: torch.Tensor,
                     h_BHKV: torch.Tensor) -> torch.Tensor:
    return torch.baddbmm(b_BHKV.flatten(0, 1), A_BHKK.flatten(0, 1),
                         h_BHKV.flatten(0, 1)).view_as(b_BHKV)


def p2p_exchange(P_BHKW: torch.Tensor, h0_BHKV: torch.Tensor, *, group,
                 output_final_state: bool):
    """(h_in, final state or None): the wavefront, then the last rank's h_out broadcast."""
    _, D = rank_size(group)
    K = P_BHKW.shape[-2]
    h_in, h_out = _Wavefront.apply(P_BHKW[..., :K], P_BHKW[..., K:], h0_BHKV, group)
    if not output_final_state:
        return h_in, None
    # Every rank passes its own h_out so the broadcast's backward precedes the wavefront's.
    return h_in, broadcast(h_out, src=D - 1, group=group, op="p2p_final_state")


def p2p_zigzag_exchange(pairs: tuple[torch.Tensor, torch.Tensor], h0_BHKV: torch.Tensor, *,
                        group, output_final_state: bool):
    """((h_in1, h_in2), final or None): the wavefront down and back up, then rank 0's last
    h_out broadcast."""
    K = pairs[0].shape[-2]
    h_in1, h_in2, h_out2 = _ZigzagWavefront.apply(
        pairs[0][..., :K], pairs[0][..., K:], pairs[1][..., :K], pairs[1][..., K:], h0_BHKV,
        group)
    if not output_final_state:
        return (h_in1, h_in2), None
    return (h_in1, h_in2), broadcast(h_out2, src=0, group=group, op="p2p_final_state")


chunk_gated_delta_rule_p2p = sequence_sharded(p2p_exchange, p2p_zigzag_exchange)
