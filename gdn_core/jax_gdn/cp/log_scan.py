"""CP mode `log_scan`: Hillis–Steele prefix of the segments' (A, b) pairs in ceil(log2 E) rounds.

Round r (shift d = 2^r) sends every segment's inclusive pair P_e (the composition of segments
max(0, e−2d+1) … e) to segment e + d, B·H·K·(K+V)·4 bytes per move; segments e < d have no
source and keep their accumulators. Two accumulators per segment:

    P_e ← P_e ∘ received   (received applied first)    for sending on
    E_e ← E_e ∘ received   (received applied first)    everything before segment e

The segments reach e in decreasing position order (e−1, then e−3…e−2, then e−7…e−4, …), so
'received first' keeps E in sequence order, and after the last round E_e covers 0 … e−1:
h_in = E_e(h0) needs no extra round. Contiguous: E = D segments, one per chip, one ppermute
per round, each chip receives at most log2(D) pairs. Zigzag: E = 2D, two segments per chip
(common.Segments.send: one ppermute per pair of slots, a move inside chip D−1 costs nothing),
log2(2D) rounds, each chip receiving at most two pairs per round.

Backward (common.with_adjoint): the adjoint recurrence λ_e = ḡ_e + A_eᵀ λ_{e+1} is the same kind
of affine scan run from the last segment down, over the pairs (A_eᵀ, ḡ_e): the same
Hillis–Steele with shifts towards earlier segments, the same rounds and bytes as the forward —
except that only λ = E(0), E's b part, is used, so XLA drops the A part of the last round's
ppermutes (a state instead of a pair). Autodiff of the forward would send as much, but keep a
received pair and two accumulators per round.
"""

from __future__ import annotations

import jax.numpy as jnp

from ...cp_layout import Layout
from ..chunk import compose_affine
from .common import AxisName, Segments, apply_pair, chip_count, sequence_sharded, with_adjoint


def exclusive_pairs(A_SBHKK, b_SBHKV, *, axis: AxisName, layout: Layout, reverse: bool):
    """Compose every earlier segment's pair (later, if reverse) by Hillis–Steele.

    Returns per slot (A_BHKK, b_BHKV): for segment e the map 'pair_0, then pair_1, …, then
    pair_{e−1}' (reverse: 'pair_{E−1}, then …, then pair_{e+1}'); the identity where nothing
    precedes; None for a slot nothing ever reaches (one chip).
    """
    seg = Segments(chip_count(axis), layout)
    inclusive = [(A_SBHKK[s], b_SBHKV[s]) for s in range(seg.slots)]
    exclusive = [None] * seg.slots  # the identity until the first received segment
    shift = 1
    while shift < seg.count:
        moves = [(e + shift, e) if reverse else (e, e + shift)
                 for e in range(seg.count - shift)]
        received = seg.send(inclusive, moves, axis=axis)
        for slot, got in enumerate(received):
            if got is None:
                continue
            (got_A_BHKK, got_b_BHKV), has_source = got
            if exclusive[slot] is None:
                A_BHKK = inclusive[slot][0]
                eye_BHKK = jnp.broadcast_to(jnp.eye(A_BHKK.shape[-1], dtype=A_BHKK.dtype),
                                            A_BHKK.shape)
                exclusive[slot] = (jnp.where(has_source, got_A_BHKK, eye_BHKK),
                                   jnp.where(has_source, got_b_BHKV, 0.0))
            else:
                exclusive[slot] = _masked(
                    has_source, compose_affine(got_A_BHKK, got_b_BHKV, *exclusive[slot]),
                    exclusive[slot])
            if 2 * shift < seg.count:  # the inclusive pair is only sent on while rounds remain
                inclusive[slot] = _masked(
                    has_source, compose_affine(got_A_BHKK, got_b_BHKV, *inclusive[slot]),
                    inclusive[slot])
        shift *= 2
    return exclusive


def _masked(keep_new, new_pair, old_pair):
    return tuple(jnp.where(keep_new, new, old) for new, old in zip(new_pair, old_pair))


def log_scan_forward(A_SBHKK, b_SBHKV, h0_BHKV, *, axis: AxisName,
                     layout: Layout = "contiguous"):
    """h_in = E(h0) per slot, E the composition of every earlier segment's pair.

    Args: A_SBHKK [S, B, H, K, K], b_SBHKV [S, B, H, K, V] (this chip's pairs per slot),
    h0_BHKV [B, H, K, V]. Returns h_in_SBHKV [S, B, H, K, V] float32.
    """
    exclusive = exclusive_pairs(A_SBHKK, b_SBHKV, axis=axis, layout=layout, reverse=False)
    return jnp.stack([h0_BHKV if pair is None else apply_pair(*pair, h0_BHKV)
                      for pair in exclusive])


def log_scan_adjoint(At_SBHKK, dh_in_SBHKV, *, axis: AxisName, layout: Layout = "contiguous"):
    """λ_{e+1} per slot: the later segments' maps μ ↦ A_jᵀ μ + ḡ_j composed, applied to 0."""
    exclusive = exclusive_pairs(At_SBHKK, dh_in_SBHKV, axis=axis, layout=layout, reverse=True)
    return jnp.stack([jnp.zeros_like(dh_in_SBHKV[slot]) if pair is None else pair[1]
                      for slot, pair in enumerate(exclusive)])


log_scan_incoming = with_adjoint(log_scan_forward, log_scan_adjoint)
log_scan_rule = sequence_sharded(log_scan_incoming)
