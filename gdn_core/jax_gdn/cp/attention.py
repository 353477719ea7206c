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
splash, splash_interpreted) returns (o, float32 log-sum-exp); pairs merge by log-sum-exp in
float32, and each mode's custom VJP saves q, k, v, the merged o and lse and calls every pair's
backward with them (the exact gradient: attention_pairs' docstring). The reference pairs run
attention.py's tiles of tile_size(segment, block) ≤ block tokens (ATTENTION_BLOCK, 512;
invisible tiles skipped, [B, G, r, b, b] score temporaries whatever t or D, so memory grows
linearly in t); under contiguous chip r computes r + 1 of its D pairs, under zigzag every chip
2D + 1 of its 4D.
Legend: B batch, t local tokens, T global tokens, H query heads, G KV heads, r = H/G,
E head_dim, b tile tokens, n tiles.

Packed documents (`cu_seqlens`: int [N+1], 0 … T, the GLOBAL boundaries, replicated: every
chip gets it whole): every mode attends block-diagonal causal — a query sees the keys of its
own document at or before it. Each chip derives its queries' document starts from their global
positions (attention_segments); a pair whose keys' documents all ended before its queries'
first one began is skipped (attention_pairs.pair_kind), as are such tiles inside a pair (the
reference's _visibility), and the rest are masked by document. Nothing about documents crosses
chips. cu_seqlens None: exactly the causal attention above (no mask, no extra work). Rotary
positions stay global (the caller's), as the published packed training does.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...cp_layout import Layout, check_layout
from ...cp_modes import (
    AttnCPMode,
    UlyssesHeads,
    check_attention_cp_shape,
    check_attn_cp,
)
from ..attention import ATTENTION_BLOCK, tile_loop
from ..documents import check_cu_seqlens
from ..attention_pairs import (
    PairKernelName,
    causal_pair_attention,
    check_pair_kernel,
    empty_merge,
)
from ..kernels import pair_kernel
# local_token_positions, positions_table, segment_table: cp/step.py imports them from here
from .attention_segments import (  # noqa: F401
    _block_grads,
    _dq_out,
    _finished,
    _fold_block,
    _this_chip,
    _tile,
    _zeros_dq,
    local_token_positions,
    positions_table,
    segment_table,
)
from .common import AxisName, chip_count, permute
from .ulysses import key_heads_for_chips


# ---- ulysses: the whole sequence for H/D heads, one causal pair ----------------------------

def ulysses_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout,
                      block: int = ATTENTION_BLOCK, kernel: PairKernelName = "reference",
                      cu_seqlens=None):
    """all_to_all to H/D query heads (and their KV heads) over the whole sequence, put it in
    sequence order (zigzag: the segments permuted), attend as one causal pair
    (attention_pairs.causal_pair_attention; the reference in tiles as large as a segment's;
    packed documents by the global cu_seqlens as they are), back to shard order, all_to_all
    back."""
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
                                   pair_kernel(kernel, _tile(t, layout, block)), cu_seqlens)
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


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _all_gather_kv(q_BtHE, k_BtGE, v_BtGE, cu, axis, layout, block, kernel):
    return _all_gather_kv_fwd(q_BtHE, k_BtGE, v_BtGE, cu, axis, layout, block, kernel)[0]


def _all_gather_kv_fwd(q_BtHE, k_BtGE, v_BtGE, cu, axis, layout, block, kernel):
    D, _, table, queries = _this_chip(q_BtHE, axis, layout, cu=cu)
    pairs = pair_kernel(kernel, block)
    k_DBtGE, v_DBtGE = (lax.all_gather(x, axis) for x in (k_BtGE, v_BtGE))

    def step(j, merged):
        return _fold_block(pairs, merged, queries, k_DBtGE[j], v_DBtGE[j], table[j])

    o_BtHE, lse = _finished(tile_loop(D, step, empty_merge(queries.q)), q_BtHE.dtype)
    return o_BtHE, (q_BtHE, k_DBtGE, v_DBtGE, cu, o_BtHE, lse)


def _all_gather_kv_bwd(axis, layout, block, kernel, residuals, do_BtHE):
    """The reduce-scatter of dK, dV as a ring, one block at a time: the accumulators of block
    j start on chip j + 1 and collect each chip's share (computed in float32, sent in K/V's
    dtype as a reduce-scatter would) as they pass, arriving home after D − 1 hops. No chip
    holds dK, dV of the whole sequence beside the gathered K, V."""
    q_BtHE, k_DBtGE, v_DBtGE, cu, o_BtHE, lse = residuals
    D, me, table, queries = _this_chip(q_BtHE, axis, layout, o_BtHE=o_BtHE, lse=lse,
                                       do_BtHE=do_BtHE, cu=cu)
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
    return _dq_out(dq, q_BtHE.dtype), dk, dv, None


_all_gather_kv.defvjp(_all_gather_kv_fwd, _all_gather_kv_bwd)


def _axis_key(axis: AxisName):
    """A hashable axis (custom_vjp's static arguments must be)."""
    return axis if isinstance(axis, str) else tuple(axis)


