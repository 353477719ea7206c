"""Causal attention under context parallelism: this chip's queries against the whole sequence.

Call inside a shard_map binding `axis` (D chips) with check_vma=False, as the CP step's is.
Each chip holds its local shard of q [B, t, H, E] and k, v [B, t, G, E] (t = T/D), at the
global positions cp_layout.local_positions(chip, D, T, layout) — contiguous, or zigzag
(segments r and 2D−1−r); masks compare global positions, so both layouts need nothing else.
Returns o [B, t, H, E] for this chip's queries, equal to the one-chip
attention.causal_attention's rows.

    all_gather_kv  all_gather K and V (the whole sequence, in shard order), then attend to
                   them block by block (the Llama 3 / torchtitan scheme). Receives per chip
                   2(D−1)·B·t·G·E·|kv| forward and as much backward, where dK, dV are
                   reduce-scattered as a ring: each block's accumulators pass the chips, each
                   adding its share (float32 sums, K/V's dtype on the wire); one dependent
                   round forward, D−1 hops backward. Holds the gathered K/V and no
                   whole-sequence gradient: grows with T by exactly the gathered K/V.
    ring           D rounds: attend to the K/V block held, pass it to the next chip (ppermute)
                   and merge by online softmax (float32 max and sum). A custom VJP: forward
                   saves only the local q, k, v, o and the log-sum-exp; backward passes the
                   K/V blocks around again with their dK/dV accumulators (float32), which
                   arrive home after a last hop. Receives 2(D−1)·B·t·G·E·|kv| forward and
                   2(D−1)·B·t·G·E·(|kv| + 4) + 2·B·t·G·E·4 backward; D−1 dependent rounds
                   forward, D backward. The rounds are written out, each hop tied to the
                   round before (_around_the_ring), so a chip holds one block in flight and
                   per-chip memory is flat in D (D = 2 included).
    ulysses        all_to_all to head shards (every chip: the whole sequence of H/D query
                   heads and the KV heads they read, replicated when G < D, as
                   cp_modes.UlyssesHeads plans it), local attention, all_to_all back.
                   Receives (D−1)/D·B·t·(2·H·E + 2·D·Gl·E)·|x| forward (q and o; k and v
                   with Gl KV heads per chip) and as much backward; 2 dependent rounds each
                   way. Needs H divisible by D. Memory does not grow with D while D divides
                   G (the copies of replicated KV heads cover the whole sequence): its
                   sequence-sized buffers are flat, its score tiles (H/D heads) shrink.

Every mode attends in tiles (attention.py: merge_keys forward, add_key_grads backward, the one
blockwise implementation the one-chip causal_attention runs too): query tiles × key tiles of
tile_size(segment, block) ≤ block tokens (attention.ATTENTION_BLOCK, 512), cut inside the
segments (runs of consecutive positions: the shard under contiguous, its two halves under
zigzag; a segment the tile does not divide leaves the shard padded at its end and tiles across
segments — still exact, less skipped), an online softmax with float32 statistics, and custom
VJPs that save q, k, v, o and the log-sum-exp and recompute each tile's probabilities in
backward. Score temporaries are [B, G, r, b, b] (ulysses: its Gl KV heads) whatever t or D, so
per-chip memory grows linearly in t, never as t². Each tile is treated by what its queries see
(a lax.switch on positions traced from the chip index, in a loop over key tiles inside a loop
over query tiles: only the taken branch runs, and compile time does not depend on the tile
count): nothing — skipped, no work; everything — no mask; some — masked. With tiles as large as
a segment, under contiguous chip r computes r + 1 of its D (query, key block) tiles, and under
zigzag every chip 2D + 1 of its 4D quarter-size ones; smaller tiles skip everything above the
diagonal of the global tile grid. Ulysses' queries are the whole sequence (shard order), tiled
and skipped the same way.
Legend: B batch, t local tokens, T global tokens, H query heads, G KV heads, r = H/G,
E head_dim, b tile tokens, n tiles.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...cp_layout import Layout, check_layout, local_positions, segments
from ...cp_modes import (
    AttnCPMode,
    UlyssesHeads,
    check_attention_cp_shape,
    check_attn_cp,
)
from ..attention import (
    ATTENTION_BLOCK,
    add_key_grads,
    causal_attention,
    empty_stats,
    finish,
    from_query_tiles,
    merge_keys,
    query_position_tiles,
    query_tiles,
    tile_delta,
    tile_loop,
    tile_size,
)
from .common import AxisName, chip_count, chip_index, permute
from .ulysses import key_heads_for_chips


def check_attention_shape(*, attn_cp: str, chips: int, seq_len: int, num_heads: int,
                          num_kv_heads: int, layout: str = "contiguous") -> None:
    """Raise ValueError naming the numbers when `attn_cp` cannot split this attention over
    `chips` (cp_modes.check_attention_cp_shape: ulysses needs query heads divisible by chips)
    or `layout` cannot split seq_len (cp_layout.check_layout)."""
    check_attention_cp_shape(attn_cp=attn_cp, chips=chips, num_heads=num_heads)
    check_layout(layout, chips=chips, seq_len=seq_len)
    del num_kv_heads  # any G: KV heads are replicated when G < chips


def positions_table(chips: int, t: int, layout: Layout) -> np.ndarray:
    """Global positions of every chip's local shard: int32 [D, t] (row r: chip r's)."""
    return np.stack([local_positions(chip=r, chips=chips, seq_len=chips * t, layout=layout)
                     for r in range(chips)]).astype(np.int32)


def local_token_positions(axis: AxisName, t: int, layout: Layout):
    """This chip's global token positions [t] (int32), inside the shard_map."""
    return jnp.asarray(positions_table(chip_count(axis), t, layout))[chip_index(axis)]


