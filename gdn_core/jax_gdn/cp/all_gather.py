"""CP mode `all_gather`: gather every chip's folded (A, b) pair, prefix them locally.

Forward: one all-gather of the D pairs (each chip receives (D−1)·B·H·K·(K+V)·4 bytes), then a
sequential lax.scan applying them in order to h0 (D state updates, no K×K products); chip i
keeps the state entering position i.

Backward (common.with_adjoint): the same over the pairs (A_jᵀ, ḡ_j) in reverse order from
zero — one all-gather of the same bytes — gives λ_{i+1}. The gathered pairs are transient in
each direction (D pairs per chip, freed after the scan); autodiff of the forward would instead
keep them and the D scanned states for the backward and reduce-scatter their cotangents.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .common import (AxisName, apply_pair, chip_index, sequence_sharded, vary_like,
                     with_adjoint)


def exclusive_apply(A_BHKK, b_BHKV, x0_BHKV, *, axis: AxisName, reverse: bool):
    """Apply every earlier chip's pair to x0 in position order (later chips, from the last
    one down, if reverse); return the value entering this chip's position.

    Gathered: A_DBHKK [D, B, H, K, K], b_DBHKV [D, B, H, K, V] (D pairs, independent of the
    sequence length). Returns [B, H, K, V] float32.
    """
    A_DBHKK = lax.all_gather(A_BHKK, axis, axis=0, tiled=False)
    b_DBHKV = lax.all_gather(b_BHKV, axis, axis=0, tiled=False)
    me = chip_index(axis)

    def step(carry, xs):
        x_BHKV, x_at_me_BHKV = carry
        position, A_pos_BHKK, b_pos_BHKV = xs
        x_at_me_BHKV = jnp.where(position == me, x_BHKV, x_at_me_BHKV)
        return (apply_pair(A_pos_BHKK, b_pos_BHKV, x_BHKV), x_at_me_BHKV), None

    positions = jnp.arange(A_DBHKK.shape[0], dtype=me.dtype)
    x0_BHKV = vary_like(x0_BHKV, b_BHKV)
    (_, x_at_me_BHKV), _ = lax.scan(step, (x0_BHKV, x0_BHKV), (positions, A_DBHKK, b_DBHKV),
                                    reverse=reverse)
    return x_at_me_BHKV


def all_gather_forward(A_BHKK, b_BHKV, h0_BHKV, *, axis: AxisName):
    """h_in = (pair_{i−1} ∘ … ∘ pair_0)(h0) on chip i. Shapes [B, H, K, ·]."""
    return exclusive_apply(A_BHKK, b_BHKV, h0_BHKV, axis=axis, reverse=False)


def all_gather_adjoint(At_BHKK, dh_in_BHKV, *, axis: AxisName):
    """λ_{i+1} on chip i: μ ↦ A_jᵀ μ + ḡ_j for j = D−1 … i+1, from zero."""
    return exclusive_apply(At_BHKK, dh_in_BHKV, jnp.zeros_like(dh_in_BHKV), axis=axis,
                           reverse=True)


all_gather_incoming = with_adjoint(all_gather_forward, all_gather_adjoint)
all_gather_rule = sequence_sharded(all_gather_incoming)
