"""The causal-conv halo of a sequence shard: the previous rank's last K−1 tokens."""

from __future__ import annotations

import torch

from .comm import shift

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
    B, T, C = x_BTC.shape
    if halo < 0:
        raise ValueError(f"halo={halo} must be ≥ 0")
    if T < halo:
        raise ValueError(
            f"local shard of {T} tokens is shorter than the conv halo of {halo} tokens; "
            f"use at least {halo} tokens per rank")
    if halo == 0:
        return x_BTC[:, :0]
    return shift(x_BTC[:, T - halo:], 1, group=group, tag=_TAG, op="conv_halo")