def _slot_count(layout: Layout) -> int:
    """Segments per chip: a local shard is this many runs of consecutive positions."""
    return len(segments(chip=0, chips=1, layout=layout))


def _tile(t: int, layout: Layout, block: int) -> int:
    """Tile edge for a local shard of t tokens: tile_size of a segment, so tiles lie inside
    segments (runs of consecutive positions) and skip as such."""
    return tile_size(t // _slot_count(layout), block)


class _Queries(NamedTuple):
    """This chip's queries in tiles (attention.query_tiles): q [n, B, G, r, b, E] and
    positions [n, b]; do, log-sum-exp and delta (rowsum(o·do)) tiles in backward, else None."""
    q: jax.Array
    pos: jax.Array
    do: jax.Array | None = None
    lse: jax.Array | None = None
    delta: jax.Array | None = None


def _queries(q_BtHE, q_pos, G: int, tile: int, *, o_BtHE=None, lse=None,
             do_BtHE=None) -> _Queries:
    q_n, pos_n = query_tiles(q_BtHE, G, tile), query_position_tiles(q_pos, tile)
    if do_BtHE is None:
        return _Queries(q_n, pos_n)
    do_n, o_n = (query_tiles(x.astype(q_BtHE.dtype), G, tile) for x in (do_BtHE, o_BtHE))
    return _Queries(q_n, pos_n, do_n, lse, tile_delta(o_n, do_n))


def _this_chip(q_BtHE, G: int, axis: AxisName, layout: Layout, block: int, **backward):
    """(D, this chip's index, tile edge, the positions table [D, t], this chip's query tiles);
    backward: o_BtHE, lse and do_BtHE for the backward's tiles (_queries)."""
    D, me, t = chip_count(axis), chip_index(axis), q_BtHE.shape[1]
    tile, table = _tile(t, layout, block), jnp.asarray(positions_table(D, t, layout))
    return D, me, tile, table, _queries(q_BtHE, table[me], G, tile, **backward)


def _finished(stats, t: int, dtype):
    """(o [B, t, H, E] in dtype, log-sum-exp tiles) from the query tiles' statistics."""
    o_n, lse = finish(stats, dtype)
    return from_query_tiles(o_n, t), lse


def _merge_chip_block(stats, queries: _Queries, k_BtGE, v_BtGE, k_pos, tile: int):
    """Fold a chip's key block into the query tiles' statistics (attention.merge_keys)."""
    return merge_keys(stats, queries.q, queries.pos, k_BtGE, v_BtGE, k_pos, tile)


def _chip_block_grads(dq_n, dk_BtGE, dv_BtGE, queries: _Queries, k_BtGE, v_BtGE, k_pos,
                      tile: int):
    """Add a chip's key block's gradients (attention.add_key_grads): dq tiles and the block's
    dk, dv [B, t, G, E], float32."""
    return add_key_grads((dq_n, dk_BtGE, dv_BtGE), queries.q, queries.do, queries.lse,
                         queries.delta, queries.pos, k_BtGE, v_BtGE, k_pos, tile)


def _zeros_dq(queries: _Queries):
    return jnp.zeros(queries.q.shape, jnp.float32)


def _dq_out(dq_n, t: int, dtype):
    return from_query_tiles(dq_n, t).astype(dtype)


# ---- ulysses: the whole sequence for H/D heads, the one-chip blockwise attention --------

def ulysses_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout,
                      block: int = ATTENTION_BLOCK):
    """all_to_all to H/D query heads (and their KV heads) over the whole sequence, attend
    (attention.causal_attention at the shard-order positions), all_to_all back."""
    D, t = chip_count(axis), q_BtHE.shape[1]
    plan = UlyssesHeads(num_k_heads=k_BtGE.shape[2], num_v_heads=q_BtHE.shape[2], chips=D)

    def to_heads(x):  # [B, t, D·h, E] -> [B, T, h, E], T in shard order
        return lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True)

    q_BTHE = to_heads(q_BtHE)
    k_BTGE, v_BTGE = (to_heads(key_heads_for_chips(x, plan)) for x in (k_BtGE, v_BtGE))
    positions = jnp.asarray(positions_table(D, t, layout)).reshape(-1)
    o_BTHE = causal_attention(q_BTHE, k_BTGE, v_BTGE, positions, positions,
                              block=_tile(t, layout, block))
    return lax.all_to_all(o_BTHE, axis, split_axis=1, concat_axis=2, tiled=True)