def all_gather_kv_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout,
                            block: int = ATTENTION_BLOCK, kernel: PairKernelName = "reference",
                            cu_seqlens=None):
    """all_gather K and V, then this chip's segments against every chip's (module
    docstring)."""
    return _all_gather_kv(q_BtHE, k_BtGE, v_BtGE, _cu(cu_seqlens), _axis_key(axis), layout,
                          block, kernel)


def _cu(cu_seqlens):
    """The global cu_seqlens as int32 (or None)."""
    return None if cu_seqlens is None else jnp.asarray(cu_seqlens).astype(jnp.int32)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _ring(q_BtHE, k_BtGE, v_BtGE, cu, axis, layout, block, kernel):
    return _ring_fwd(q_BtHE, k_BtGE, v_BtGE, cu, axis, layout, block, kernel)[0]


def _ring_fwd(q_BtHE, k_BtGE, v_BtGE, cu, axis, layout, block, kernel):
    D, me, table, queries = _this_chip(q_BtHE, axis, layout, cu=cu)
    pairs = pair_kernel(kernel, block)
    merged = _fold_block(pairs, empty_merge(queries.q), queries, k_BtGE, v_BtGE, table[me])

    def visit(merged, k_v, s):  # round s: the block of chip me − s arrives, is merged
        return _fold_block(pairs, merged, queries, *k_v, table[(me - s) % D]), k_v

    merged, _ = _around_the_ring(visit, merged, (k_BtGE, v_BtGE), axis)
    o_BtHE, lse = _finished(merged, q_BtHE.dtype)
    return o_BtHE, (q_BtHE, k_BtGE, v_BtGE, cu, o_BtHE, lse)


def _ring_bwd(axis, layout, block, kernel, residuals, do_BtHE):
    q_BtHE, k_BtGE, v_BtGE, cu, o_BtHE, lse = residuals
    D, me, table, queries = _this_chip(q_BtHE, axis, layout, o_BtHE=o_BtHE, lse=lse,
                                       do_BtHE=do_BtHE, cu=cu)
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
    return (_dq_out(dq, q_BtHE.dtype), dk.astype(k_BtGE.dtype), dv.astype(v_BtGE.dtype),
            None)


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout,
                   block: int = ATTENTION_BLOCK, kernel: PairKernelName = "reference",
                   cu_seqlens=None):
    """K/V blocks passed around the chips, merged by log-sum-exp (module docstring)."""
    return _ring(q_BtHE, k_BtGE, v_BtGE, _cu(cu_seqlens), _axis_key(axis), layout, block,
                 kernel)


ATTENTION_CP = {"all_gather_kv": all_gather_kv_attention, "ring": ring_attention,
                "ulysses": ulysses_attention}
"""attn_cp → this chip's attention under that mode, unchecked (attention_cp validates; a CP
step validates its settings once, cp/step.py's mesh_cp, and binds these directly)."""


def attention_cp(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, mode: AttnCPMode,
                 layout: Layout = "contiguous", block: int = ATTENTION_BLOCK,
                 kernel: PairKernelName = "reference", cu_seqlens=None):
    """Causal attention of this chip's queries q [B, t, H, E] over the global sequence whose
    local K, V [B, t, G, E] shards the chips hold; o [B, t, H, E] in q's dtype. Call inside a
    shard_map binding `axis`. `block`: the largest score tile edge of the reference
    (attention.tile_size); `kernel`: the segment pairs' kernel (attention_pairs.PAIR_KERNELS);
    `cu_seqlens`: None, or packed documents (int [N+1], 0 … T, the global boundaries,
    replicated over `axis`; values are checked where concrete, trusted where traced).
    Raises ValueError naming the numbers (unknown mode, layout or kernel, ulysses query heads
    not divisible by the chips, malformed cu_seqlens) and kernels.KernelUnavailable for a
    fused kernel that cannot take documents (cudnn, splash, splash_interpreted)."""
    check_pair_kernel(kernel)
    D = chip_count(axis)
    # Any KV heads: they are replicated when there are fewer than chips.
    check_attention_cp_shape(attn_cp=mode, chips=D, num_heads=q_BtHE.shape[2],
                             seq_len=D * q_BtHE.shape[1], layout=layout)
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=D * q_BtHE.shape[1])
        return ATTENTION_CP[mode](q_BtHE, k_BtGE, v_BtGE, axis=axis, layout=layout,
                                  block=block, kernel=kernel, cu_seqlens=cu_seqlens)
    return ATTENTION_CP[mode](q_BtHE, k_BtGE, v_BtGE, axis=axis, layout=layout, block=block,
                              kernel=kernel)


def attend_fn(*, axis: AxisName, mode: AttnCPMode, layout: Layout = "contiguous",
              block: int = ATTENTION_BLOCK, kernel: PairKernelName = "reference"):
    """attention_cp bound to (axis, mode, layout, block, kernel): model.hidden_states'
    `attend_fn` under CP (called with cu_seqlens=… for packed documents)."""
    check_attn_cp(mode)
    check_layout(layout)
    check_pair_kernel(kernel)
    return partial(attention_cp, axis=axis, mode=mode, layout=layout, block=block,
                   kernel=kernel)
