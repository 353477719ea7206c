"""Attention of one (query segment, key segment) pair: the unit context parallelism merges.

A segment is a run of consecutive positions (cp_layout: a chip's shard under contiguous, each
half of it under zigzag; ulysses' whole sequence). Two segments of equal length s either see
each other wholly (the keys come first: causal=False), or are the same segment (causal=True:
query i sees key j ≤ i, the square's lower triangle); a pair whose keys all come later is
skipped by the caller. A PairKernel computes such a pair:

    forward(q [B, s, H, E], k, v [B, s, G, E], causal) -> (o [B, s, H, E], lse [B, s, H] f32)
        o = softmax(q·kᵀ/√E) v over the pair's keys (any float dtype), lse = log Σ exp(q·kᵀ/√E)
        in float32 (natural log, scaled scores: FlashAttention-2's L).
    backward(q, k, v, o, lse, do, causal) -> (dq, dk, dv) float32
        the pair's share of the gradient of the merged attention, given the MERGED o and lse
        of these queries (over every key they see): probabilities exp(q·kᵀ/√E − lse), and
        rowsum(o·do) as the softmax's correction (FlashAttention-2's ring backward).

Why the backward takes the merged statistics: merging pairs by log-sum-exp,
o = Σ_p exp(lse_p − L) o_p with L = log Σ_p exp(lse_p), makes o depend on each lse_p, and
jax.nn.dot_product_attention's residual carries no gradient (its xla implementation wraps it
in stop_gradient, cuDNN's backward drops its cotangent). The missing term, a row constant ×
the pair's probabilities, has a nonzero row sum, which no cotangent of o_p can produce (a
softmax VJP's row sums are 0). So the CP modes wrap the whole merge in a custom VJP that saves
the merged o and L and calls each pair's backward with them: exact, as the tests check
against the one-chip attention.

Kernels (PAIR_KERNELS names; kernels.py maps a name to its PairKernel, pair_kernel, and
resolves the `kernels` setting to one):
    reference  attention.py's tiles (merge_keys / add_key_grads): fixed score tiles, float32
               statistics, invisible tiles skipped.
    xla        jax.nn.dot_product_attention(implementation="xla", return_residual=True) for o
               (attention_fused.py); its lse is exact in float32, recomputed in float32 under
               bf16/fp16 (jax rounds it to the input dtype); backward: no library backward
               takes merged statistics on CPU, so it is the dense formula
               (attention.dense_grads: the scores the xla implementation materializes too).
    cudnn      cuDNN flash attention (GPU): forward with float32 statistics, backward fed the
               merged ones.
    splash     splash attention (TPU), the same way.
    splash_interpreted
               splash attention through Pallas's interpreter (a CPU under
               GDN_SWEEP_INTERPRET_KERNELS=1: a correctness path, never a speed).
Under bf16 inputs every kernel multiplies in bf16 and keeps lse and the merge in float32.

Packed documents: a pair may carry `docs` (PairDocs: its queries' and keys' GLOBAL positions
and each query's document start, gdn_core.attention_documents); query i then sees key j iff
start_i ≤ k_pos_j ≤ q_pos_i. pair_kind skips a pair whose keys all lie before the earliest
document start of its queries (every key's document ended before the first query's began),
as it skips one whose keys all follow; the reference masks and skips tile by tile inside
(attention._visibility); a query the pair's keys do not reach gets o 0 and lse MASKED (weight
0 in the merge; no row is empty after the merge: a query sees itself). A kernel that cannot
take documents (PairKernel.documents False) raises kernels.KernelUnavailable when given them.
Legend: B batch, s segment tokens, H query heads, G KV heads, E head_dim.
"""

from __future__ import annotations

import functools
from typing import Callable, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
from jax import lax

from ..kernels import KernelUnavailable
from .attention import (
    ATTENTION_BLOCK,
    MASKED,
    add_key_grads,
    document_starts,
    empty_stats,
    finish,
    from_query_tiles,
    merge_keys,
    query_position_tiles,
    query_tiles,
    tile_delta,
    tile_size,
)

PairKernelName = Literal["reference", "xla", "cudnn", "splash", "splash_interpreted"]
PAIR_KERNELS: tuple[str, ...] = get_args(PairKernelName)


class PairKernel(NamedTuple):
    """forward and backward of one (query segment, key segment) pair (module docstring);
    both take a last optional argument `docs` (PairDocs or None)."""
    forward: Callable
    backward: Callable
    traced_causal: bool = False
    """Whether `causal` may be a traced bool: then one compiled branch serves full and causal
    pairs (the reference masks by positions), else each is its own lax.switch branch (the
    library kernels take their mask statically)."""
    documents: bool = False
    """Whether it serves packed documents (a pair's docs); if not it raises KernelUnavailable
    when given them."""