# ---- all_gather_kv and ring: this chip's queries against every chip's key block ----------

def _to_next(x, axis: AxisName):
    D = chip_count(axis)
    return permute(x, axis, [(i, (i + 1) % D) for i in range(D)])


def _after(arrays, done):
    """`arrays`, unchanged to the bit but computed from `done` as well: x + 0·[done finite]
    (XLA folds neither a float 0·y nor x + y for a y it cannot see is 0)."""
    tie = 0.0 * jnp.isfinite(jnp.ravel(done)[0]).astype(jnp.float32)
    return tuple(x + tie.astype(x.dtype) for x in arrays)


def _around_the_ring(visit, state, travelling, axis: AxisName):
    """Rounds s = 1 … D − 1: pass the arrays of `travelling` to the next chip, then
    state, travelling = visit(state, travelling, s).

    Written out round by round (not a loop: a D = 2 ring would be a one-trip loop, which XLA
    inlines, and a loop's carried buffers pack worse than straight-line code, so per-chip
    memory would change with D). Each hop sends arrays tied (_after) to the state the round
    before produced, so the hop cannot start before that round is done: XLA would otherwise
    issue every hop at the start, holding all D blocks, and would merge the backward's hops
    with the forward's, keeping the forward's blocks alive (CPU drops optimization barriers,
    so a data dependency is the one ordering every backend keeps)."""
    for s in range(1, chip_count(axis)):
        sent = _after(travelling, jax.tree.leaves(state)[-1])
        state, travelling = visit(state, tuple(_to_next(x, axis) for x in sent), s)
    return state, travelling


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _all_gather_kv(q_BtHE, k_BtGE, v_BtGE, axis, layout, block):
    return _all_gather_kv_fwd(q_BtHE, k_BtGE, v_BtGE, axis, layout, block)[0]


