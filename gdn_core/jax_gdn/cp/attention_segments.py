"""This chip's query segments against a key block's, pair by pair: the pieces the JAX CP
attention modes (cp/attention.py) share.

A segment is a run of consecutive global positions (cp_layout: a chip's shard under
contiguous, each half under zigzag). Each (query segment, key segment) pair is skipped, full
or causal (attention_pairs.pair_kind, from segment indices traced from the chip index), run by
a PairKernel and merged by log-sum-exp. Packed documents (`cu`: the global cu_seqlens, int
[N+1], every chip's whole): each query segment also carries its tokens' document starts
(attention.document_starts of their global positions) and each pair its PairDocs, so the pair
is masked by document and skipped when its keys' documents all ended before its queries' first
one began (pair_kind), its tiles likewise (the reference's _visibility).
Legend: B batch, t local tokens, P segments per chip, s segment tokens, H query heads, G KV
heads, E head_dim.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...cp_layout import Layout, local_positions, segments
from ..attention import document_starts, tile_loop, tile_size
from ..attention_pairs import PairDocs, PairKernel, add_pair_grads, fold_pair, pair_kind
from .common import AxisName, chip_count, chip_index


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
    backward the merged o, lse [P, B, s, H] (float32) and do, else None; under packed
    documents each query's document start, start [P, s] int32, else None."""
    q: jax.Array
    segment: jax.Array
    o: jax.Array | None = None
    lse: jax.Array | None = None
    do: jax.Array | None = None
    start: jax.Array | None = None


def _segment_positions(segment, s: int):
    """Global positions [s] int32 of segment `segment` (traced or not) of s tokens."""
    return segment * s + jnp.arange(s, dtype=jnp.int32)


def _this_chip(q_BtHE, axis: AxisName, layout: Layout, *, o_BtHE=None, lse=None,
               do_BtHE=None, cu=None):
    """(D, this chip's index, the segment table [D, P], this chip's _Queries); cu: the
    global cu_seqlens (packed documents) or None."""
    D, me = chip_count(axis), chip_index(axis)
    table = segment_table(D, layout)
    P = table.shape[1]
    table = jnp.asarray(table)
    backward = {} if do_BtHE is None else {
        "o": _by_segment(o_BtHE, P), "lse": lse, "do": _by_segment(do_BtHE.astype(
            q_BtHE.dtype), P)}
    if cu is not None:
        s = q_BtHE.shape[1] // P
        backward["start"] = document_starts(cu, _segment_positions(table[me][:, None], s))
    return D, me, table, _Queries(_by_segment(q_BtHE, P), table[me], **backward)


def _pair_docs(queries: _Queries, a, k_segment, s: int) -> PairDocs | None:
    """The PairDocs of query segment a against the key segment at index k_segment."""
    if queries.start is None:
        return None
    return PairDocs(_segment_positions(_at(queries.segment, a), s),
                    _segment_positions(k_segment, s), _at(queries.start, a))


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
        docs = _pair_docs(queries, a, _at(k_segment, b), k_P.shape[2])
        kind = pair_kind(_at(queries.segment, a), _at(k_segment, b), docs)
        mine = fold_pair(kernel, kind, tuple(_at(x, a) for x in merged), _at(queries.q, a),
                         _at(k_P, b), _at(v_P, b), docs)
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
        docs = _pair_docs(queries, a, _at(k_segment, b), k_P.shape[2])
        dq_a, dk_b, dv_b = add_pair_grads(
            kernel, pair_kind(_at(queries.segment, a), _at(k_segment, b), docs),
            (_at(dq, a), _at(dk, b), _at(dv, b)), q, _at(k_P, b), _at(v_P, b), o, lse, do,
            docs)
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
