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
                   and merge by log-sum-exp (float32). A custom VJP: forward
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

Every mode attends by segment pairs (attention_pairs.py): a chip's query segments (runs of
consecutive positions: its shard under contiguous, the two halves under zigzag; ulysses: the
whole sequence, its segments put in order) against a key block's, each pair skipped (keys
after the queries), full, or causal (the same segment), chosen by lax.switch on segment
indices traced from the chip index (only the taken branch runs; a while loop over the pairs, so
compile time does not depend on them). Each pair's kernel (`kernel`: reference, xla, cudnn,
splash) returns (o, float32 log-sum-exp); pairs merge by log-sum-exp in float32, and each mode's
custom VJP saves q, k, v, the merged o and lse and calls every pair's backward with them (the
exact gradient: attention_pairs' docstring). The reference pairs run attention.py's tiles of
tile_size(segment, block) ≤ block tokens (ATTENTION_BLOCK, 512; invisible tiles skipped,
[B, G, r, b, b] score temporaries whatever t or D, so memory grows linearly in t); under
contiguous chip r computes r + 1 of its D pairs, under zigzag every chip 2D + 1 of its 4D.
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
from ..attention import ATTENTION_BLOCK, tile_loop, tile_size
from ..attention_pairs import (
    PairKernel,
    PairKernelName,
    add_pair_grads,
    causal_pair_attention,
    check_pair_kernel,
    empty_merge,
    fold_pair,
    pair_kind,
)
from ..kernels import pair_kernel
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


def segment_table(chips: int, layout: Layout) -> np.ndarray:
    """Index in the sequence of every chip's segments: int32 [D, P] (row r: chip r's, in
    local order; P segments per chip: 1 contiguous, 2 zigzag)."""
    return np.array([segments(chip=r, chips=chips, layout=layout) for r in range(chips)],
                    dtype=np.int32)


