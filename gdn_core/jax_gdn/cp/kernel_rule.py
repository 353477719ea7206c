"""A one-chip JAX rule kernel with the state in and out (the Pallas chunk rule) composed with
this package's CP exchanges through the kernel's call alone, as torch_gdn/cp/kernel_rule.py.

The kernel protocol (gdn_core.jax_gdn.pallas.chunk_gated_delta_rule_pallas, partially applied):
    kernel(q, k, v, g, beta, *, initial_state, output_final_state, use_qk_l2norm, doc_starts)
        -> (o, final_state)
doc_starts: bool [B, T] or None, the tokens whose entering state is zero (token 0 included);
ulysses (cp/ulysses.py, the kernel as its one-chip rule) passes global cu_seqlens instead.

The rule's state map over a segment is affine in the incoming state: h ↦ A h + b. So ONE call
with values [0_K | v] (width K+V) from initial_state [I_K | 0] returns P = [A | b]
([B, H, K, K+V], float32): the pair the exchanges take (common.py).

Sequence-sharded modes (p2p, all_gather, log_scan); a chip's segments (zigzag: two) run as one
batch (common.segments_as_batch), so each step is one kernel call per chip:
    1. P = summary call (float32 inputs, q unused);
    2. the mode's Exchange (forward; backward by its written-out adjoint) → h_in per segment;
    3. (o, h_out) = kernel(…, initial_state=h_in); the last segment's h_out is the final state.
Cost: 2 calls, the first at width K+V (≈ 3× one rule call at K = V, forward and backward),
against 1 for ulysses, whose all-to-all gives a chip whole sequences of its heads.
Gradients: the kernel's custom_vjp for the calls; the exchange's adjoint for h_in (the
cotangents of A and b are λ_{e+1} h_inᵀ and λ_{e+1}, common.replay_through_exchange's).

Packed documents (global cu_seqlens, replicated, may be traced): each segment's starts come
from its global positions (common.segment_positions); a segment holding a start summarises to
A = 0 by itself, and one beginning with a start ignores h_in (the kernel resets at token 0).
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from ...cp_layout import Layout
from ..chunk import mm
from ..documents import document_starts
from .all_gather import all_gather_incoming
from ..linear import vary_like
from .common import (AxisName, Exchange, Segments, batch_as_segments, chip_count, chip_index,
                     from_chip, segment_positions, segments_as_batch)
from .log_scan import log_scan_incoming
from .p2p import p2p_incoming
from .ulysses import ulysses_rule

StateKernel = Callable[..., tuple]
"""kernel(q, k, v, g, beta, *, initial_state, output_final_state, use_qk_l2norm, doc_starts)
-> (o, final_state); under ulysses (one call on whole sequences) cu_seqlens instead of
doc_starts."""

EXCHANGES: dict[str, Exchange] = {
    "p2p": p2p_incoming,
    "all_gather": all_gather_incoming,
    "log_scan": log_scan_incoming,
}
KERNEL_CP_MODES = ("ulysses", *EXCHANGES)


def _swap(x):
    return jnp.swapaxes(x, -1, -2)


def kernel_summary(kernel: StateKernel, q, k, v, g, beta, *, use_qk_l2norm: bool,
                   doc_starts=None):
    """The segments' pairs (A [B, H, K, K], b [B, H, K, V], float32) from one kernel call."""
    B, T, H, V = v.shape
    K = k.shape[-1]
    f32 = jnp.float32
    v_wide = jnp.concatenate([jnp.zeros((B, T, H, K), f32), v.astype(f32)], axis=-1)
    identity_then_zeros = jnp.concatenate(
        [jnp.broadcast_to(jnp.eye(K, dtype=f32), (B, H, K, K)), jnp.zeros((B, H, K, V), f32)],
        axis=-1)
    _, P = kernel(lax.stop_gradient(q).astype(f32), k.astype(f32), v_wide, g.astype(f32),
                  beta.astype(f32), initial_state=vary_like(identity_then_zeros, v_wide),
                  output_final_state=True, use_qk_l2norm=use_qk_l2norm, doc_starts=doc_starts)
    return P[..., :K], P[..., K:]


def incoming_states(exchange: Exchange, A_SBHKK, b_SBHKV, h0_BHKV, *, axis: AxisName,
                    layout: Layout):
    """h_in of each of this chip's segments [S, B, H, K, V] from its pairs, by `exchange`;
    reverse mode through the exchange's adjoint."""

    @partial(jax.custom_vjp, nondiff_argnums=(3,))
    def run(A, b, h0, axis):
        return exchange.forward(A, b, h0, axis=axis, layout=layout)

    def run_fwd(A, b, h0, axis):
        h_in = exchange.forward(A, b, h0, axis=axis, layout=layout)
        return h_in, (A, h_in)

    def run_bwd(axis, residuals, dh_in):
        A, h_in = residuals
        At = _swap(A)
        lam_next = exchange.adjoint(At, dh_in, axis=axis, layout=layout)  # λ_{e+1} per slot
        lam_first = dh_in[0] + mm(At[0], lam_next[0])  # λ of slot 0; ∂L/∂h0 on chip 0
        dh0 = jnp.where(chip_index(axis) == 0, lam_first, jnp.zeros_like(lam_first))
        return mm(lam_next, _swap(h_in)), lam_next, dh0

    run.defvjp(run_fwd, run_bwd)
    # Cast h0 to per-chip outside the custom VJP: the cast's transpose sums ∂L/∂h0 over chips.
    return run(A_SBHKK, b_SBHKV, vary_like(h0_BHKV, b_SBHKV[0]), axis)


