"""Functional gated full attention (transformers' Qwen3_5Attention math, as torch_gdn.attention).

    x ─┬─ q_proj ─ per head [query | gate] ─ query: q_norm ─ rotary ─┐
       ├─ k_proj ─ k_norm ─ rotary ─────────────────────────────────┤ causal GQA softmax → o
       └─ v_proj ───────────────────────────────────────────────────┘
    o · sigmoid(gate) ─ o_proj

project → attend → output, so that context parallelism swaps `attend` (the only step that
mixes tokens) and nothing else. Rotary angles come from the tokens' global positions, which a
sequence shard passes in (gdn_core.cp_layout). The one-chip `causal_attention` is the dense
softmax over [T, T] scores (float32 statistics); the CP modes (cp/attention.py) compute the
same in blocks.
Params (torch/HF layout): q_proj {"weight": [2·H·E, D]}, k_proj, v_proj {"weight": [G·E, D]},
o_proj {"weight": [D, H·E]} (each with "bias" when attention_bias), q_norm, k_norm
{"weight": [E]} (zero-centred: the scale is 1 + weight).
Legend: B batch, T tokens, D hidden, H query heads, G key/value heads, r = H/G, E head_dim,
R rotated channels, X = H·E.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..config import AttentionConfig
from .layer import linear
from .naive import HIGHEST
from .params import Params

MASKED = -1e30
"""Score of a masked (future) key: finite, so a row with no key yet gives 0 weights, not NaN."""


def precision(dtype):
    """HIGHEST for float32 (no bf16 passes or TF32 on accelerators), DEFAULT below."""
    return HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def zero_centered_rms_norm(weight, x, eps: float):
    """x · rsqrt(mean(x²) + eps) · (1 + weight) over the last dim, in float32, returned in x's
    dtype (transformers' Qwen3_5RMSNorm: the weight is stored centred on zero)."""
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


def rotary_cos_sin(positions, cfg: AttentionConfig):
    """(cos, sin) [T, R] float32 for integer positions [T]: frequencies θ^(−2i/R), each used
    twice (rotate-half layout), as transformers' default rotary."""
    R = cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, R, 2, dtype=jnp.float32) / R))
    freqs = jnp.asarray(positions).astype(jnp.float32)[:, None] * inv_freq
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x_BTHE, cos_TR, sin_TR):
    """Rotate the first R channels of each head of x [B, T, heads, E]; the rest pass through.
    cos/sin are cast to x's dtype first (as transformers does)."""
    R = cos_TR.shape[-1]
    cos, sin = (c.astype(x_BTHE.dtype)[:, None, :] for c in (cos_TR, sin_TR))
    rot, rest = x_BTHE[..., :R], x_BTHE[..., R:]
    rotated = jnp.concatenate([-rot[..., R // 2:], rot[..., :R // 2]], axis=-1)
    return jnp.concatenate([rot * cos + rotated * sin, rest], axis=-1)


def _linear(params: Params, x):
    y = linear(x, params["weight"])
    return y + params["bias"].astype(y.dtype) if "bias" in params else y


def project(params: Params, x_BTD, cos_TR, sin_TR, cfg: AttentionConfig, eps: float):
    """q [B, T, H, E], k, v [B, T, G, E] (q, k normed and rotated), gate logits [B, T, X]."""
    B, T, _ = x_BTD.shape
    E = cfg.head_dim
    qg_BTH2E = _linear(params["q_proj"], x_BTD).reshape(B, T, -1, 2 * E)
    q_BTHE, gate_BTHE = qg_BTH2E[..., :E], qg_BTH2E[..., E:]
    k_BTGE = _linear(params["k_proj"], x_BTD).reshape(B, T, -1, E)
    v_BTGE = _linear(params["v_proj"], x_BTD).reshape(B, T, -1, E)
    q_BTHE = apply_rotary(zero_centered_rms_norm(params["q_norm"]["weight"], q_BTHE, eps),
                          cos_TR, sin_TR)
    k_BTGE = apply_rotary(zero_centered_rms_norm(params["k_norm"]["weight"], k_BTGE, eps),
                          cos_TR, sin_TR)
    return q_BTHE, k_BTGE, v_BTGE, gate_BTHE.reshape(B, T, -1)


def output(params: Params, o_BTHE, gate_BTX):
    """o · sigmoid(gate), then o_proj: [B, T, D] in o's dtype."""
    B, T = o_BTHE.shape[:2]
    return _linear(params["o_proj"], o_BTHE.reshape(B, T, -1) * jax.nn.sigmoid(gate_BTX))


def causal_attention(q_BTHE, k_BTGE, v_BTGE, q_pos_T=None, k_pos_S=None):
    """Softmax attention, query i reading key j where k_pos[j] ≤ q_pos[i] (default: the
    positions 0 … T−1), query head h reading key/value head h // (H/G). Scores, softmax and
    the weighted sum accumulate in float32; returns o [B, T, H, E] in q's dtype."""
    B, T, H, E = q_BTHE.shape
    S, G = k_BTGE.shape[1], k_BTGE.shape[2]
    q_pos_T = jnp.arange(T) if q_pos_T is None else q_pos_T
    k_pos_S = jnp.arange(S) if k_pos_S is None else k_pos_S
    q_BTGrE = q_BTHE.reshape(B, T, G, H // G, E)
    s_BGrTS = jnp.einsum("btgre,bsge->bgrts", q_BTGrE, k_BTGE, precision=precision(q_BTHE.dtype),
                         preferred_element_type=jnp.float32) * E ** -0.5
    mask_TS = k_pos_S[None, :] <= q_pos_T[:, None]
    p_BGrTS = jax.nn.softmax(jnp.where(mask_TS, s_BGrTS, MASKED), axis=-1)
    o_BTGrE = jnp.einsum("bgrts,bsge->btgre", p_BGrTS.astype(v_BTGE.dtype), v_BTGE,
                         precision=precision(v_BTGE.dtype), preferred_element_type=jnp.float32)
    return o_BTGrE.reshape(B, T, H, E).astype(q_BTHE.dtype)


def gated_attention(params: Params, x_BTD, cfg: AttentionConfig, *, eps: float, cos_TR, sin_TR,
                    attend=causal_attention):
    """One gated attention layer on x [B, T, D] (params already in x's dtype) at the positions
    of cos/sin [T, R]; attend(q, k, v) -> o is the token-mixing step (a CP mode swaps it)."""
    q_BTHE, k_BTGE, v_BTGE, gate_BTX = project(params, x_BTD, cos_TR, sin_TR, cfg, eps)
    return output(params, attend(q_BTHE, k_BTGE, v_BTGE), gate_BTX)


def init_attention_params(cfg: AttentionConfig, hidden_size: int, key: jax.Array,
                          std: float = 0.02) -> Params:
    """Fresh float32 parameters: linears N(0, std), biases and zero-centred norms 0."""
    H, G, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    shapes = {"q_proj": (2 * H * E, hidden_size), "k_proj": (G * E, hidden_size),
              "v_proj": (G * E, hidden_size), "o_proj": (hidden_size, H * E)}
    params: Params = {}
    for k, (name, shape) in zip(jax.random.split(key, 4), shapes.items()):
        params[name] = {"weight": std * jax.random.normal(k, shape, jnp.float32)}
        if cfg.attention_bias:
            params[name]["bias"] = jnp.zeros((shape[0],), jnp.float32)
    params["q_norm"] = {"weight": jnp.zeros((E,), jnp.float32)}
    params["k_norm"] = {"weight": jnp.zeros((E,), jnp.float32)}
    return params