def _by_segment(x_BtX, P: int):
    """[B, t, …] → [P, B, s, …] (s = t/P): a local shard as its segments."""
    B, t = x_BtX.shape[:2]
    return jnp.moveaxis(x_BtX.reshape(B, P, t // P, *x_BtX.shape[2:]), 1, 0)


def _from_segments(x_PBsX):
    """_by_segment undone: [B, t, …]."""
    P, B, s = x_PBsX.shape[:3]
    return jnp.moveaxis(x_PBsX, 0, 1).reshape(B, P * s, *x_PBsX.shape[3:])


class _Queries(NamedTuple):
    """This chip's queries by segment: q [P, B, s, H, E] and the segments' indices [P]; in
    backward the merged o, lse [P, B, s, H] (float32) and do, else None."""
    q: jax.Array
    segment: jax.Array
    o: jax.Array | None = None
    lse: jax.Array | None = None
    do: jax.Array | None = None


def _this_chip(q_BtHE, axis: AxisName, layout: Layout, *, o_BtHE=None, lse=None,
               do_BtHE=None):
    """(D, this chip's index, the segment table [D, P], this chip's _Queries)."""
    D, me = chip_count(axis), chip_index(axis)
    table = segment_table(D, layout)
    P = table.shape[1]
    table = jnp.asarray(table)
    backward = {} if do_BtHE is None else {
        "o": _by_segment(o_BtHE, P), "lse": lse, "do": _by_segment(do_BtHE.astype(
            q_BtHE.dtype), P)}
    return D, me, table, _Queries(_by_segment(q_BtHE, P), table[me], **backward)


def _pairs(P: int, body, init):
    """body(i, carry) over the P² (query segment i // P, key segment i % P) pairs: a while
    loop (compile time flat), or straight code for the one pair of a contiguous shard."""
    return body(0, init) if P == 1 else tile_loop(P * P, body, init)


def _at(x, i):
    return lax.dynamic_index_in_dim(x, i, 0, keepdims=False)


def _put(x, y, i):
    return lax.dynamic_update_index_in_dim(x, y, i, 0)


def _fold_block(kernel: PairKernel, merged, queries: _Queries, k_BtGE, v_BtGE, k_segment):
    """Merge a chip's key block (segments at indices k_segment [P]) into the queries' merge
    (o [P, B, s, H, E], lse [P, B, s, H], float32), pair by pair (skipped, full, causal)."""
    P = queries.q.shape[0]
    k_P, v_P = _by_segment(k_BtGE, P), _by_segment(v_BtGE, P)

    def pair(i, merged):
        a, b = i // P, i % P
        kind = pair_kind(_at(queries.segment, a), _at(k_segment, b))
        mine = fold_pair(kernel, kind, tuple(_at(x, a) for x in merged), _at(queries.q, a),
                         _at(k_P, b), _at(v_P, b))
        return tuple(_put(x, y, a) for x, y in zip(merged, mine))

    return _pairs(P, pair, merged)


def _block_grads(kernel: PairKernel, dq_P, dk_BtGE, dv_BtGE, queries: _Queries, k_BtGE,
                 v_BtGE, k_segment):
    """Add a chip's key block's pairs' gradients: dq [P, B, s, H, E] and the block's dk, dv
    [B, t, G, E], float32."""
    P = queries.q.shape[0]
    k_P, v_P, dk_P, dv_P = (_by_segment(x, P) for x in (k_BtGE, v_BtGE, dk_BtGE, dv_BtGE))
    per_query = (queries.q, queries.o, queries.lse, queries.do)

    def pair(i, grads):
        dq, dk, dv = grads
        a, b = i // P, i % P
        q, o, lse, do = (_at(x, a) for x in per_query)
        dq_a, dk_b, dv_b = add_pair_grads(
            kernel, pair_kind(_at(queries.segment, a), _at(k_segment, b)),
            (_at(dq, a), _at(dk, b), _at(dv, b)), q, _at(k_P, b), _at(v_P, b), o, lse, do)
        return _put(dq, dq_a, a), _put(dk, dk_b, b), _put(dv, dv_b, b)

    dq_P, dk_P, dv_P = _pairs(P, pair, (dq_P, dk_P, dv_P))
    return dq_P, _from_segments(dk_P), _from_segments(dv_P)


def _finished(merged, dtype):
    """(o [B, t, H, E] in dtype, lse [P, B, s, H] float32) of the merge."""
    o_P, lse_P = merged
    return _from_segments(o_P).astype(dtype), lse_P


def _zeros_dq(queries: _Queries):
    return jnp.zeros(queries.q.shape, jnp.float32)


def _dq_out(dq_P, dtype):
    return _from_segments(dq_P).astype(dtype)


# ---- ulysses: the whole sequence for H/D heads, one causal pair ----------------------------

def ulysses_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout,
                      block: int = ATTENTION_BLOCK, kernel: PairKernelName = "reference"):
    """all_to_all to H/D query heads (and their KV heads) over the whole sequence, put it in
    sequence order (zigzag: the segments permuted), attend as one causal pair
    (attention_pairs.causal_pair_attention; the reference in tiles as large as a segment's),
    back to shard order, all_to_all back."""
    D, t = chip_count(axis), q_BtHE.shape[1]
    plan = UlyssesHeads(num_k_heads=k_BtGE.shape[2], num_v_heads=q_BtHE.shape[2], chips=D)
    shard_segments = segment_table(D, layout).reshape(-1)  # index of each, in shard order
    in_order = np.argsort(shard_segments)

    def to_heads(x):  # [B, t, D·h, E] -> [B, T, h, E], T in sequence order
        x = lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True)
        return x if layout == "contiguous" else _permute_segments(x, in_order)

    q_BTHE = to_heads(q_BtHE)
    k_BTGE, v_BTGE = (to_heads(key_heads_for_chips(x, plan)) for x in (k_BtGE, v_BtGE))
    o_BTHE = causal_pair_attention(q_BTHE, k_BTGE, v_BTGE,
                                   pair_kernel(kernel, _tile(t, layout, block)))
    if layout != "contiguous":
        o_BTHE = _permute_segments(o_BTHE, shard_segments)
    return lax.all_to_all(o_BTHE, axis, split_axis=1, concat_axis=2, tiled=True)