def sequence_sharded_kernel_rule(kernel: StateKernel, q, k, v, g, beta, h0_BHKV, *,
                                 axis: AxisName, mode: str, output_final_state: bool,
                                 use_qk_l2norm: bool, layout: Layout = "contiguous",
                                 cu_seqlens=None):
    """This chip's o [B, t, Hv, Dv] (q's dtype) and the final state (replicated) or None."""
    exchange = EXCHANGES[mode]
    seg = Segments(chip_count(axis), layout)
    S, (B, t) = seg.slots, q.shape[:2]
    starts = None
    if cu_seqlens is not None:  # [S, s] → [S·B, s], the rows of segments_as_batch
        positions_Ss = segment_positions(axis=axis, layout=layout, seq_len=t * seg.chips)
        starts = jnp.repeat(document_starts(cu_seqlens, positions_Ss), B, axis=0)
    xs = [segments_as_batch(x, S) for x in (q, k, v, g, beta)]
    A, b = kernel_summary(kernel, *xs, use_qk_l2norm=use_qk_l2norm, doc_starts=starts)

    def by_slot(x):  # [S·B, ...] -> [S, B, ...]
        return x.reshape(S, B, *x.shape[1:])

    h_in = incoming_states(exchange, by_slot(A), by_slot(b), h0_BHKV, axis=axis, layout=layout)
    o, h_out = kernel(*xs, initial_state=h_in.reshape(S * B, *h_in.shape[2:]),
                      output_final_state=True, use_qk_l2norm=use_qk_l2norm, doc_starts=starts)
    o = batch_as_segments(o, S).astype(q.dtype)
    if not output_final_state:
        return o, None
    last_chip, last_slot = seg.owner[-1]
    return o, from_chip(by_slot(h_out)[last_slot], last_chip, axis)


def kernel_rule_shard(kernel: StateKernel, q, k, v, g, beta, h0_BHKV, *, axis: AxisName,
                      mode: str, output_final_state: bool, use_qk_l2norm: bool,
                      layout: Layout = "contiguous", cu_seqlens=None):
    """The per-shard rule of `mode` with every rule step a call of `kernel`; inside a
    shard_map binding `axis`. Shapes as common.sequence_sharded_rule (h0 float32,
    replicated; cu_seqlens global); validation is the caller's (rule.py's checks)."""
    if mode not in KERNEL_CP_MODES:
        raise ValueError(f"mode={mode!r} is not one of: {', '.join(KERNEL_CP_MODES)}")
    kwargs = dict(axis=axis, output_final_state=output_final_state, layout=layout,
                  use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens)
    if mode == "ulysses":  # one kernel call per chip on its heads: ulysses' own rule
        return ulysses_rule(q, k, v, g, beta, h0_BHKV, rule=kernel, chunk_size=None, **kwargs)
    return sequence_sharded_kernel_rule(kernel, q, k, v, g, beta, h0_BHKV, mode=mode, **kwargs)


def kernel_cp_rule_shard(q, k, v, g, beta, *, kernel: StateKernel, axis: AxisName, mode: str,
                         layout: Layout = "contiguous", initial_state=None,
                         output_final_state=False, use_qk_l2norm=False, chunk_size=64,
                         cu_seqlens=None):
    """rule.cp_rule_shard_unchecked's signature with every rule step a call of `kernel` (which
    also takes chunk_size): what a CP layer's `rule` needs to run the kernel. On one chip the
    kernel runs alone from h0 (either layout holds the sequence in order)."""
    (B, T, _, Dk), (_, _, Hv, Dv) = q.shape, v.shape
    h0 = (jnp.zeros((B, Hv, Dk, Dv), jnp.float32) if initial_state is None
          else initial_state.astype(jnp.float32))
    kernel = partial(kernel, chunk_size=chunk_size)
    if chip_count(axis) == 1:
        starts = None if cu_seqlens is None else document_starts(cu_seqlens,
                                                                 jnp.arange(T))[None]
        o, final = kernel(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                          use_qk_l2norm=use_qk_l2norm, doc_starts=starts)
        return o, (final if output_final_state else None)
    return kernel_rule_shard(kernel, q, k, v, g, beta, h0, axis=axis, mode=mode,
                             output_final_state=output_final_state,
                             use_qk_l2norm=use_qk_l2norm, layout=layout,
                             cu_seqlens=cu_seqlens)
