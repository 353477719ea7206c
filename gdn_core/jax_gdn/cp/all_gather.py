"""CP mode `all_gather`: gather every chip's folded (A, b) pairs, prefix them locally.

Forward: one all-gather of the chips' pairs — one per segment the chip holds, so each chip
receives (D−1)·S·B·H·K·(K+V)·4 bytes (S = 1 contiguous, 2 zigzag) — then a sequential lax.scan
applying the E = S·D pairs in sequence order to h0 (E state updates, no K×K products); each
chip keeps the state entering each of its segments.

Backward (common.with_adjoint): the same over the pairs (A_eᵀ, ḡ_e) in reverse order from
zero — one all-gather of the same bytes — gives λ_{e+1}. The gathered pairs are transient in
each direction (E pairs per chip, freed after the scan); autodiff of the forward would instead
keep them and the E scanned states for the backward and reduce-scatter their cotangents.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ...cp_layout import Layout
from .common import (AxisName, Segments, apply_pair, chip_count, chip_index, sequence_sharded,
                     vary_like, with_adjoint)


def exclusive_apply(A_SBHKK, b_SBHKV, x0_BHKV, *, axis: AxisName, layout: Layout,
                    reverse: bool):
    """Apply every earlier segment's pair to x0 in sequence order (later segments, from the
    last one down, if reverse); return the value entering each of this chip's segments.

    Gathered: [D, S, B, H, K, ·] (the pairs of the E segments, independent of the sequence
    length). Returns [S, B, H, K, V] float32.
    """
    seg = Segments(chip_count(axis), layout)
    # Rows of the gathered [D·S] stack in sequence order (chip c's slot s is row c·S + s).
    rows = np.array([chip * seg.slots + slot for chip, slot in seg.owner])
    in_order = (lambda x: x) if (rows == np.arange(seg.count)).all() else (lambda x: x[rows])

    def gathered(x_SBHK_):  # [S, B, ...] -> [E, B, ...] in sequence order
        x = lax.all_gather(x_SBHK_, axis, axis=0, tiled=True)
        return in_order(x)

    A_EBHKK, b_EBHKV = gathered(A_SBHKK), gathered(b_SBHKV)
    mine_S = jnp.asarray(seg.element_of)[chip_index(axis)]  # this chip's segments, per slot

    def step(carry, xs):
        x_BHKV, x_at_mine_SBHKV = carry
        position, A_pos_BHKK, b_pos_BHKV = xs
        is_mine_S = (mine_S == position)[:, None, None, None, None]
        x_at_mine_SBHKV = jnp.where(is_mine_S, x_BHKV, x_at_mine_SBHKV)
        return (apply_pair(A_pos_BHKK, b_pos_BHKV, x_BHKV), x_at_mine_SBHKV), None

    positions = jnp.arange(seg.count, dtype=mine_S.dtype)
    x0_BHKV = vary_like(x0_BHKV, b_SBHKV[0])
    start = (x0_BHKV, jnp.broadcast_to(x0_BHKV, b_SBHKV.shape))
    (_, x_at_mine_SBHKV), _ = lax.scan(step, start, (positions, A_EBHKK, b_EBHKV),
                                       reverse=reverse)
    return x_at_mine_SBHKV


def all_gather_forward(A_SBHKK, b_SBHKV, h0_BHKV, *, axis: AxisName,
                       layout: Layout = "contiguous"):
    """h_in = (pair_{e−1} ∘ … ∘ pair_0)(h0) for each of this chip's segments e."""
    return exclusive_apply(A_SBHKK, b_SBHKV, h0_BHKV, axis=axis, layout=layout, reverse=False)


def all_gather_adjoint(At_SBHKK, dh_in_SBHKV, *, axis: AxisName, layout: Layout = "contiguous"):
    """λ_{e+1} for this chip's segments: μ ↦ A_jᵀ μ + ḡ_j for j = E−1 … e+1, from zero."""
    return exclusive_apply(At_SBHKK, dh_in_SBHKV, jnp.zeros_like(dh_in_SBHKV[0]), axis=axis,
                           layout=layout, reverse=True)


all_gather_incoming = with_adjoint(all_gather_forward, all_gather_adjoint)
all_gather_rule = sequence_sharded(all_gather_incoming)
