"""CP mode `p2p`: a rank-ordered wavefront of the state over D − 1 dependent rounds.

Forward, round j = 1 … D−1: a ppermute holding the single pair (j−1 → j): chip j−1 sends
h_out = A h_in + b (its folded pair applied to the state it received in round j−1) and chip j
takes it as its h_in. Each chip receives exactly one state, B·H·K·V·4 bytes.

Backward (common.with_adjoint): the reverse wavefront, round j = D−1 … 1, chip j → j−1,
carrying the adjoint λ_j = ḡ_j + A_jᵀ λ_{j+1} — again one state per chip. This is what
autodiff of the forward would send too (the transpose of a ppermute is the reversed one), but
autodiff would keep one h_in residual per round: D−1 states per chip, growing with the global
sequence at a fixed local shard.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..chunk import mm
from .common import (AxisName, apply_pair, chip_count, chip_index, permute, sequence_sharded,
                     with_adjoint)


def p2p_forward(A_BHKK, b_BHKV, h0_BHKV, *, axis: AxisName):
    """h_in on chip i: h0 on chip 0, else the state chip i−1 sends in round i.

    Args: A_BHKK [B, H, K, K], b_BHKV [B, H, K, V] (this chip's pair), h0_BHKV [B, H, K, V].
    Returns h_in_BHKV [B, H, K, V] float32.
    """
    D, me = chip_count(axis), chip_index(axis)
    h_in_BHKV = h0_BHKV
    for j in range(1, D):
        # Only chip j−1's h_out is sent; elsewhere this update is discarded (K×K×V flops).
        sent_BHKV = apply_pair(A_BHKK, b_BHKV, h_in_BHKV)
        received_BHKV = permute(sent_BHKV, axis, [(j - 1, j)])
        h_in_BHKV = jnp.where(me == j, received_BHKV, h_in_BHKV)
    return h_in_BHKV


def p2p_adjoint(At_BHKK, dh_in_BHKV, *, axis: AxisName):
    """λ_{i+1} on chip i by the reverse wavefront (zeros on the last chip). Shapes [B,H,K,·]."""
    D, me = chip_count(axis), chip_index(axis)
    lam_next_BHKV = jnp.zeros_like(dh_in_BHKV)
    for j in range(D - 1, 0, -1):
        # Chip j's λ_j is complete: it received λ_{j+1} in the previous (later) round.
        sent_BHKV = dh_in_BHKV + mm(At_BHKK, lam_next_BHKV)
        received_BHKV = permute(sent_BHKV, axis, [(j, j - 1)])
        lam_next_BHKV = jnp.where(me == j - 1, received_BHKV, lam_next_BHKV)
    return lam_next_BHKV


p2p_incoming = with_adjoint(p2p_forward, p2p_adjoint)
p2p_rule = sequence_sharded(p2p_incoming)