def _permute_segments(x_BTX, order: np.ndarray):
    """x's segments (len(order) of T/len(order) tokens) taken in `order`."""
    B, T = x_BTX.shape[:2]
    x = x_BTX.reshape(B, len(order), T // len(order), *x_BTX.shape[2:])
    return jnp.take(x, order, axis=1).reshape(x_BTX.shape)


# ---- all_gather_kv and ring: this chip's segments against every chip's ------------------

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


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _all_gather_kv(q_BtHE, k_BtGE, v_BtGE, axis, layout, block, kernel):
    return _all_gather_kv_fwd(q_BtHE, k_BtGE, v_BtGE, axis, layout, block, kernel)[0]


def _all_gather_kv_fwd(q_BtHE, k_BtGE, v_BtGE, axis, layout, block, kernel):
    D, _, table, queries = _this_chip(q_BtHE, axis, layout)
    pairs = pair_kernel(kernel, block)
    k_DBtGE, v_DBtGE = (lax.all_gather(x, axis) for x in (k_BtGE, v_BtGE))

    def step(j, merged):
        return _fold_block(pairs, merged, queries, k_DBtGE[j], v_DBtGE[j], table[j])

    o_BtHE, lse = _finished(tile_loop(D, step, empty_merge(queries.q)), q_BtHE.dtype)
    return o_BtHE, (q_BtHE, k_DBtGE, v_DBtGE, o_BtHE, lse)


def _all_gather_kv_bwd(axis, layout, block, kernel, residuals, do_BtHE):
    """The reduce-scatter of dK, dV as a ring, one block at a time: the accumulators of block
    j start on chip j + 1 and collect each chip's share (computed in float32, sent in K/V's
    dtype as a reduce-scatter would) as they pass, arriving home after D − 1 hops. No chip
    holds dK, dV of the whole sequence beside the gathered K, V."""
    q_BtHE, k_DBtGE, v_DBtGE, o_BtHE, lse = residuals
    D, me, table, queries = _this_chip(q_BtHE, axis, layout, o_BtHE=o_BtHE, lse=lse,
                                       do_BtHE=do_BtHE)
    pairs = pair_kernel(kernel, block)

    def add_share(dq, dk, dv, j):  # this chip's gradients of block j onto the accumulators
        dq, dk32, dv32 = _block_grads(pairs, dq, dk.astype(jnp.float32),
                                      dv.astype(jnp.float32), queries, k_DBtGE[j], v_DBtGE[j],
                                      table[j])
        return dq, dk32.astype(dk.dtype), dv32.astype(dv.dtype)

    zeros_kv = jnp.zeros(k_DBtGE.shape[1:], k_DBtGE.dtype)
    grads = add_share(_zeros_dq(queries), zeros_kv, zeros_kv, (me - 1) % D)

    def step(i, grads):  # the accumulators of block me − 2 − i arrive
        dq, dk, dv = grads
        return add_share(dq, _to_next(dk, axis), _to_next(dv, axis), (me - 2 - i) % D)

    # A loop, unlike the ring's written-out rounds: here that keeps per-chip memory exactly
    # the gathered K/V plus a constant (written out, each round adds a few small buffers).
    dq, dk, dv = tile_loop(D - 1, step, grads)
    return _dq_out(dq, q_BtHE.dtype), dk, dv


_all_gather_kv.defvjp(_all_gather_kv_fwd, _all_gather_kv_bwd)


def _axis_key(axis: AxisName):
    """A hashable axis (custom_vjp's static arguments must be)."""
    return axis if isinstance(axis, str) else tuple(axis)


def all_gather_kv_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout,
                            block: int = ATTENTION_BLOCK, kernel: PairKernelName = "reference"):
    """all_gather K and V, then this chip's segments against every chip's (module
    docstring)."""
    return _all_gather_kv(q_BtHE, k_BtGE, v_BtGE, _axis_key(axis), layout, block, kernel)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _ring(q_BtHE, k_BtGE, v_BtGE, axis, layout, block, kernel):
    return _ring_fwd(q_BtHE, k_BtGE, v_BtGE, axis, layout, block, kernel)[0]


