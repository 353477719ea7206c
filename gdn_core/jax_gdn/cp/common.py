"""Pieces shared by the sequence-sharded CP modes (p2p, all_gather, log_scan).

Each chip holds a contiguous shard of the sequence; chip order along the (flattened) mesh axis
is position order. A chip's shard is an affine map of the state, h ↦ A h + b (A [B,H,K,K],
b [B,H,K,V], float32), folded from its chunks. The modes differ only in how a chip learns the
state entering its shard, h_in; everything else is here:

    prepare_chunks → fold_chunk_pairs → (mode: h_in) → scan_chunk_states(h_in) → chunk_outputs

Must run inside a shard_map (or any context that binds `axis`). `axis` is a mesh axis name or a
tuple of names, flattened major-to-minor (the first name is the most significant), as
lax.axis_index / all_gather / all_to_all read a tuple; point-to-point sends go through
`permute`, which maps positions to ppermute's own numbering.

The backward of the exchange is written out (`with_adjoint`, a custom VJP): reverse mode only
(jax.grad / jax.vjp); forward-mode (jax.jvp, jacfwd) is not supported through it.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, NamedSharding

from ..chunk import (ChunkTerms, chunk_outputs, fold_chunk_pairs, mm, prepare_chunks,
                     reverse_state_scan, scan_chunk_states)

AxisName = str | tuple[str, ...]


class IncomingState(Protocol):
    """How a mode finds the state entering this chip's shard.

    Args: A_BHKK, b_BHKV: this chip's folded pair (float32). h0_BHKV: the state before the
    global sequence (replicated). axis: the CP mesh axis. Returns h_in_BHKV (float32).
    """

    def __call__(self, A_BHKK: jax.Array, b_BHKV: jax.Array, h0_BHKV: jax.Array, *,
                 axis: AxisName) -> jax.Array: ...


def chip_index(axis: AxisName) -> jax.Array:
    """This chip's position in the sequence (int32 scalar), flattened over a tuple of axes."""
    return lax.axis_index(axis)


def chip_count(axis: AxisName) -> int:
    """Number of chips along `axis` (a Python int: axis sizes are static inside shard_map)."""
    return lax.axis_size(axis)


def axis_names(axis: AxisName) -> tuple[str, ...]:
    return (axis,) if isinstance(axis, str) else tuple(axis)


def permute(x, axis: AxisName, pairs):
    """lax.ppermute with (source, target) given as sequence positions along `axis`.

    jax 0.10.2: for a tuple of names, axis_index / all_gather / all_to_all flatten in the
    tuple's order, but ppermute numbers chips in the mesh's axis order. Positions are mapped
    to ppermute's numbering here so that every mode can think in sequence positions.
    """
    names = axis_names(axis)
    if len(names) > 1:
        mesh_names = tuple(jax.sharding.get_abstract_mesh().axis_names)
        if not set(names) <= set(mesh_names):
            raise ValueError(f"axis={axis!r} is not bound by the enclosing mesh {mesh_names}")
        in_mesh_order = tuple(sorted(names, key=mesh_names.index))
        if in_mesh_order != names:
            sizes = {name: lax.axis_size(name) for name in names}

            def renumber(position):
                coords = dict(zip(names, np.unravel_index(position, [sizes[n] for n in names])))
                return int(np.ravel_multi_index([coords[n] for n in in_mesh_order],
                                                [sizes[n] for n in in_mesh_order]))

            pairs = [(renumber(source), renumber(target)) for source, target in pairs]
    return lax.ppermute(x, axis, pairs)


def apply_pair(A_BHKK, b_BHKV, h_BHKV):
    """h ↦ A h + b, float32 with HIGHEST precision."""
    return mm(A_BHKK, h_BHKV) + b_BHKV


def vary_like(x, like):
    """x, typed as varying over the same mesh axes as `like` (adds zeros; XLA drops the add).

    A replicated value (h0) and a per-chip value must share a type to be a scan carry or a
    select operand under shard_map's replication check; lax.pcast refuses varying → varying,
    so this works whatever `x` already is.
    """
    return x + jnp.zeros_like(like)


def from_last_chip(x, axis: AxisName):
    """The last chip's `x` on every chip, as a replicated value: psum of a masked copy.

    One all-reduce of x's size; it is also what makes the result provably replicated for
    shard_map's out_specs=P() (a value computed identically on every chip is still 'varying').
    """
    is_last = chip_index(axis) == chip_count(axis) - 1
    return lax.psum(jnp.where(is_last, x, jnp.zeros_like(x)), axis)


class Exchange(NamedTuple):
    """A mode's exchange: `forward` finds h_in from the folded pairs, `adjoint` reverses it.

    forward(A_BHKK, b_BHKV, h0_BHKV, *, axis) -> h_in_BHKV.
    adjoint(At_BHKK, dh_in_BHKV, *, axis) -> λ_{i+1} on chip i: with chips i = 0 … D−1,
    h_in_{i+1} = A_i h_in_i + b_i and ḡ_i = ∂L/∂h_in_i from chip i's own outputs, the adjoints
    obey λ_i = ḡ_i + A_iᵀ λ_{i+1} (λ_D = 0); ∂L/∂h0 = λ_0 (chip 0).
    """

    forward: IncomingState
    adjoint: Callable
    name: str


def with_adjoint(forward: IncomingState, adjoint: Callable) -> Exchange:
    """Pair a mode's exchange with its hand-written backward (see replay_through_exchange)."""
    return Exchange(forward, adjoint, forward.__name__.removesuffix("_forward"))


