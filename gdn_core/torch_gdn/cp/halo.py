"""The causal-conv halo of a sequence shard: the K−1 tokens just before each of its segments.

Contiguous layout: the previous rank's last K−1 tokens. Zigzag (gdn_core.cp_layout; rank r
holds segments r and 2D−1−r): segment r follows rank r−1's first segment, and segment 2D−1−r
follows rank r+1's second segment, or on rank D−1 its own first (no exchange). Counted by
comm.py: up to two halos received per rank and direction (one on ranks 0 and D−1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import global_rank, nbytes, rank_size, record, shift

_TAG = 10


def exchange_conv_halo(x_BTC: torch.Tensor, *, halo: int, group) -> torch.Tensor:
    """Receive the previous rank's last `halo` tokens of x (zeros on rank 0), differentiably.

    Args:
        x_BTC: this rank's shard [B, T_local, C] (rank order = sequence order).
        halo: tokens to receive, K−1 for a causal conv of kernel K; 0 gives an empty halo.
    Returns:
        halo_BKC [B, halo, C] in x's dtype. Backward sends its gradient back to the previous
        rank (which adds it to the gradient of its last `halo` tokens). Counted by comm.py:
        B·halo·C·itemsize received per rank except rank 0 (forward) and the last (backward).
    """
    T = x_BTC.shape[1]
    if halo < 0:
        raise ValueError(f"halo={halo} must be ≥ 0")
    if T < halo:
        raise ValueError(
            f"local shard of {T} tokens is shorter than the conv halo of {halo} tokens; "
            f"use at least {halo} tokens per rank")
    if halo == 0:
        return x_BTC[:, :0]
    return shift(x_BTC[:, T - halo:], 1, group=group, tag=_TAG, op="conv_halo")


def exchange_conv_halo_zigzag(x_BtC: torch.Tensor, *, halo: int,
                              group) -> tuple[torch.Tensor, torch.Tensor]:
    """The halos of this rank's two zigzag segments, differentiably: ([B, halo, C] before the
    first segment, zeros on rank 0; [B, halo, C] before the second).

    Args:
        x_BtC: this rank's shard [B, 2s, C], segment r then segment 2D−1−r.
        halo: tokens before each segment, K−1 for a causal conv of kernel K (≤ s).
    """
    t = x_BtC.shape[1]
    if halo < 0:
        raise ValueError(f"halo={halo} must be ≥ 0")
    if t % 2 or t // 2 < halo:
        raise ValueError(
            f"a zigzag shard of {t} tokens must be two segments of at least the conv halo of "
            f"{halo} tokens each (an even length ≥ {2 * halo})")
    s = t // 2
    first, second = x_BtC[:, :s], x_BtC[:, s:]
    if halo == 0:
        return first[:, :0], second[:, :0]
    rank, D = rank_size(group)
    halo_first, halo_second = _ZigzagHalo.apply(first[:, s - halo:], second[:, s - halo:], group)
    if rank == D - 1:  # segment D follows segment D−1, on this rank
        halo_second = first[:, s - halo:]
    return halo_first, halo_second


def _swap(to_prev, to_next, from_prev, from_next, *, group, tags: tuple[int, int],
          backward: bool) -> None:
    """Send to ranks r−1 and r+1 and receive from them, as one batch (where they exist).
    tags = (rank r → r+1, rank r → r−1)."""
    rank, D = rank_size(group)
    up, down = tags
    ops = []
    if rank > 0:
        ops += [dist.P2POp(dist.isend, to_prev.contiguous(), global_rank(group, rank - 1), group, down),
                dist.P2POp(dist.irecv, from_prev, global_rank(group, rank - 1), group, up)]
        record("conv_halo", nbytes(from_prev), backward=backward)
    if rank < D - 1:
        ops += [dist.P2POp(dist.isend, to_next.contiguous(), global_rank(group, rank + 1), group, up),
                dist.P2POp(dist.irecv, from_next, global_rank(group, rank + 1), group, down)]
        record("conv_halo", nbytes(from_next), backward=backward)
    for work in dist.batch_isend_irecv(ops) if ops else ():
        work.wait()


class _ZigzagHalo(torch.autograd.Function):
    """(first segment's last tokens, second's) → (halo from rank r−1's first segment, halo
    from rank r+1's second), both [B, halo, C], zeros where that rank does not exist."""

    @staticmethod
    def forward(ctx, first_tail, second_tail, group):
        ctx.group = group
        halo_first = torch.zeros_like(first_tail, memory_format=torch.contiguous_format)
        halo_second = torch.zeros_like(second_tail, memory_format=torch.contiguous_format)
        _swap(second_tail, first_tail, halo_first, halo_second, group=group,
              tags=(_TAG + 2, _TAG + 4), backward=False)
        return halo_first, halo_second

    @staticmethod
    def backward(ctx, d_halo_first, d_halo_second):
        # The mirror image: each halo's gradient goes back to the rank it came from.
        d_first_tail = torch.zeros_like(d_halo_first, memory_format=torch.contiguous_format)
        d_second_tail = torch.zeros_like(d_halo_second, memory_format=torch.contiguous_format)
        _swap(d_halo_first, d_halo_second, d_second_tail, d_first_tail, group=ctx.group,
              tags=(_TAG + 3, _TAG + 5), backward=True)
        return d_first_tail, d_second_tail, None
