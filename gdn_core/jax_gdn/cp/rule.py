"""Entry points of the context-parallel rule: the registry, the per-shard rule and the global one.

`chunk_gated_delta_rule_cp_shard` runs inside an enclosing shard_map (the CP layer and model run
the whole model in one); `chunk_gated_delta_rule_cp` wraps it in a shard_map over `mesh` for
global arrays. Both validate (cp_modes.check_cp_shape); `cp_rule_shard_unchecked` is the per-shard
rule past those checks, for a CP layer whose caller validated the trial's settings once.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from ...cp_layout import Layout
from ...cp_modes import CP_MODES, check_cp_shape, check_mode
from ...shapes import check_rule_args
from ..chunk import chunk_gated_delta_rule, initial_state_or_zeros
from ..documents import check_cu_seqlens
from ..linear import vary_like, varying_axes
from .all_gather import all_gather_rule
from .common import AxisName, chip_count, mesh_chip_count, place_on_mesh
from .log_scan import log_scan_rule
from .p2p import p2p_rule
from .ulysses import ulysses_rule

# mode → per-shard rule(q, k, v, g, beta, h0_BHKV, *, axis, output_final_state, use_qk_l2norm,
# chunk_size, layout) -> (o, final_state | None)
CP_RULES: dict[str, Callable] = {
    "ulysses": ulysses_rule,
    "p2p": p2p_rule,
    "all_gather": all_gather_rule,
    "log_scan": log_scan_rule,
}
assert tuple(sorted(CP_RULES)) == tuple(sorted(CP_MODES)), "CP_RULES must cover CPMode exactly"


def _state_shape(initial_state):
    return None if initial_state is None else initial_state.shape


def chunk_gated_delta_rule_cp_shard(q, k, v, g, beta, *, axis: AxisName, mode: str,
                                    initial_state=None, output_final_state=False,
                                    use_qk_l2norm=False, chunk_size=64,
                                    layout: Layout = "contiguous", cu_seqlens=None):
    """Gated delta rule on this chip's sequence shard; call inside a shard_map binding `axis`.

    Args:
        q, k: [B, T/D, Hk, Dk]; v: [B, T/D, Hv, Dv]; g, beta: [B, T/D, Hv] — this chip's
            shard, the tokens cp_layout.local_positions(chip, D, T, layout) in that order
            (contiguous: chip order along `axis`, a name or a tuple flattened major-to-minor,
            is position order; zigzag: segments r and 2D−1−r of 2D on chip r).
        initial_state: [B, Hv, Dk, Dv] replicated, or None (zeros).
        mode: one of ulysses, p2p, all_gather, log_scan.
        layout: contiguous or zigzag (gdn_core.cp_layout).
        cu_seqlens: None, or the GLOBAL packed-document boundaries (int [N+1], 0 … T, all rows),
            replicated: each chip finds the starts among its own tokens (its layout's
            positions); the state is zero entering each document after the first.
    Returns:
        o [B, T/D, Hv, Dv] in q's dtype, and the float32 state after the global sequence
        [B, Hv, Dk, Dv] (replicated) if asked.
    """
    _, T_local, Hk, Hv, _, _ = check_rule_args(q.shape, k.shape, v.shape, g.shape, beta.shape,
                                               _state_shape(initial_state), chunk_size)
    D = chip_count(axis)
    check_cp_shape(mode=mode, chips=D, seq_len=T_local * D, num_k_heads=Hk, num_v_heads=Hv,
                   layout=layout)
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=T_local * D)
    return cp_rule_shard_unchecked(q, k, v, g, beta, axis=axis, mode=mode,
                                   initial_state=initial_state,
                                   output_final_state=output_final_state,
                                   use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size,
                                   layout=layout, cu_seqlens=cu_seqlens)


def cp_rule_shard_unchecked(q, k, v, g, beta, *, axis: AxisName, mode: str, initial_state=None,
                            output_final_state=False, use_qk_l2norm=False, chunk_size=64,
                            layout: Layout = "contiguous", cu_seqlens=None):
    """chunk_gated_delta_rule_cp_shard without its checks: for a caller that has validated
    mode, layout and shapes (the CP layer of a step whose settings were checked once). On one
    chip (either layout holds the sequence in order) it is the one-chip rule: no fold, no
    exchange."""
    (B, _, _, Dk), (_, _, Hv, Dv) = q.shape, v.shape
    if chip_count(axis) == 1:
        return _one_chip(q, k, v, g, beta, initial_state_or_zeros(initial_state, B, Hv, Dk, Dv),
                         axis=axis, output_final_state=output_final_state,
                         use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size,
                         cu_seqlens=cu_seqlens)
    h0_BHKV = initial_state_or_zeros(initial_state, B, Hv, Dk, Dv)
    documents = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
    return CP_RULES[mode](q, k, v, g, beta, h0_BHKV, axis=axis,
                          output_final_state=output_final_state,
                          use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size, layout=layout,
                          **documents)


def _one_chip(q, k, v, g, beta, h0_BHKV, *, axis, output_final_state, use_qk_l2norm,
              chunk_size, cu_seqlens):
    """The one-chip rule inside a shard_map over a one-chip `axis`. Under shard_map's
    replication check the state is cast to vary like the inputs (the scan carries it), and the
    final state is summed over the axis (one chip: the value itself) to come back replicated."""
    o, final = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=vary_like(h0_BHKV, q),
                                      output_final_state=output_final_state,
                                      use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size,
                                      cu_seqlens=cu_seqlens)
    if final is not None and varying_axes(final):
        final = lax.psum(final, axis)
    return o, final


def chunk_gated_delta_rule_cp(q, k, v, g, beta, *, mesh, axis: AxisName, mode: str,
                              layout: Layout = "contiguous", initial_state=None,
                              output_final_state=False, use_qk_l2norm=False, chunk_size=64,
                              cu_seqlens=None):
    """Gated delta rule on global arrays whose sequence (dim 1) is split over mesh axis `axis`.

    Args: as chunk_gated_delta_rule with global shapes (q, k [B, T, Hk, Dk], v [B, T, Hv, Dv],
        g, beta [B, T, Hv], initial_state [B, Hv, Dk, Dv] replicated), plus `mesh`, `axis` (a
        name or a tuple of names; chip count D = product of their sizes), `mode` and `layout`.
        layout="zigzag": dim 1 holds the sequence in shard order (x[:, cp_layout.shard_order(
        chips=D, seq_len=T, layout="zigzag")]) and o comes back in that order; nothing is
        re-sharded inside. cu_seqlens: None, or packed documents (int [N+1], 0 … T in
        SEQUENCE positions whatever the layout, all rows), replicated to every chip.
    Returns: o [B, T, Hv, Dv] (sequence-sharded over `axis`, q's dtype) and, if asked, the
        float32 final state [B, Hv, Dk, Dv] replicated. jit- and grad-able.
    Raises ValueError naming the numbers: unknown mode, layout or axis, T not divisible by D
        (by 2D under zigzag), ulysses value heads not divisible by D, bad rule shapes.
    """
    check_mode(mode)
    D = mesh_chip_count(mesh, axis)
    axis = axis if isinstance(axis, str) else tuple(axis)
    _, T, Hk, Hv, _, _ = check_rule_args(q.shape, k.shape, v.shape, g.shape, beta.shape,
                                         _state_shape(initial_state), chunk_size)
    check_cp_shape(mode=mode, chips=D, seq_len=T, num_k_heads=Hk, num_v_heads=Hv,
                   layout=layout)
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=T)
    seq_spec = P(None, axis)
    kwargs = dict(axis=axis, mode=mode, output_final_state=output_final_state,
                  use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size, layout=layout)
    args = [place_on_mesh(x, mesh, seq_spec, axis) for x in (q, k, v, g, beta)]
    in_specs = [seq_spec] * 5
    extras = {name: x for name, x in (("initial_state", initial_state),
                                       ("cu_seqlens", cu_seqlens)) if x is not None}
    args.append({name: place_on_mesh(x, mesh, P(), axis) for name, x in extras.items()})
    in_specs.append(P())

    def shard(q, k, v, g, beta, extras):  # checked above, once
        o, final = cp_rule_shard_unchecked(q, k, v, g, beta, **extras, **kwargs)
        return (o, final) if output_final_state else o

    out_specs = (seq_spec, P()) if output_final_state else seq_spec
    out = jax.shard_map(shard, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs)(*args)
    return out if output_final_state else (out, None)