def replay_through_exchange(exchange: Exchange, A_NBHKK, b_NBHKV, h0_BHKV, *, axis: AxisName):
    """This shard's chunk-entry states [N,B,H,K,V] and its final state, h_in from `exchange`.

    Forward: fold the chunks into (A, b), exchange, scan from h_in. Backward, written out: the
    exchange's cotangent on (A, b) is always (λ_{i+1} h_inᵀ, λ_{i+1}), which through the fold
    is exactly the replay scan's backward with λ_{i+1} added to its final state's cotangent. So
    no residual of the fold is kept (autodiff would keep a running pair per chunk, +15% per chip
    at production shapes), only A_n and the states the replay produces anyway; the price is a
    second reverse state scan (Dk²·Dv per chunk). Residuals are independent of D.
    """

    @partial(jax.custom_vjp, nondiff_argnums=(3,))
    def run(A_NBHKK, b_NBHKV, h0_BHKV, axis):
        return run_fwd(A_NBHKK, b_NBHKV, h0_BHKV, axis)[0]

    def run_fwd(A_NBHKK, b_NBHKV, h0_BHKV, axis):
        A_BHKK, b_BHKV = fold_chunk_pairs(A_NBHKK, b_NBHKV)
        h_in_BHKV = exchange.forward(A_BHKK, b_BHKV, h0_BHKV, axis=axis)
        states_NBHKV, h_out_BHKV = scan_chunk_states(A_NBHKK, b_NBHKV, h_in_BHKV)
        return (states_NBHKV, h_out_BHKV), (A_NBHKK, A_BHKK, states_NBHKV)

    def run_bwd(axis, residuals, cotangents):
        A_NBHKK, A_BHKK, states_NBHKV = residuals
        d_states_NBHKV, d_out_BHKV = cotangents
        # ḡ = ∂L/∂h_in through this shard's own outputs, then the exchange's adjoint.
        g_BHKV, _ = reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV, d_out_BHKV,
                                  with_pairs=False)
        At_BHKK = jnp.swapaxes(A_BHKK, -1, -2)
        lam_next_BHKV = exchange.adjoint(At_BHKK, g_BHKV, axis=axis)
        lam_BHKV = g_BHKV + mm(At_BHKK, lam_next_BHKV)
        dh0_BHKV = jnp.where(chip_index(axis) == 0, lam_BHKV, jnp.zeros_like(lam_BHKV))
        # The pairs' gradient: own outputs plus what later chips owe to this shard's fold.
        _, (dA_NBHKK, db_NBHKV) = reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV,
                                                d_out_BHKV + lam_next_BHKV, with_pairs=True)
        return dA_NBHKK, db_NBHKV, dh0_BHKV

    run.defvjp(run_fwd, run_bwd)
    # Cast h0 to per-chip once, outside the custom VJP: the cast's transpose is the single psum
    # making ∂L/∂h0 replicated (dropped from the program when h0 is a constant).
    return run(A_NBHKK, b_NBHKV, vary_like(h0_BHKV, b_NBHKV[0]), axis)


def sequence_sharded_rule(exchange: Exchange, q, k, v, g, beta, h0_BHKV, *, axis: AxisName,
                          output_final_state: bool, use_qk_l2norm: bool, chunk_size: int):
    """Run the rule on this chip's shard, finding h_in with `exchange`.

    Args (local shards): q, k [B, T_local, Hk, Dk]; v [B, T_local, Hv, Dv]; g, beta
        [B, T_local, Hv]; h0_BHKV [B, Hv, Dk, Dv] float32, replicated.
    Returns:
        o [B, T_local, Hv, Dv] in q's dtype; the float32 state after the global sequence
        [B, Hv, Dk, Dv] (replicated: the last chip's, broadcast) or None.
    """
    T_local = q.shape[1]
    terms: ChunkTerms = prepare_chunks(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm,
                                       chunk_size=chunk_size)
    states_NBHKV, h_out_BHKV = replay_through_exchange(exchange, terms.A_NBHKK, terms.b_NBHKV,
                                                       h0_BHKV, axis=axis)
    o = chunk_outputs(terms, states_NBHKV, T_local).astype(q.dtype)
    return o, (from_last_chip(h_out_BHKV, axis) if output_final_state else None)


def sequence_sharded(exchange: Exchange) -> Callable:
    """Make a mode's per-shard rule from its Exchange (the CP registry's entries)."""

    def rule(q, k, v, g, beta, h0_BHKV, *, axis, output_final_state, use_qk_l2norm, chunk_size):
        return sequence_sharded_rule(exchange, q, k, v, g, beta, h0_BHKV, axis=axis,
                                     output_final_state=output_final_state,
                                     use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size)

    rule.__name__ = rule.__qualname__ = f"{exchange.name}_rule"
    rule.__doc__ = (f"Per-shard rule, h_in from the {exchange.name} exchange; "
                    "see sequence_sharded_rule.")
    return rule


def mesh_chip_count(mesh, axis: AxisName) -> int:
    """Chips along `axis` of `mesh` (product over a tuple); ValueError names unknown axes."""
    names = axis_names(axis)
    missing = [name for name in names if name not in mesh.axis_names]
    if not names or missing:
        raise ValueError(f"axis={axis!r} must name axes of the mesh {tuple(mesh.axis_names)}; "
                         f"not found: {missing}")
    return math.prod(mesh.shape[name] for name in names)


def place_on_mesh(x, mesh, spec, axis: AxisName):
    """Reshard onto `spec` when the CP axes are Explicit (shard_map then demands the match)."""
    names = axis_names(axis)
    types = dict(zip(mesh.axis_names, mesh.axis_types))
    if all(types[name] == AxisType.Explicit for name in names):
        return jax.sharding.reshard(x, NamedSharding(mesh, spec))
    return x
