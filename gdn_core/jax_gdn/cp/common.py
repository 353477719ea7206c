"""Pieces shared by the sequence-sharded CP modes (p2p, all_gather, log_scan).

The global sequence is cut into E segments held by the chips as `layout` says
(gdn_core.cp_layout): contiguous, E = D and chip i holds segment i; zigzag, E = 2D and chip i
holds segments i and 2D−1−i, one per *slot* (a chip's local shard is its slots in order). A
segment is an affine map of the state, h ↦ A h + b (A [B,H,K,K], b [B,H,K,V], float32), folded
from its chunks. The modes differ only in how each segment learns the state entering it, h_in;
everything else is here:

    prepare_chunks → fold_chunk_pairs → (mode: h_in per segment) → scan_chunk_states(h_in)
    → chunk_outputs

A chip's segments travel as one batch (the slot axis folded into B), so each step above runs
once per chip whatever the layout. Exchanges see per-slot stacks: A_SBHKK [S, B, H, K, K].
They think in segments (`Segments`: which chip and slot hold segment e) and move values between
segments with `Segments.send`, which turns one round of segment-to-segment moves into
ppermutes between chips (moves inside a chip cost nothing).

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

from ...cp_layout import Layout, check_layout, segments
from ..chunk import (ChunkTerms, chunk_outputs, fold_chunk_pairs, mm, prepare_chunks,
                     reverse_state_scan, scan_chunk_states)
from ..documents import document_starts

AxisName = str | tuple[str, ...]


class IncomingState(Protocol):
    """How a mode finds the state entering each of this chip's segments.

    Args: A_SBHKK, b_SBHKV: this chip's folded pairs, one per slot (float32). h0_BHKV: the
    state before the global sequence (replicated). axis: the CP mesh axis. layout: the
    sequence layout (cp_layout). Returns h_in_SBHKV (float32), one state per slot.
    """

    def __call__(self, A_SBHKK: jax.Array, b_SBHKV: jax.Array, h0_BHKV: jax.Array, *,
                 axis: AxisName, layout: Layout) -> jax.Array: ...


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


class Segments:
    """Which chip and slot hold each of the E segments of the sequence, for D chips.

    Built from gdn_core.cp_layout.segments (the one definition of the layout): `element_of`
    [D, S] is the segment in each chip's slot, `owner[e]` the (chip, slot) of segment e.
    Everything here is static (Python ints and numpy); only `me` is traced.
    """

    def __init__(self, chips: int, layout: Layout):
        check_layout(layout)
        self.chips, self.layout = chips, layout
        self.element_of = np.array([segments(chip=c, chips=chips, layout=layout)
                                    for c in range(chips)])
        self.slots = self.element_of.shape[1]
        self.count = chips * self.slots
        self.owner = [None] * self.count
        for chip, row in enumerate(self.element_of):
            for slot, e in enumerate(row):
                self.owner[e] = (chip, slot)

    def on_chip(self, me, chips) -> jax.Array:
        """Whether this chip (traced index `me`) is among `chips` (a Python iterable)."""
        mask = np.zeros(self.chips, bool)
        mask[list(chips)] = True
        return jnp.asarray(mask)[me]

    def send(self, values_S, moves, *, axis: AxisName):
        """One round of moves between segments: [(source segment, target segment)], each
        segment at most once a source and once a target.

        values_S: per slot, the pytree this chip's segment in that slot sends.
        Returns per slot None (no move targets that slot on any chip) or (received pytree,
        has_source): what the segment in this chip's slot received, and whether it received
        anything (zeros where not). Moves between chips are one ppermute per (source slot,
        target slot) class: each chip receives at most one value per slot per round; a move
        inside a chip is a select.
        """
        me = chip_index(axis)
        received = []
        for target_slot in range(self.slots):
            got, targets = None, []  # what this slot received so far; which chips got it
            for source_slot in range(self.slots):
                pairs = [(self.owner[src][0], self.owner[dst][0]) for src, dst in moves
                         if self.owner[src][1] == source_slot
                         and self.owner[dst][1] == target_slot]
                remote = [(s, t) for s, t in pairs if s != t]
                local = [t for s, t in pairs if s == t]
                arrivals = []
                if remote:
                    arrivals.append((permute(values_S[source_slot], axis, remote),
                                     [t for _, t in remote]))
                if local:
                    arrivals.append((values_S[source_slot], local))
                for value, chips in arrivals:
                    got = value if got is None else _select(self.on_chip(me, chips), value, got)
                    targets += chips
            received.append(None if got is None else (got, self.on_chip(me, targets)))
        return received


def segments_as_batch(x_Bt_, slots: int):
    """[B, S·s, ...] -> [S·B, s, ...]: each of a chip's S segments its own sequence (slot 0's
    B rows first), so a single-sequence step runs once for all of them."""
    B, t = x_Bt_.shape[:2]
    x = x_Bt_.reshape(B, slots, t // slots, *x_Bt_.shape[2:])
    return jnp.swapaxes(x, 0, 1).reshape(slots * B, t // slots, *x_Bt_.shape[2:])


def batch_as_segments(x_Bs_, slots: int):
    """The inverse of segments_as_batch: [S·B, s, ...] -> [B, S·s, ...]."""
    SB, s = x_Bs_.shape[:2]
    x = x_Bs_.reshape(slots, SB // slots, s, *x_Bs_.shape[2:])
    return jnp.swapaxes(x, 0, 1).reshape(SB // slots, slots * s, *x_Bs_.shape[2:])


def _select(keep_new, new, old):
    return jax.tree.map(lambda n, o: jnp.where(keep_new, n, o), new, old)


def from_chip(x, chip: int, axis: AxisName):
    """Chip `chip`'s `x` on every chip, as a replicated value: psum of a masked copy.

    One all-reduce of x's size; it is also what makes the result provably replicated for
    shard_map's out_specs=P() (a value computed identically on every chip is still 'varying').
    """
    return lax.psum(jnp.where(chip_index(axis) == chip, x, jnp.zeros_like(x)), axis)


class Exchange(NamedTuple):
    """A mode's exchange: `forward` finds h_in from the folded pairs, `adjoint` reverses it.

    forward(A_SBHKK, b_SBHKV, h0_BHKV, *, axis, layout) -> h_in_SBHKV (one per slot).
    adjoint(At_SBHKK, dh_in_SBHKV, *, axis, layout) -> λ_{e+1} for this chip's segments e:
    with segments e = 0 … E−1 in sequence order, h_in_{e+1} = A_e h_in_e + b_e and ḡ_e =
    ∂L/∂h_in_e from segment e's own outputs, the adjoints obey λ_e = ḡ_e + A_eᵀ λ_{e+1}
    (λ_E = 0); ∂L/∂h0 = λ_0 (chip 0, slot 0).
    """

    forward: IncomingState
    adjoint: Callable
    name: str


def with_adjoint(forward: IncomingState, adjoint: Callable) -> Exchange:
    """Pair a mode's exchange with its hand-written backward (see replay_through_exchange)."""
    return Exchange(forward, adjoint, forward.__name__.removesuffix("_forward"))


