"""The gated delta rule on ONE chunk of ONE value head, written for a Pallas kernel body.

Only what Mosaic (TPU) and Triton (GPU) both lower: 2-D dots (transposed operands through
dot_general's contracting dims), elementwise math, iota masks and reductions along a tile's
axes; no dynamic slicing, no loops, no per-token vectors of rank 1. Per-token quantities
(G, β, the document segment) arrive as rows [1, C]; a column [C, 1] is made from a row by a
diagonal mask and a lane reduction (`as_column`), so no vector is ever transposed.

Per chunk, with the entering state S [K, V] (float32), as gdn_core.jax_gdn.chunk:

    decay = e^{G_i − G_j} (i ≥ j, same document segment), L = (β k kᵀ) ⊙ decay (strictly lower),
    T = (I + L)⁻¹, u = T (β v), w = T (β k e^{G}),  v_new = u − w S,
    o = (q e^{G}) S + ((q kᵀ) ⊙ decay) v_new,        S' = a S + (k e^{G_C − G})ᵀ v_new

a = e^{G_C} when no document starts inside the chunk, else 0 (the chunk's last document began
inside it). G is the chunk-local cumulative log decay, restarting at each document start (the
caller's cumulative sum); e^{G} reaches only the chunk's first segment, e^{G_C − G} only its
last.

T (`unit_lower_inverse`) by blockwise merges from 1×1 blocks: T_{2s} = T_s − T_s L_s T_s, with
L_s the entries of L joining the two s-halves of each 2s-block (inv([[A,0],[C,B]]) =
[[A⁻¹,0],[−B⁻¹CA⁻¹,B⁻¹]]); every intermediate is an exact inverse of leading blocks, so no large
terms cancel (the product form (I−L)(I+L²)… does, on keys that share a direction). 2·log2(C)
C×C dots. Backward of the inverse, written out: dL = −Tᵀ dT Tᵀ (strictly lower).

Precision as the reference: float32 dots at HIGHEST for everything feeding the state and w, u;
bf16 operands with float32 accumulation (`low`) for q kᵀ, q̃ S and attn·v_new when the inputs
are bf16.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

HIGHEST = lax.Precision.HIGHEST
F32 = jnp.float32


def _dot(a, b, contract, low=None):
    """2-D dot with contracting dims `contract` ((a_dim,), (b_dim,)), float32 accumulation.

    low: None/float32 → float32 operands at HIGHEST; a dtype → that dtype's operands (plain
    dot_general: Triton lowers no custom_vjp_call); ("vjp", dtype) → the same through
    _low_dot, whose backward keeps low operands (for a function jax.vjp differentiates).
    """
    if isinstance(low, tuple):
        return _low_dot(a, b, contract, low[1]) if low[1] != F32 else _dot(a, b, contract)
    if low is not None and low != F32:
        return lax.dot_general(a.astype(low), b.astype(low), (contract, ((), ())),
                               preferred_element_type=F32)
    return lax.dot_general(a.astype(F32), b.astype(F32), (contract, ((), ())),
                           precision=HIGHEST, preferred_element_type=F32)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _low_dot(a, b, contract, low):
    """Dot of `low` (bf16) operands, float32 result; its backward dots take `low` operands too
    (autodiff would pair a float32 cotangent with a bf16 operand, which Triton's dot refuses)."""
    return lax.dot_general(a.astype(low), b.astype(low), (contract, ((), ())),
                           preferred_element_type=F32)


def _low_dot_fwd(a, b, contract, low):
    a, b = a.astype(low), b.astype(low)
    return lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=F32), (a, b)


def _low_dot_bwd(contract, low, operands, d_out):
    """out[i, j] = Σ_c A[i, c] B[c, j] with A = a or aᵀ (ca = 1 or 0), B = b or bᵀ (cb = 0 or
    1); each cotangent comes out in its operand's own orientation (no transposes)."""
    a, b = operands
    d_out = d_out.astype(low)
    (ca,), (cb,) = contract

    def dot_(x, y, cx, cy):
        return lax.dot_general(x, y, (((cx,), (cy,)), ((), ())), preferred_element_type=F32)

    da = dot_(d_out, b, 1, 1 - cb) if ca == 1 else dot_(b, d_out, 1 - cb, 1)
    db = dot_(a, d_out, 1 - ca, 0) if cb == 0 else dot_(d_out, a, 0, 1 - ca)
    return da, db


_low_dot.defvjp(_low_dot_fwd, _low_dot_bwd)


def dot(a, b, low=None):
    """a @ b."""
    return _dot(a, b, ((1,), (0,)), low)


def dot_nt(a, b, low=None):
    """a @ bᵀ."""
    return _dot(a, b, ((1,), (1,)), low)


def dot_tn(a, b):
    """aᵀ @ b (float32)."""
    return _dot(a, b, ((0,), (0,)))


def _rows_cols(C: int):
    return (lax.broadcasted_iota(jnp.int32, (C, C), 0), lax.broadcasted_iota(jnp.int32, (C, C), 1))


