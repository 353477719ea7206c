"""CP mode `log_scan`: Hillis–Steele prefix of the (A, b) pairs in ceil(log2 D) rounds.

Round r (shift d = 2^r) sends every chip's inclusive pair P_i (the composition of segments
max(0, i−2d+1) … i) to chip i + d, one lax.ppermute of B·H·K·(K+V)·4 bytes; chips i < d have
no source (they receive zeros) and keep their accumulators. Two accumulators per chip:

    P_i ← P_i ∘ received   (received applied first)    for sending on
    E_i ← E_i ∘ received   (received applied first)    everything before chip i

The segments reach chip i in decreasing position order (i−1, then i−3…i−2, then i−7…i−4, …), so
'received first' keeps E in sequence order, and after the last round E_i covers 0 … i−1:
h_in = E_i(h0) needs no extra round.

Backward (common.with_adjoint): the adjoint recurrence λ_i = ḡ_i + A_iᵀ λ_{i+1} is the same kind
of affine scan run from the last chip down, over the pairs (A_iᵀ, ḡ_i): the same Hillis–Steele
with shifts towards lower chips, the same rounds and bytes as the forward — except that only
λ = E(0), E's b part, is used, so XLA drops the A part of the last round's ppermute (a state
instead of a pair). Autodiff of the forward would send as much, but keep a received pair and
two accumulators per round.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..chunk import compose_affine
from .common import (AxisName, apply_pair, chip_count, chip_index, permute, sequence_sharded,
                     with_adjoint)


def exclusive_pairs(A_BHKK, b_BHKV, *, axis: AxisName, reverse: bool):
    """Compose every earlier chip's pair (later, if reverse) by Hillis–Steele; None on D = 1.

    Returns (A_BHKK, b_BHKV): on chip i the map 'pair_0, then pair_1, …, then pair_{i−1}'
    (reverse: 'pair_{D−1}, then …, then pair_{i+1}'); the identity where nothing precedes.
    """
    D, me = chip_count(axis), chip_index(axis)
    inclusive = (A_BHKK, b_BHKV)
    exclusive = None  # the identity until the first received segment
    shift = 1
    while shift < D:
        perm = [(i + shift, i) if reverse else (i, i + shift) for i in range(D - shift)]
        got_A_BHKK, got_b_BHKV = permute(inclusive, axis, perm)
        has_source = (me + shift < D) if reverse else (me >= shift)
        if exclusive is None:
            eye_BHKK = jnp.broadcast_to(jnp.eye(A_BHKK.shape[-1], dtype=A_BHKK.dtype),
                                        A_BHKK.shape)
            exclusive = (jnp.where(has_source, got_A_BHKK, eye_BHKK),
                         jnp.where(has_source, got_b_BHKV, 0.0))
        else:
            exclusive = _masked(has_source, compose_affine(got_A_BHKK, got_b_BHKV, *exclusive),
                                exclusive)
        if 2 * shift < D:  # the inclusive pair is only sent on while rounds remain
            inclusive = _masked(has_source, compose_affine(got_A_BHKK, got_b_BHKV, *inclusive),
                                inclusive)
        shift *= 2
    return exclusive


def _masked(keep_new, new_pair, old_pair):
    return tuple(jnp.where(keep_new, new, old) for new, old in zip(new_pair, old_pair))


def log_scan_forward(A_BHKK, b_BHKV, h0_BHKV, *, axis: AxisName):
    """h_in = E(h0), E the composition of every earlier chip's pair.

    Args: A_BHKK [B, H, K, K], b_BHKV [B, H, K, V] (this chip's pair), h0_BHKV [B, H, K, V].
    Returns h_in_BHKV [B, H, K, V] float32.
    """
    exclusive = exclusive_pairs(A_BHKK, b_BHKV, axis=axis, reverse=False)
    return h0_BHKV if exclusive is None else apply_pair(*exclusive, h0_BHKV)


def log_scan_adjoint(At_BHKK, dh_in_BHKV, *, axis: AxisName):
    """λ_{i+1} on chip i: the later chips' maps μ ↦ A_jᵀ μ + ḡ_j composed, applied to zero."""
    exclusive = exclusive_pairs(At_BHKK, dh_in_BHKV, axis=axis, reverse=True)
    return jnp.zeros_like(dh_in_BHKV) if exclusive is None else exclusive[1]


log_scan_incoming = with_adjoint(log_scan_forward, log_scan_adjoint)
log_scan_rule = sequence_sharded(log_scan_incoming)