def replay_through_exchange(exchange: Exchange, A_NBHKK, b_NBHKV, h0_BHKV, *, axis: AxisName,
                            layout: Layout = "contiguous"):
    """This chip's chunk-entry states [N,S·B,H,K,V] and its segments' final states [S·B,…],
    h_in from `exchange`; the batch axis holds slot 0's B rows, then slot 1's.

    Forward: fold the chunks into (A, b) per segment, exchange, scan from h_in. Backward,
    written out: the exchange's cotangent on (A, b) is always (λ_{e+1} h_inᵀ, λ_{e+1}), which
    through the fold is exactly the replay scan's backward with λ_{e+1} added to its final
    state's cotangent. So no residual of the fold is kept (autodiff would keep a running pair
    per chunk, +15% per chip at production shapes), only A_n and the states the replay produces
    anyway; the price is a second reverse state scan (Dk²·Dv per chunk). Residuals are
    independent of D.
    """
    S = Segments(chip_count(axis), layout).slots

    def by_slot(x):  # [S·B, ...] -> [S, B, ...]
        return x.reshape(S, -1, *x.shape[1:])

    def joined(x):  # [S, B, ...] -> [S·B, ...]
        return x.reshape(-1, *x.shape[2:])

    @partial(jax.custom_vjp, nondiff_argnums=(3,))
    def run(A_NBHKK, b_NBHKV, h0_BHKV, axis):
        return run_fwd(A_NBHKK, b_NBHKV, h0_BHKV, axis)[0]

    def run_fwd(A_NBHKK, b_NBHKV, h0_BHKV, axis):
        A_BHKK, b_BHKV = fold_chunk_pairs(A_NBHKK, b_NBHKV)
        h_in_SBHKV = exchange.forward(by_slot(A_BHKK), by_slot(b_BHKV), h0_BHKV, axis=axis,
                                      layout=layout)
        states_NBHKV, h_out_BHKV = scan_chunk_states(A_NBHKK, b_NBHKV, joined(h_in_SBHKV))
        return (states_NBHKV, h_out_BHKV), (A_NBHKK, A_BHKK, states_NBHKV)

    def run_bwd(axis, residuals, cotangents):
        A_NBHKK, A_BHKK, states_NBHKV = residuals
        d_states_NBHKV, d_out_BHKV = cotangents
        # ḡ = ∂L/∂h_in through each segment's own outputs, then the exchange's adjoint.
        g_BHKV, _ = reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV, d_out_BHKV,
                                       with_pairs=False)
        At_BHKK = jnp.swapaxes(A_BHKK, -1, -2)
        lam_next_BHKV = joined(exchange.adjoint(by_slot(At_BHKK), by_slot(g_BHKV), axis=axis,
                                                layout=layout))
        lam_first_BHKV = by_slot(g_BHKV + mm(At_BHKK, lam_next_BHKV))[0]  # λ of slot 0
        dh0_BHKV = jnp.where(chip_index(axis) == 0, lam_first_BHKV,
                             jnp.zeros_like(lam_first_BHKV))
        # The pairs' gradient: own outputs plus what later segments owe to this one's fold.
        _, (dA_NBHKK, db_NBHKV) = reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV,
                                                     d_out_BHKV + lam_next_BHKV,
                                                     with_pairs=True)
        return dA_NBHKK, db_NBHKV, dh0_BHKV

    run.defvjp(run_fwd, run_bwd)
    # Cast h0 to per-chip once, outside the custom VJP: the cast's transpose is the single psum
    # making ∂L/∂h0 replicated (dropped from the program when h0 is a constant).
    return run(A_NBHKK, b_NBHKV, vary_like(h0_BHKV, b_NBHKV[0, :h0_BHKV.shape[0]]), axis)