class PairDocs(NamedTuple):
    """A segment pair's packed documents: int32 global positions of its queries q_pos [s] and
    keys k_pos [s'], and each query's document start q_start [s] (query i sees key j iff
    q_start[i] ≤ k_pos[j] ≤ q_pos[i])."""
    q_pos: jax.Array
    k_pos: jax.Array
    q_start: jax.Array

    @classmethod
    def of(cls, q_pos, k_pos, cu_seqlens) -> PairDocs:
        """From global positions and the global cu_seqlens (int [N+1])."""
        q_pos = jnp.asarray(q_pos).astype(jnp.int32)
        return cls(q_pos, jnp.asarray(k_pos).astype(jnp.int32),
                   document_starts(cu_seqlens, q_pos))

    def mask(self):
        """bool [s, s']: query i sees key j."""
        k = self.k_pos[None, :]
        return (k <= self.q_pos[:, None]) & (k >= self.q_start[:, None])


def check_pair_kernel(kernel: str) -> None:
    if kernel not in PAIR_KERNELS:
        raise ValueError(f"kernel={kernel!r} is not one of: {', '.join(PAIR_KERNELS)}")


# ---- merging pairs by log-sum-exp --------------------------------------------------------

def empty_merge(q_XBsHE):
    """The merge before any pair: (o 0 [..., B, s, H, E], lse MASKED [..., B, s, H]), f32."""
    return (jnp.zeros(q_XBsHE.shape, jnp.float32),
            jnp.full(q_XBsHE.shape[:-1], MASKED, jnp.float32))


def merge_pair(merged, pair):
    """Fold a pair's (o, lse) into the merge: L = logaddexp(lse_m, lse_p),
    o = exp(lse_m − L)·o_m + exp(lse_p − L)·o_p, in float32 (MASKED, finite, keeps an empty
    merge's weight 0 without NaN)."""
    (o_m, lse_m), (o_p, lse_p) = merged, pair
    lse = jnp.logaddexp(lse_m, lse_p)
    return (jnp.exp(lse_m - lse)[..., None] * o_m
            + jnp.exp(lse_p - lse)[..., None] * o_p.astype(jnp.float32), lse)


# ---- the reference kernel: attention.py's tiles ------------------------------------------

def _pair_positions(s: int, causal):
    """Positions that make attention.py's tile loops see the pair as it is: keys 0 … s−1,
    queries the same (causal) or s … 2s−1 (after every key); causal may be traced."""
    keys = jnp.arange(s, dtype=jnp.int32)
    return keys + jnp.where(causal, 0, s).astype(jnp.int32), keys


def _lse_tiles(lse_BsH, G: int, tile: int):
    return query_tiles(lse_BsH[..., None], G, tile)[..., 0]


def _reference_positions(s: int, causal, docs: PairDocs | None, tile: int):
    """(q_pos, k_pos, query tiles of q_start or None) the tile loops see the pair by."""
    if docs is None:
        return (*_pair_positions(s, causal), None)
    return docs.q_pos, docs.k_pos, query_position_tiles(docs.q_start, tile)


def _reference_forward(block: int, q_BsHE, k_BsGE, v_BsGE, causal, docs=None):
    s, G = q_BsHE.shape[1], k_BsGE.shape[2]
    tile = tile_size(s, block)
    q_pos, k_pos, q_start = _reference_positions(s, causal, docs, tile)
    q_n = query_tiles(q_BsHE, G, tile)
    stats = merge_keys(empty_stats(q_n), q_n, query_position_tiles(q_pos, tile), k_BsGE,
                       v_BsGE, k_pos, tile, q_start)
    o_n, lse_n = finish(stats, jnp.float32, empty_rows=docs is not None)
    return from_query_tiles(o_n, s), from_query_tiles(lse_n[..., None], s)[..., 0]


def _reference_backward(block: int, q_BsHE, k_BsGE, v_BsGE, o_BsHE, lse_BsH, do_BsHE,
                        causal, docs=None):
    s, G = q_BsHE.shape[1], k_BsGE.shape[2]
    tile = tile_size(s, block)
    q_pos, k_pos, q_start = _reference_positions(s, causal, docs, tile)
    q_n, do_n, o_n = (query_tiles(x.astype(q_BsHE.dtype), G, tile)
                      for x in (q_BsHE, do_BsHE, o_BsHE))
    zeros_kv = jnp.zeros(k_BsGE.shape, jnp.float32)
    dq_n, dk, dv = add_key_grads((jnp.zeros(q_n.shape, jnp.float32), zeros_kv, zeros_kv), q_n,
                                 do_n, _lse_tiles(lse_BsH, G, tile), tile_delta(o_n, do_n),
                                 query_position_tiles(q_pos, tile), k_BsGE, v_BsGE, k_pos,
                                 tile, q_start)
    return from_query_tiles(dq_n, s), dk, dv


def reference_kernel(block: int = ATTENTION_BLOCK) -> PairKernel:
    """attention.py's tiles of tile_size(s, block) tokens as a PairKernel (its tiles' own
    lax.switch on positions tells full from causal: one branch serves both)."""
    return PairKernel(functools.partial(_reference_forward, block),
                      functools.partial(_reference_backward, block), traced_causal=True,
                      documents=True)


