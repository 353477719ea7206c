"""Token-by-token gated delta rule in JAX (lax.scan over tokens): the JAX ground truth.

Per value head, state h [Dk, Dv]: h ← e^{g_t} h;  h ← h + k_t ⊗ β_t (v_t − hᵀk_t);  o_t = hᵀ q_t.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..shapes import check_rule_args
from .documents import check_cu_seqlens, document_starts

HIGHEST = jax.lax.Precision.HIGHEST  # keep fp32 math fp32 on TPU/GPU (no bf16 passes, no TF32)


def l2norm(x, eps: float = 1e-6):
    """x / sqrt(sum(x²) + eps) over the last dim, in float32."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def recurrent_gated_delta_rule(q, k, v, g, beta, *, initial_state=None, output_final_state=False,
                               use_qk_l2norm=False, cu_seqlens=None):
    """Run the recurrence token by token. Same arguments and results as chunk_gated_delta_rule
    (cu_seqlens: h ← 0 before each document start after the first)."""
    B, T, Hk, Hv, Dk, Dv = check_rule_args(
        q.shape, k.shape, v.shape, g.shape, beta.shape,
        None if initial_state is None else initial_state.shape, 64)
    r = Hv // Hk
    q_BTHK = jnp.repeat(q.astype(jnp.float32), r, axis=2)
    k_BTHK = jnp.repeat(k.astype(jnp.float32), r, axis=2)
    if use_qk_l2norm:
        q_BTHK, k_BTHK = l2norm(q_BTHK), l2norm(k_BTHK)
    q_BTHK = q_BTHK * Dk ** -0.5
    h0 = (jnp.zeros((B, Hv, Dk, Dv), jnp.float32) if initial_state is None
          else initial_state.astype(jnp.float32))

    starts_T = jnp.zeros(T, bool)
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=T)
        starts_T = document_starts(cu_seqlens, jnp.arange(T))

    def step(h_BHKV, xs):
        q_BHK, k_BHK, v_BHV, g_BH, beta_BH, start = xs
        h_BHKV = jnp.where(start, 0.0, h_BHKV)  # a new document: nothing carries over
        h_BHKV = h_BHKV * jnp.exp(g_BH)[..., None, None]
        predicted_BHV = jnp.einsum("bhkv,bhk->bhv", h_BHKV, k_BHK, precision=HIGHEST)
        delta_BHV = beta_BH[..., None] * (v_BHV - predicted_BHV)
        h_BHKV = h_BHKV + k_BHK[..., :, None] * delta_BHV[..., None, :]
        return h_BHKV, jnp.einsum("bhkv,bhk->bhv", h_BHKV, q_BHK, precision=HIGHEST)

    time_major = [jnp.moveaxis(x.astype(jnp.float32), 1, 0)
                  for x in (q_BTHK, k_BTHK, v, g, beta)]
    final, o_TBHV = jax.lax.scan(step, h0, (*time_major, starts_T))
    o = jnp.moveaxis(o_TBHV, 0, 1).astype(q.dtype)
    return o, (final if output_final_state else None)