def segment_positions(*, axis: AxisName, layout: Layout, seq_len: int) -> jax.Array:
    """Global positions of this chip's tokens, one row per slot: int32 [S, T/(D·S)] (traced:
    the chip's index is)."""
    seg = Segments(chip_count(axis), layout)
    s = seq_len // seg.count
    first_S = jnp.asarray(seg.element_of, jnp.int32)[chip_index(axis)] * s
    return first_S[:, None] + jnp.arange(s, dtype=jnp.int32)


def sequence_sharded_rule(exchange: Exchange, q, k, v, g, beta, h0_BHKV, *, axis: AxisName,
                          output_final_state: bool, use_qk_l2norm: bool, chunk_size: int,
                          layout: Layout = "contiguous", cu_seqlens=None):
    """Run the rule on this chip's shard, finding h_in with `exchange`.

    Args (local shards, the chip's segments in slot order): q, k [B, T_local, Hk, Dk];
        v [B, T_local, Hv, Dv]; g, beta [B, T_local, Hv]; h0_BHKV [B, Hv, Dk, Dv] float32,
        replicated. cu_seqlens: None or the GLOBAL packed-document boundaries (int [N+1],
        replicated): each segment's starts come from its global positions; a segment holding
        one has A = 0, so the exchanges pass nothing across it.
    Returns:
        o [B, T_local, Hv, Dv] in q's dtype; the float32 state after the global sequence
        [B, Hv, Dk, Dv] (replicated: the last segment's, broadcast from its chip) or None.
    """
    seg = Segments(chip_count(axis), layout)
    S, (B, T_local) = seg.slots, q.shape[:2]
    doc_starts_BT = None
    if cu_seqlens is not None:  # [S, s] → [S·B, s], as segments_as_batch lays out the rows
        positions_Ss = segment_positions(axis=axis, layout=layout, seq_len=T_local * seg.chips)
        doc_starts_BT = jnp.repeat(document_starts(cu_seqlens, positions_Ss), B, axis=0)
    terms: ChunkTerms = prepare_chunks(*(segments_as_batch(x, S) for x in (q, k, v, g, beta)),
                                       use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size,
                                       doc_starts_BT=doc_starts_BT)
    states_NBHKV, h_out_BHKV = replay_through_exchange(exchange, terms.A_NBHKK, terms.b_NBHKV,
                                                       h0_BHKV, axis=axis, layout=layout)
    o = batch_as_segments(chunk_outputs(terms, states_NBHKV, T_local // S), S).astype(q.dtype)
    if not output_final_state:
        return o, None
    last_chip, last_slot = seg.owner[-1]
    return o, from_chip(h_out_BHKV.reshape(S, B, *h_out_BHKV.shape[1:])[last_slot], last_chip,
                        axis)


def sequence_sharded(exchange: Exchange) -> Callable:
    """Make a mode's per-shard rule from its Exchange (the CP registry's entries)."""

    def rule(q, k, v, g, beta, h0_BHKV, *, axis, output_final_state, use_qk_l2norm, chunk_size,
             layout="contiguous", cu_seqlens=None):
        return sequence_sharded_rule(exchange, q, k, v, g, beta, h0_BHKV, axis=axis,
                                     output_final_state=output_final_state,
                                     use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size,
                                     layout=layout, cu_seqlens=cu_seqlens)

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