# ---- the pair kinds and one pair as a differentiable attention ----------------------------

SKIP, FULL, CAUSAL = range(3)
"""What a pair of segments is, from their indices in the sequence (the lax.switch index)."""


def pair_kind(q_segment, k_segment, docs: PairDocs | None = None):
    """SKIP when the keys' segment comes after the queries', CAUSAL when it is theirs, FULL
    when it comes before: int32 (traced or not). docs (packed documents): SKIP also when every
    key lies before the earliest document start of the queries — the keys' documents all
    ended before the queries' first one began, so the pair is not computed at all."""
    kind = jnp.where(k_segment > q_segment, SKIP,
                     jnp.where(k_segment == q_segment, CAUSAL, FULL)).astype(jnp.int32)
    if docs is None:
        return kind
    return jnp.where(docs.k_pos.max() < docs.q_start.min(), SKIP, kind).astype(jnp.int32)


def _switch(kernel: PairKernel, kind, branch, carry, *args):
    """lax.switch on `kind`: SKIP returns carry, the others branch(causal)(carry, *args) —
    one branch for both when the kernel takes a traced causal."""
    def skip(carry, *_):
        return carry

    if kernel.traced_causal:
        return lax.cond(kind == SKIP, skip, branch(kind == CAUSAL), carry, *args)
    return lax.switch(kind, (skip, branch(False), branch(True)), carry, *args)


def _documents(kernel: PairKernel, docs) -> PairDocs | None:
    """docs, after checking (at trace time) that the kernel serves packed documents."""
    if docs is not None and not kernel.documents:
        raise KernelUnavailable("this fused attention kernel takes no mask, so it cannot "
                                "serve packed documents (cu_seqlens); run kernels='reference'"
                                " (or 'fused' on a CPU without GDN_SWEEP_INTERPRET_KERNELS=1:"
                                " xla)")
    return docs


def fold_pair(kernel: PairKernel, kind, merged, q_BsHE, k_BsGE, v_BsGE,
              docs: PairDocs | None = None):
    """merged with the pair (q, k, v) folded in as `kind` says (only that branch runs);
    docs: the pair's packed documents, or None."""
    def attend(causal):
        return lambda merged, q, k, v, docs: merge_pair(merged,
                                                        kernel.forward(q, k, v, causal, docs))

    return _switch(kernel, kind, attend, merged, q_BsHE, k_BsGE, v_BsGE,
                   _documents(kernel, docs))


def add_pair_grads(kernel: PairKernel, kind, grads, q_BsHE, k_BsGE, v_BsGE, o_BsHE,
                   lse_BsH, do_BsHE, docs: PairDocs | None = None):
    """grads = (dq, dk, dv) float32 plus the pair's share (kernel.backward with the merged o
    and lse), as `kind` says."""
    def add(causal):
        def branch(grads, *args):
            *args, docs = args
            return tuple(acc + g for acc, g in zip(grads, kernel.backward(*args, causal, docs)))
        return branch

    return _switch(kernel, kind, add, grads, q_BsHE, k_BsGE, v_BsGE, o_BsHE, lse_BsH, do_BsHE,
                   _documents(kernel, docs))


def causal_pair_attention(q_BTHE, k_BTGE, v_BTGE, kernel: PairKernel, cu_seqlens=None):
    """Causal attention of a whole sequence (one causal pair) through `kernel` (hashable, as
    kernels.pair_kernel returns it): o [B, T, H, E] in q's dtype, differentiable (its backward
    is the kernel's, fed the forward's o and lse). cu_seqlens: packed documents of these T
    tokens (int [N+1]), or None."""
    T = q_BTHE.shape[1]
    docs = None if cu_seqlens is None else PairDocs.of(jnp.arange(T), jnp.arange(T), cu_seqlens)
    return _causal_pair(q_BTHE, k_BTGE, v_BTGE, _documents(kernel, docs), kernel)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _causal_pair(q_BTHE, k_BTGE, v_BTGE, docs, kernel):
    return _causal_pair_fwd(q_BTHE, k_BTGE, v_BTGE, docs, kernel)[0]


def _causal_pair_fwd(q_BTHE, k_BTGE, v_BTGE, docs, kernel):
    o_BTHE, lse_BTH = kernel.forward(q_BTHE, k_BTGE, v_BTGE, True, docs)
    o_BTHE = o_BTHE.astype(q_BTHE.dtype)
    return o_BTHE, (q_BTHE, k_BTGE, v_BTGE, docs, o_BTHE, lse_BTH)


def _causal_pair_bwd(kernel, residuals, do_BTHE):
    q, k, v, docs, o, lse = residuals
    dq, dk, dv = kernel.backward(q, k, v, o, lse, do_BTHE, True, docs)
    return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype),
            None if docs is None else PairDocs(None, None, None))


_causal_pair.defvjp(_causal_pair_fwd, _causal_pair_bwd)
