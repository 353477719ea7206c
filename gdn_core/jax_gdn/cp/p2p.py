"""CP mode `p2p`: a wavefront of the state along the segments, in sequence order.

Forward, step e = 0 … E−2: the chip holding segment e sends h_out = A h_in + b (its folded pair
applied to the state entering the segment) to the chip holding segment e+1, which takes it as
that segment's h_in. Contiguous: E = D, chips 0 → 1 → … → D−1, D−1 dependent rounds, each chip
receives one state, B·H·K·V·4 bytes. Zigzag: E = 2D, chips 0 → … → D−1 (which holds segments
D−1 and D: that step stays on the chip) → D−2 → … → 0, 2D−2 dependent rounds; chips 1 … D−2
receive two states, chips 0 and D−1 one.

Backward (common.with_adjoint): the reverse wavefront, e = E−1 … 1, carrying the adjoint
λ_e = ḡ_e + A_eᵀ λ_{e+1} — again one state per segment. This is what autodiff of the forward
would send too (the transpose of a ppermute is the reversed one), but autodiff would keep one
h_in residual per round: a state per segment, growing with the global sequence at a fixed
local shard.
"""

from __future__ import annotations

import jax.numpy as jnp

from ...cp_layout import Layout
from ..chunk import mm
from .common import AxisName, Segments, apply_pair, chip_count, sequence_sharded, with_adjoint


def _pass_along(step, start_SBHKV, *, axis: AxisName, layout: Layout, reverse: bool):
    """Walk the segments in order (reverse: from the last); per slot, what each received.

    step(slot, value_BHKV) -> what the segment in `slot` sends on, given what it received.
    The first segment of the walk keeps start_SBHKV[its slot].
    """
    seg = Segments(chip_count(axis), layout)
    received = list(start_SBHKV)
    order = range(seg.count - 1, 0, -1) if reverse else range(seg.count - 1)
    for e in order:
        slot = seg.owner[e][1]
        sent_BHKV = step(slot, received[slot])  # discarded except on segment e's chip
        target = e - 1 if reverse else e + 1
        (got_BHKV, has_source), = (r for r in seg.send([sent_BHKV] * seg.slots,
                                                       [(e, target)], axis=axis) if r)
        target_slot = seg.owner[target][1]
        received[target_slot] = jnp.where(has_source, got_BHKV, received[target_slot])
    return jnp.stack(received)


def p2p_forward(A_SBHKK, b_SBHKV, h0_BHKV, *, axis: AxisName, layout: Layout = "contiguous"):
    """h_in of each of this chip's segments: h0 for segment 0, else what the wavefront brings.

    Args: A_SBHKK [S, B, H, K, K], b_SBHKV [S, B, H, K, V] (this chip's pairs per slot),
    h0_BHKV [B, H, K, V]. Returns h_in_SBHKV [S, B, H, K, V] float32.
    """
    return _pass_along(lambda slot, h_in: apply_pair(A_SBHKK[slot], b_SBHKV[slot], h_in),
                       [h0_BHKV] * A_SBHKK.shape[0], axis=axis, layout=layout, reverse=False)


def p2p_adjoint(At_SBHKK, dh_in_SBHKV, *, axis: AxisName, layout: Layout = "contiguous"):
    """λ_{e+1} for this chip's segments by the reverse wavefront (zeros after the last)."""
    return _pass_along(lambda slot, lam_next: dh_in_SBHKV[slot] + mm(At_SBHKK[slot], lam_next),
                       list(jnp.zeros_like(dh_in_SBHKV)), axis=axis, layout=layout,
                       reverse=True)


p2p_incoming = with_adjoint(p2p_forward, p2p_adjoint)
p2p_rule = sequence_sharded(p2p_incoming)