def as_column(x_1C):
    """[1, C] row → [C, 1] column (diagonal mask, lane sum): no vector transpose."""
    C = x_1C.shape[-1]
    i, j = _rows_cols(C)
    return jnp.sum(jnp.where(i == j, jnp.broadcast_to(x_1C, (C, C)), 0.0), axis=1, keepdims=True)


def last_of(x_1C):
    """The last entry of a row, as [1, 1]."""
    C = x_1C.shape[-1]
    lane = lax.broadcasted_iota(jnp.int32, (1, C), 1)
    return jnp.sum(jnp.where(lane == C - 1, x_1C, 0.0), axis=1, keepdims=True)


def strictly_lower(x_CC):
    i, j = _rows_cols(x_CC.shape[-1])
    return jnp.where(i > j, x_CC, 0.0)


def unit_lower_inverse(L_CC):
    """(I + L)⁻¹ for strictly lower L [C, C] (C a power of two), by blockwise merges."""
    C = L_CC.shape[-1]
    i, j = _rows_cols(C)
    T_CC = (i == j).astype(F32)
    s, shift = 1, 0
    while s < C:
        bi, bj = i >> shift, j >> shift  # the s-block of row i and of column j
        joining = ((bi & 1) == 1) & (bj == bi - 1)  # lower-left s×s block of each 2s-block
        L_s = jnp.where(joining, L_CC, 0.0)
        T_CC = T_CC - dot(dot(T_CC, L_s), T_CC)
        s, shift = 2 * s, shift + 1
    return T_CC


def inverse_cotangent(T_CC, dT_CC):
    """∂/∂L of (I + L)⁻¹ given dT: −Tᵀ dT Tᵀ, strictly lower."""
    return strictly_lower(-dot_nt(dot_tn(T_CC, dT_CC), T_CC))


class Masks(NamedTuple):
    """Where the chunk's tokens see each other and the state; float32 factors, [C, C] / [C, 1]."""

    decay: jax.Array  # e^{G_i − G_j} where i ≥ j in the same segment, else 0
    to_state: jax.Array  # [C, 1] e^{G_i} on the first segment, else 0
    to_end: jax.Array  # [C, 1] e^{G_C − G_i} on the last segment, else 0
    carry: jax.Array  # [1, 1] e^{G_C} if no document starts inside the chunk, else 0


def masks(G_1C, seg_1C=None) -> Masks:
    """The chunk's decay factors from its cumulative log decay G (row [1, C]) and, with packed
    documents, each token's segment (row [1, C], float: documents begun inside the chunk up to
    and including the token)."""
    C = G_1C.shape[-1]
    i, j = _rows_cols(C)
    G_C1, G_last = as_column(G_1C), last_of(G_1C)
    visible = i >= j
    first = last = None
    if seg_1C is not None:
        seg_C1, seg_last = as_column(seg_1C), last_of(seg_1C)
        visible = visible & (seg_C1 == seg_1C)
        first, last = seg_C1 == 0.0, seg_C1 == seg_last
    # Masked before exp: outside `visible` the exponent may be positive and overflow.
    decay = jnp.where(visible, jnp.exp(jnp.where(visible, G_C1 - G_1C, 0.0)), 0.0)
    to_state, to_end, carry = jnp.exp(G_C1), jnp.exp(G_last - G_C1), jnp.exp(G_last)
    if seg_1C is not None:
        to_state = jnp.where(first, to_state, 0.0)
        to_end = jnp.where(last, jnp.exp(jnp.where(last, G_last - G_C1, 0.0)), 0.0)
        carry = jnp.where(seg_last == 0.0, carry, 0.0)
    return Masks(decay, to_state, to_end, carry)


def l2norm(x, eps: float = 1e-6):
    """x / sqrt(Σx² + eps) over the last dim, float32 (as gdn_core.jax_gdn.naive.l2norm)."""
    x = x.astype(F32)
    return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def prepared_qk(q_CK, k_CK, use_qk_l2norm: bool):
    """q (normalised if asked, × K^-½) and k (normalised if asked), float32."""
    q, k = q_CK.astype(F32), k_CK.astype(F32)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    return q * q.shape[-1] ** -0.5, k


def lower_matrix(k_CK, G_1C, beta_1C, seg_1C, *, use_qk_l2norm: bool):
    """L = (β k kᵀ) ⊙ decay, strictly lower [C, C] float32."""
    _, k = prepared_qk(k_CK, k_CK, use_qk_l2norm)
    kbeta = k * as_column(beta_1C.astype(F32))
    return strictly_lower(dot_nt(kbeta, k) * masks(G_1C, seg_1C).decay)


def outputs_given_inverse(q_CK, k_CK, v_CV, G_1C, beta_1C, S_KV, T_CC, seg_1C, *,
                          use_qk_l2norm: bool, low):
    """(o [C, V], S' [K, V]) float32 from the chunk's inputs, its entering state and T."""
    q, k = prepared_qk(q_CK, k_CK, use_qk_l2norm)
    m = masks(G_1C, seg_1C)
    beta = as_column(beta_1C.astype(F32))
    u = dot(T_CC, v_CV.astype(F32) * beta)
    w = dot(T_CC, k * beta * m.to_state)
    v_new = u - dot(w, S_KV)
    attn = dot_nt(q, k, low) * m.decay
    o = dot(q * m.to_state, S_KV, low) + dot(attn, v_new, low)
    S_next = m.carry * S_KV + dot_tn(k * m.to_end, v_new)
    return o, S_next


