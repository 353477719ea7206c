"""Chunked gated delta rule in JAX, written as an affine scan over chunks (see torch_gdn.chunk).

    S_{n+1} = A_n S_n + b_n,   A_n = e^{G_C} I − k̃ᵀ w,   b_n = k̃ᵀ u,
    w = T (β k e^{G}),  u = T (β v),  k̃ = k e^{G_C − G},  T = (I + L)⁻¹.

T is built as a product, (I + L)⁻¹ = (I − L)(I + L²)(I + L⁴)…(I + L^{C/2}) for strictly-lower
(hence nilpotent) L: log2(C) − 1 squarings of batched matmuls. This avoids
`jax.scipy.linalg.solve_triangular`, which hangs inside jit on this project's CPU hosts once
the batch of blocks is large, and is the shape TPUs and GPUs prefer anyway.
Only S_{n+1} = A_n S_n + b_n runs sequentially (lax.scan); everything else is batched.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..shapes import check_rule_args
from .naive import HIGHEST, l2norm


class ChunkTerms(NamedTuple):
    """Chunk-local terms of the rule (float32, chunk axis leading: [N, B, H, ...])."""

    q_NBHCK: jax.Array  # q · Dk^-½ · e^{G}
    attn_NBHCC: jax.Array  # (q kᵀ) ⊙ e^{G_i−G_j}, causal incl. diagonal
    w_NBHCK: jax.Array
    u_NBHCV: jax.Array
    A_NBHKK: jax.Array
    b_NBHKV: jax.Array


def mm(a, b):
    return jnp.matmul(a, b, precision=HIGHEST)


def unit_lower_inverse(L_CC):
    """(I + L)⁻¹ for strictly lower-triangular L [..., C, C], C a power of two."""
    C = L_CC.shape[-1]
    inverse = jnp.eye(C, dtype=L_CC.dtype) - L_CC
    power = L_CC
    for _ in range(C.bit_length() - 2):  # L², L⁴, …, L^{C/2}
        power = mm(power, power)
        inverse = inverse + mm(inverse, power)
    return inverse


def prepare_chunks(q, k, v, g, beta, *, use_qk_l2norm=False, chunk_size=64) -> ChunkTerms:
    """Compute every chunk-local term of the rule. Shapes as in chunk_gated_delta_rule."""
    B, T, Hk, Hv, Dk, Dv = check_rule_args(
        q.shape, k.shape, v.shape, g.shape, beta.shape, None, chunk_size)
    C, r = chunk_size, Hv // Hk
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    if r > 1:
        q, k = jnp.repeat(q, r, axis=2), jnp.repeat(k, r, axis=2)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * Dk ** -0.5
    pad = (-T) % C
    N = (T + pad) // C

    def chunked(x):  # [B, T, H, D] -> [N, B, H, C, D]
        x = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, pad), (0, 0), (0, 0)))
        return x.reshape(B, N, C, Hv, x.shape[-1]).transpose(1, 0, 3, 2, 4)

    q_NBHCK, k_NBHCK, v_NBHCV = chunked(q), chunked(k), chunked(v)
    g_NBHC, beta_NBHC = (chunked(x[..., None])[..., 0] for x in (g, beta))
    G_NBHC = jnp.cumsum(g_NBHC, axis=-1)
    causal_CC = jnp.tril(jnp.ones((C, C), dtype=bool))
    # Mask before exp: above the diagonal G_i − G_j > 0 and would overflow under strong decay.
    diff = G_NBHC[..., :, None] - G_NBHC[..., None, :]
    decay_NBHCC = jnp.where(causal_CC, jnp.exp(jnp.where(causal_CC, diff, 0.0)), 0.0)

    kbeta_NBHCK = k_NBHCK * beta_NBHC[..., None]
    strict_CC = jnp.tril(jnp.ones((C, C), dtype=bool), -1)
    L_NBHCC = jnp.where(strict_CC, mm(kbeta_NBHCK, jnp.swapaxes(k_NBHCK, -1, -2)) * decay_NBHCC, 0.0)
    T_NBHCC = unit_lower_inverse(L_NBHCC)
    u_NBHCV = mm(T_NBHCC, v_NBHCV * beta_NBHC[..., None])
    w_NBHCK = mm(T_NBHCC, kbeta_NBHCK * jnp.exp(G_NBHC)[..., None])

    G_last_NBH = G_NBHC[..., -1]
    kdecT_NBHKC = jnp.swapaxes(k_NBHCK * jnp.exp(G_last_NBH[..., None] - G_NBHC)[..., None], -1, -2)
    A_NBHKK = (jnp.exp(G_last_NBH)[..., None, None] * jnp.eye(Dk, dtype=jnp.float32)
               - mm(kdecT_NBHKC, w_NBHCK))
    b_NBHKV = mm(kdecT_NBHKC, u_NBHCV)
    attn_NBHCC = mm(q_NBHCK, jnp.swapaxes(k_NBHCK, -1, -2)) * decay_NBHCC
    return ChunkTerms(q_NBHCK * jnp.exp(G_NBHC)[..., None], attn_NBHCC, w_NBHCK, u_NBHCV,
                      A_NBHKK, b_NBHKV)


def reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV, d_last_BHKV, *,
                       with_pairs: bool = True):
    """Backward of S_{n+1} = A_n S_n + b_n given cotangents of every S_n and of S_N.

    μ_N = d_last; μ_n = d_states_n + A_nᵀ μ_{n+1}; ∂A_n = μ_{n+1} S_nᵀ, ∂b_n = μ_{n+1}.
    Returns μ_0 (∂L/∂S_0) and, if with_pairs, (∂A [N,B,H,K,K], ∂b [N,B,H,K,V]).
    """
    def step(mu_BHKV, xs):
        A_BHKK, S_BHKV, dS_BHKV = xs
        grads = (mm(mu_BHKV, jnp.swapaxes(S_BHKV, -1, -2)), mu_BHKV) if with_pairs else None
        return dS_BHKV + mm(jnp.swapaxes(A_BHKK, -1, -2), mu_BHKV), grads

    mu0_BHKV, grads = jax.lax.scan(step, d_last_BHKV, (A_NBHKK, states_NBHKV, d_states_NBHKV),
                                   reverse=True)
    return mu0_BHKV, grads


def _forward_state_scan(A_NBHKK, b_NBHKV, h0_BHKV):
    def step(h_BHKV, pair):
        A_BHKK, b_BHKV = pair
        return mm(A_BHKK, h_BHKV) + b_BHKV, h_BHKV

    final_BHKV, states_NBHKV = jax.lax.scan(step, h0_BHKV, (A_NBHKK, b_NBHKV))
    return states_NBHKV, final_BHKV


@jax.custom_vjp
def scan_chunk_states(A_NBHKK, b_NBHKV, h0_BHKV):
    """S_0 = h0, S_{n+1} = A_n S_n + b_n. Returns (S_n entering each chunk [N,B,H,K,V], S_N).

    The backward is written out (reverse_state_scan): its residuals are A_n and the states this
    scan returns anyway, where autodiff of the scan keeps its own copies.
    """
    return _forward_state_scan(A_NBHKK, b_NBHKV, h0_BHKV)


def _scan_fwd(A_NBHKK, b_NBHKV, h0_BHKV):
    states_NBHKV, final_BHKV = _forward_state_scan(A_NBHKK, b_NBHKV, h0_BHKV)
    return (states_NBHKV, final_BHKV), (A_NBHKK, states_NBHKV)


def _scan_bwd(residuals, cotangents):
    A_NBHKK, states_NBHKV = residuals
    d_states_NBHKV, d_final_BHKV = cotangents
    dh0_BHKV, (dA_NBHKK, db_NBHKV) = reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV,
                                                         d_final_BHKV)
    return dA_NBHKK, db_NBHKV, dh0_BHKV


scan_chunk_states.defvjp(_scan_fwd, _scan_bwd)


def compose_affine(A_first, b_first, A_then, b_then):
    """The map 'apply (A_first, b_first), then (A_then, b_then)'."""
    return mm(A_then, A_first), mm(A_then, b_first) + b_then


def fold_chunk_pairs(A_NBHKK, b_NBHKV):
    """Compose all chunks into one affine map h ↦ A h + b, by a sequential scan.

    The body is checkpointed so the backward recomputes each running product rather than
    keeping a K×K product per chunk beyond the carried pair.
    """
    @jax.checkpoint
    def step(carry, pair):
        return compose_affine(*carry, *pair), None

    (A_BHKK, b_BHKV), _ = jax.lax.scan(step, (A_NBHKK[0], b_NBHKV[0]), (A_NBHKK[1:], b_NBHKV[1:]))
    return A_BHKK, b_BHKV


def chunk_outputs(terms: ChunkTerms, states_NBHKV, seq_len: int):
    """o = q̃ S_n + attn (u − w S_n) for every chunk at once; returns float32 [B, T, H, V]."""
    v_new_NBHCV = terms.u_NBHCV - mm(terms.w_NBHCK, states_NBHKV)
    o_NBHCV = mm(terms.q_NBHCK, states_NBHKV) + mm(terms.attn_NBHCC, v_new_NBHCV)
    N, B, H, C, V = o_NBHCV.shape
    return o_NBHCV.transpose(1, 0, 3, 2, 4).reshape(B, N * C, H, V)[:, :seq_len]


def initial_state_or_zeros(initial_state, B, H, K, V):
    if initial_state is None:
        return jnp.zeros((B, H, K, V), jnp.float32)
    return initial_state.astype(jnp.float32)


def chunk_gated_delta_rule(q, k, v, g, beta, *, initial_state=None, output_final_state=False,
                           use_qk_l2norm=False, chunk_size=64):
    """Gated delta rule over a whole sequence, chunked; jit- and grad-able.

    Args:
        q, k: [B, T, Hk, Dk]. v: [B, T, Hv, Dv], Hv a multiple of Hk (key head i serves value
            heads i·r … i·r+r−1). g: log decay ≤ 0, [B, T, Hv]. beta: [B, T, Hv].
        initial_state: [B, Hv, Dk, Dv] or None (zeros).
        use_qk_l2norm: L2-normalise q and k (eps 1e-6, float32) before the Dk^-½ scale.
        chunk_size: one of 16, 32, 64, 128; T need not be a multiple of it.
    Returns:
        o [B, T, Hv, Dv] in q's dtype, and the float32 final state [B, Hv, Dk, Dv] if asked.
    """
    B, T, _, _, Dk, Dv = check_rule_args(
        q.shape, k.shape, v.shape, g.shape, beta.shape,
        None if initial_state is None else initial_state.shape, chunk_size)
    Hv = v.shape[2]
    h0 = initial_state_or_zeros(initial_state, B, Hv, Dk, Dv)
    if T == 0:
        return jnp.zeros((B, 0, Hv, Dv), q.dtype), (h0 if output_final_state else None)
    terms = prepare_chunks(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size)
    states_NBHKV, final_BHKV = scan_chunk_states(terms.A_NBHKK, terms.b_NBHKV, h0)
    o = chunk_outputs(terms, states_NBHKV, T).astype(q.dtype)
    return o, (final_BHKV if output_final_state else None)