def _all_gather_kv_fwd(q_BtHE, k_BtGE, v_BtGE, axis, layout, block):
    D, _, tile, table, queries = _this_chip(q_BtHE, k_BtGE.shape[2], axis, layout, block)
    k_DBtGE, v_DBtGE = (lax.all_gather(x, axis) for x in (k_BtGE, v_BtGE))

    def step(j, stats):
        return _merge_chip_block(stats, queries, k_DBtGE[j], v_DBtGE[j], table[j], tile)

    stats = tile_loop(D, step, empty_stats(queries.q))
    o_BtHE, lse = _finished(stats, q_BtHE.shape[1], q_BtHE.dtype)
    return o_BtHE, (q_BtHE, k_DBtGE, v_DBtGE, o_BtHE, lse)


def _all_gather_kv_bwd(axis, layout, block, residuals, do_BtHE):
    """The reduce-scatter of dK, dV as a ring, one block at a time: the accumulators of block
    j start on chip j + 1 and collect each chip's share (computed in float32, sent in K/V's
    dtype as a reduce-scatter would) as they pass, arriving home after D − 1 hops. No chip
    holds dK, dV of the whole sequence beside the gathered K, V."""
    q_BtHE, k_DBtGE, v_DBtGE, o_BtHE, lse = residuals
    D, me, tile, table, queries = _this_chip(q_BtHE, k_DBtGE.shape[3], axis, layout, block,
                                             o_BtHE=o_BtHE, lse=lse, do_BtHE=do_BtHE)

    def add_share(dq, dk, dv, j):  # this chip's gradients of block j onto the accumulators
        dq, dk32, dv32 = _chip_block_grads(dq, dk.astype(jnp.float32), dv.astype(jnp.float32),
                                           queries, k_DBtGE[j], v_DBtGE[j], table[j], tile)
        return dq, dk32.astype(dk.dtype), dv32.astype(dv.dtype)

    zeros_kv = jnp.zeros(k_DBtGE.shape[1:], k_DBtGE.dtype)
    grads = add_share(_zeros_dq(queries), zeros_kv, zeros_kv, (me - 1) % D)

    def step(i, grads):  # the accumulators of block me − 2 − i arrive
        dq, dk, dv = grads
        return add_share(dq, _to_next(dk, axis), _to_next(dv, axis), (me - 2 - i) % D)

    # A loop, unlike the ring's written-out rounds: here that keeps per-chip memory exactly
    # the gathered K/V plus a constant (written out, each round adds a few small buffers).
    dq, dk, dv = tile_loop(D - 1, step, grads)
    return _dq_out(dq, q_BtHE.shape[1], q_BtHE.dtype), dk, dv


_all_gather_kv.defvjp(_all_gather_kv_fwd, _all_gather_kv_bwd)


def _axis_key(axis: AxisName):
    """A hashable axis (custom_vjp's static arguments must be)."""
    return axis if isinstance(axis, str) else tuple(axis)


def all_gather_kv_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout,
                            block: int = ATTENTION_BLOCK):
    """all_gather K and V, then this chip's queries against every chip's block (module
    docstring)."""
    return _all_gather_kv(q_BtHE, k_BtGE, v_BtGE, _axis_key(axis), layout, block)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _ring(q_BtHE, k_BtGE, v_BtGE, axis, layout, block):
    return _ring_fwd(q_BtHE, k_BtGE, v_BtGE, axis, layout, block)[0]