def _ring_fwd(q_BtHE, k_BtGE, v_BtGE, axis, layout, block, kernel):
    D, me, table, queries = _this_chip(q_BtHE, axis, layout)
    pairs = pair_kernel(kernel, block)
    merged = _fold_block(pairs, empty_merge(queries.q), queries, k_BtGE, v_BtGE, table[me])

    def visit(merged, k_v, s):  # round s: the block of chip me − s arrives, is merged
        return _fold_block(pairs, merged, queries, *k_v, table[(me - s) % D]), k_v

    merged, _ = _around_the_ring(visit, merged, (k_BtGE, v_BtGE), axis)
    o_BtHE, lse = _finished(merged, q_BtHE.dtype)
    return o_BtHE, (q_BtHE, k_BtGE, v_BtGE, o_BtHE, lse)


def _ring_bwd(axis, layout, block, kernel, residuals, do_BtHE):
    q_BtHE, k_BtGE, v_BtGE, o_BtHE, lse = residuals
    D, me, table, queries = _this_chip(q_BtHE, axis, layout, o_BtHE=o_BtHE, lse=lse,
                                       do_BtHE=do_BtHE)
    pairs = pair_kernel(kernel, block)
    zeros_kv = jnp.zeros(k_BtGE.shape, jnp.float32)
    dq, dk, dv = _block_grads(pairs, _zeros_dq(queries), zeros_kv, zeros_kv, queries, k_BtGE,
                              v_BtGE, table[me])

    def visit(dq, blocks, s):  # the block of chip me − s arrives with its gradients so far
        k_blk, v_blk, dk, dv = blocks
        dq, dk, dv = _block_grads(pairs, dq, dk, dv, queries, k_blk, v_blk,
                                  table[(me - s) % D])
        return dq, (k_blk, v_blk, dk, dv)

    dq, (_, _, dk, dv) = _around_the_ring(visit, dq, (k_BtGE, v_BtGE, dk, dv), axis)
    # After D − 1 hops chip me holds block me + 1's gradients: one more hop takes them home.
    dk, dv = (_to_next(x, axis) if D > 1 else x for x in (dk, dv))
    return _dq_out(dq, q_BtHE.dtype), dk.astype(k_BtGE.dtype), dv.astype(v_BtGE.dtype)


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout,
                   block: int = ATTENTION_BLOCK, kernel: PairKernelName = "reference"):
    """K/V blocks passed around the chips, merged by log-sum-exp (module docstring)."""
    return _ring(q_BtHE, k_BtGE, v_BtGE, _axis_key(axis), layout, block, kernel)


ATTENTION_CP = {"all_gather_kv": all_gather_kv_attention, "ring": ring_attention,
                "ulysses": ulysses_attention}
"""attn_cp → this chip's attention under that mode, unchecked (attention_cp validates; a CP
step validates its settings once, cp/step.py's mesh_cp, and binds these directly)."""


def attention_cp(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, mode: AttnCPMode,
                 layout: Layout = "contiguous", block: int = ATTENTION_BLOCK,
                 kernel: PairKernelName = "reference"):
    """Causal attention of this chip's queries q [B, t, H, E] over the global sequence whose
    local K, V [B, t, G, E] shards the chips hold; o [B, t, H, E] in q's dtype. Call inside a
    shard_map binding `axis`. `block`: the largest score tile edge of the reference
    (attention.tile_size); `kernel`: the segment pairs' kernel (attention_pairs.PAIR_KERNELS).
    Raises ValueError naming the numbers (unknown mode, layout or kernel, ulysses query heads
    not divisible by the chips)."""
    check_attn_cp(mode)
    check_layout(layout)
    check_pair_kernel(kernel)
    D = chip_count(axis)
    check_attention_shape(attn_cp=mode, chips=D, seq_len=D * q_BtHE.shape[1],
                          num_heads=q_BtHE.shape[2], num_kv_heads=k_BtGE.shape[2], layout=layout)
    return ATTENTION_CP[mode](q_BtHE, k_BtGE, v_BtGE, axis=axis, layout=layout, block=block,
                              kernel=kernel)


def attend_fn(*, axis: AxisName, mode: AttnCPMode, layout: Layout = "contiguous",
              block: int = ATTENTION_BLOCK, kernel: PairKernelName = "reference"):
    """attention_cp bound to (axis, mode, layout, block, kernel): model.hidden_states'
    `attend_fn` under CP."""
    check_attn_cp(mode)
    check_layout(layout)
    check_pair_kernel(kernel)
    return partial(attention_cp, axis=axis, mode=mode, layout=layout, block=block,
                   kernel=kernel)