def chunk_forward(q_CK, k_CK, v_CV, G_1C, beta_1C, S_KV, seg_1C=None, *, use_qk_l2norm: bool,
                  low=F32):
    """(o [C, V], S' [K, V]) float32: the chunk's output and the state leaving it."""
    T_CC = unit_lower_inverse(lower_matrix(k_CK, G_1C, beta_1C, seg_1C,
                                           use_qk_l2norm=use_qk_l2norm))
    return outputs_given_inverse(q_CK, k_CK, v_CV, G_1C, beta_1C, S_KV, T_CC, seg_1C,
                                 use_qk_l2norm=use_qk_l2norm, low=low)


def chunk_backward(q_CK, k_CK, v_CV, G_1C, beta_1C, S_KV, do_CV, dS_next_KV, seg_1C=None, *,
                   use_qk_l2norm: bool, low=F32):
    """Cotangents (dq, dk, dv, dG, dβ, dS) of chunk_forward given (do, dS'), all float32.

    Recomputes the chunk's forward; the autodiff of the straight-line math (jax.vjp, traced
    into the kernel body) except across the inverse, whose backward is written out.
    """
    f32 = [x.astype(F32) for x in (q_CK, k_CK, v_CV, G_1C, beta_1C)]
    q, k, v, G, beta = f32

    def lower(k, G, beta):
        return lower_matrix(k, G, beta, seg_1C, use_qk_l2norm=use_qk_l2norm)

    L_CC, lower_vjp = jax.vjp(lower, k, G, beta)
    T_CC = unit_lower_inverse(L_CC)

    def given_inverse(q, k, v, G, beta, S, T):
        return outputs_given_inverse(q, k, v, G, beta, S, T, seg_1C,
                                     use_qk_l2norm=use_qk_l2norm, low=("vjp", low))

    _, outputs_vjp = jax.vjp(given_inverse, q, k, v, G, beta, S_KV, T_CC)
    dq, dk, dv, dG, dbeta, dS, dT = outputs_vjp((do_CV.astype(F32), dS_next_KV))
    dk_L, dG_L, dbeta_L = lower_vjp(inverse_cotangent(T_CC, dT))
    return dq, dk + dk_L, dv, dG + dG_L, dbeta + dbeta_L, dS


# --- The state's chain alone: what a GPU's sequential passes run (gpu_kernels.py) ----------------

def chunk_wu(k_CK, v_CV, G_1C, beta_1C, seg_1C=None, *, use_qk_l2norm: bool):
    """(w [C, K], u [C, V]) float32: T (β k e^{G}) and T (β v), the chunk's state-pass terms."""
    T_CC = unit_lower_inverse(lower_matrix(k_CK, G_1C, beta_1C, seg_1C,
                                           use_qk_l2norm=use_qk_l2norm))
    _, k = prepared_qk(k_CK, k_CK, use_qk_l2norm)
    beta = as_column(beta_1C.astype(F32))
    to_state = masks(G_1C, seg_1C).to_state
    return dot(T_CC, k * beta * to_state), dot(T_CC, v_CV.astype(F32) * beta)


def state_factors(k_CK, G_1C, seg_1C=None, *, use_qk_l2norm: bool):
    """(k e^{G_C − G} on the last segment [C, K], a [1, 1]) float32."""
    _, k = prepared_qk(k_CK, k_CK, use_qk_l2norm)
    m = masks(G_1C, seg_1C)
    return k * m.to_end, m.carry


def state_step(S_KV, w_CK, u_CV, kdec_CK, carry_11):
    """S' = a S + kdecᵀ (u − w S): the state leaving the chunk (any block of S's columns)."""
    return carry_11 * S_KV + dot_tn(kdec_CK, u_CV - dot(w_CK, S_KV))


def state_cotangent_terms(q_CK, k_CK, G_1C, w_CK, do_CV, seg_1C=None, *, use_qk_l2norm: bool):
    """c [K, V] float32: ∂(o · do)/∂S of the chunk, q̃ᵀ do − wᵀ (attnᵀ do) (independent of S)."""
    q, k = prepared_qk(q_CK, k_CK, use_qk_l2norm)
    m = masks(G_1C, seg_1C)
    do = do_CV.astype(F32)
    attn = dot_nt(q, k) * m.decay
    return dot_tn(q * m.to_state, do) - dot_tn(w_CK, dot_tn(attn, do))


def state_cotangent_step(dS_next_KV, w_CK, kdec_CK, carry_11, c_KV):
    """dS = Aᵀ dS' + c with A = a I − kdecᵀ w: the cotangent of the state entering the chunk."""
    return carry_11 * dS_next_KV - dot_tn(w_CK, dot(kdec_CK, dS_next_KV)) + c_KV