def _ring_fwd(q_BtHE, k_BtGE, v_BtGE, axis, layout, block):
    D, me, tile, table, queries = _this_chip(q_BtHE, k_BtGE.shape[2], axis, layout, block)
    stats = _merge_chip_block(empty_stats(queries.q), queries, k_BtGE, v_BtGE, table[me], tile)

    def visit(stats, k_v, s):  # round s: the block of chip me − s arrives, is merged
        return _merge_chip_block(stats, queries, *k_v, table[(me - s) % D], tile), k_v

    stats, _ = _around_the_ring(visit, stats, (k_BtGE, v_BtGE), axis)
    o_BtHE, lse = _finished(stats, q_BtHE.shape[1], q_BtHE.dtype)
    return o_BtHE, (q_BtHE, k_BtGE, v_BtGE, o_BtHE, lse)


def _ring_bwd(axis, layout, block, residuals, do_BtHE):
    q_BtHE, k_BtGE, v_BtGE, o_BtHE, lse = residuals
    D, me, tile, table, queries = _this_chip(q_BtHE, k_BtGE.shape[2], axis, layout, block,
                                             o_BtHE=o_BtHE, lse=lse, do_BtHE=do_BtHE)
    zeros_kv = jnp.zeros(k_BtGE.shape, jnp.float32)
    dq, dk, dv = _chip_block_grads(_zeros_dq(queries), zeros_kv, zeros_kv, queries, k_BtGE,
                                   v_BtGE, table[me], tile)

    def visit(dq, blocks, s):  # the block of chip me − s arrives with its gradients so far
        k_blk, v_blk, dk, dv = blocks
        dq, dk, dv = _chip_block_grads(dq, dk, dv, queries, k_blk, v_blk,
                                       table[(me - s) % D], tile)
        return dq, (k_blk, v_blk, dk, dv)

    dq, (_, _, dk, dv) = _around_the_ring(visit, dq, (k_BtGE, v_BtGE, dk, dv), axis)
    # After D − 1 hops chip me holds block me + 1's gradients: one more hop takes them home.
    dk, dv = (_to_next(x, axis) if D > 1 else x for x in (dk, dv))
    return (_dq_out(dq, q_BtHE.shape[1], q_BtHE.dtype), dk.astype(k_BtGE.dtype),
            dv.astype(v_BtGE.dtype))


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout,
                   block: int = ATTENTION_BLOCK):
    """K/V blocks passed around the chips, merged by online softmax (module docstring)."""
    return _ring(q_BtHE, k_BtGE, v_BtGE, _axis_key(axis), layout, block)


ATTENTION_CP = {"all_gather_kv": all_gather_kv_attention, "ring": ring_attention,
                "ulysses": ulysses_attention}
"""attn_cp → this chip's attention under that mode, unchecked (attention_cp validates; a CP
step validates its settings once, cp/step.py's mesh_cp, and binds these directly)."""


def attention_cp(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, mode: AttnCPMode,
                 layout: Layout = "contiguous", block: int = ATTENTION_BLOCK):
    """Causal attention of this chip's queries q [B, t, H, E] over the global sequence whose
    local K, V [B, t, G, E] shards the chips hold; o [B, t, H, E] in q's dtype. Call inside a
    shard_map binding `axis`. `block`: the largest score tile edge (attention.tile_size).
    Raises ValueError naming the numbers (unknown mode or layout, ulysses query heads not
    divisible by the chips)."""
    check_attn_cp(mode)
    check_layout(layout)
    D = chip_count(axis)
    check_attention_shape(attn_cp=mode, chips=D, seq_len=D * q_BtHE.shape[1],
                          num_heads=q_BtHE.shape[2], num_kv_heads=k_BtGE.shape[2], layout=layout)
    return ATTENTION_CP[mode](q_BtHE, k_BtGE, v_BtGE, axis=axis, layout=layout, block=block)


def attend_fn(*, axis: AxisName, mode: AttnCPMode, layout: Layout = "contiguous",
              block: int = ATTENTION_BLOCK):
    """attention_cp bound to (axis, mode, layout, block): model.hidden_states' `attend_fn`
    under CP."""
    check_attn_cp(mode)
    check_layout(layout)
    return partial(attention_cp, axis=axis, mode=mode, layout=layout, block=block)
