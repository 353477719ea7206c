"""Functional Gated DeltaNet layer (transformers' Qwen3_5GatedDeltaNet math), in small pieces.

    mixed = in_proj_qkv(x) ─ causal depthwise conv (K taps) ─ SiLU ─ split q | k | v
    beta = σ(in_proj_b(x)),   g = −e^{A_log} · softplus(in_proj_a(x) + dt_bias)   (float32)
    o = rule(q, k, v, g, beta, use_qk_l2norm=True)
    y = out_proj( RMSNorm_Dv(o) · norm.weight · SiLU(in_proj_z(x)) )

The pieces (project, causal_conv, split_heads, run_rule, output) are public so that a
context-parallel layer can reuse them: it swaps the rule for a CP rule and feeds causal_conv
the previous shard's last K−1 pre-conv tokens (`halo_fn`), without copying any math.

Legend (this file): B batch, T tokens, D hidden, C conv channels (2·Hk·Dk + Hv·Dv),
G key heads, H value heads, K key head dim (halo_BKC: K−1 halo tokens), V value dim.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ..config import GDNConfig
from .chunk import chunk_gated_delta_rule
from .documents import check_cu_seqlens, tokens_since_start
from .linear import linear
from .params import Params, cast_floating

GDN_PROJECTIONS = "gdn_projections"
GDN_OUTPUT = "gdn_output"
"""checkpoint_name tags of what surrounds the GDN core (conv, gates, rule): remat "gdn" saves
these and recomputes the core between them in backward."""

Rule = Callable[..., tuple[jax.Array, jax.Array | None]]
HaloFn = Callable[[jax.Array], jax.Array]


def project(params: Params, x_BTD):
    """Input projections. Returns (mixed_BTC pre-conv, z_BTHV, b_BTH, a_BTH) in x's dtype."""
    B, T, _ = x_BTD.shape
    Dv = params["norm"]["weight"].shape[0]
    z_BTHV = linear(x_BTD, params["in_proj_z"]["weight"]).reshape(B, T, -1, Dv)
    outputs = (linear(x_BTD, params["in_proj_qkv"]["weight"]), z_BTHV,
               linear(x_BTD, params["in_proj_b"]["weight"]),
               linear(x_BTD, params["in_proj_a"]["weight"]))
    return tuple(checkpoint_name(y, GDN_PROJECTIONS) for y in outputs)


def conv_halo(mixed_BTC, kernel_size: int):
    """The last K−1 pre-conv tokens [B, K−1, C]: what the next sequence shard's conv needs."""
    return mixed_BTC[:, mixed_BTC.shape[1] - (kernel_size - 1):]


def causal_conv(conv_weight, mixed_BTC, halo_BKC=None, since_start_BT=None):
    """Depthwise causal conv + SiLU over time; returns [B, T, C] in mixed's dtype.

    conv_weight: torch Conv1d layout [C, 1, K]; out_t = Σ_j w[j] · x_{t−(K−1)+j}.
    halo_BKC: the K−1 pre-conv tokens before this sequence (zeros, i.e. left padding, if None).
    since_start_BT (int [T] or [B, T], documents.tokens_since_start; packed documents): token
    t sees x_{t−i} (halo included) only where i ≤ since_start[t].
    """
    C, _, K = conv_weight.shape
    B, T, _ = mixed_BTC.shape
    if halo_BKC is None:
        halo_BKC = jnp.zeros((B, K - 1, C), mixed_BTC.dtype)
    if halo_BKC.shape != (B, K - 1, C):
        raise ValueError(f"halo {halo_BKC.shape} must be [B, K-1, C] = {(B, K - 1, C)}")
    x_BSC = jnp.concatenate([halo_BKC.astype(mixed_BTC.dtype), mixed_BTC], axis=1)
    w_KC = conv_weight[:, 0, :].T.astype(jnp.float32)
    # K shifted multiply-adds, accumulated in float32 like a conv kernel would.
    if since_start_BT is None:
        out_BTC = sum(x_BSC[:, j:j + T].astype(jnp.float32) * w_KC[j] for j in range(K))
    else:  # tap j reads the token K−1−j before; masked where that is in an earlier document
        out_BTC = sum(jnp.where((since_start_BT >= K - 1 - j)[..., None],
                                x_BSC[:, j:j + T].astype(jnp.float32) * w_KC[j], 0.0)
                      for j in range(K))
    return jax.nn.silu(out_BTC.astype(mixed_BTC.dtype))


def split_heads(params: Params, conv_BTC, a_BTH, b_BTH, cfg: GDNConfig):
    """Split conv output into heads and form the gates.

    Returns q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] (conv dtype), g [B, T, Hv] float32 (≤ 0),
    beta [B, T, Hv] (b's dtype).
    """
    B, T, _ = conv_BTC.shape
    kd, vd = cfg.key_dim, cfg.value_dim
    q_BTGK = conv_BTC[..., :kd].reshape(B, T, cfg.num_k_heads, cfg.head_k_dim)
    k_BTGK = conv_BTC[..., kd:2 * kd].reshape(B, T, cfg.num_k_heads, cfg.head_k_dim)
    v_BTHV = conv_BTC[..., 2 * kd:2 * kd + vd].reshape(B, T, cfg.num_v_heads, cfg.head_v_dim)
    beta_BTH = jax.nn.sigmoid(b_BTH)
    A_H = jnp.exp(params["A_log"].astype(jnp.float32))
    g_BTH = -A_H * jax.nn.softplus(
        a_BTH.astype(jnp.float32) + params["dt_bias"].astype(jnp.float32))
    return q_BTGK, k_BTGK, v_BTHV, g_BTH, beta_BTH


def run_rule(q, k, v, g, beta, cfg: GDNConfig, rule: Rule = chunk_gated_delta_rule):
    """Call the gated delta rule as the layer does (q/k L2-normalised); returns o [B,T,Hv,Dv]."""
    o, _ = rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_size=cfg.chunk_size)
    return o


def output(params: Params, o_BTHV, z_BTHV, cfg: GDNConfig):
    """Gated RMSNorm over Dv, then out_proj; returns [B, T, D] in o's dtype."""
    dtype = o_BTHV.dtype
    o32 = o_BTHV.astype(jnp.float32)
    normed = o32 * jax.lax.rsqrt(jnp.mean(o32 * o32, axis=-1, keepdims=True) + cfg.rms_norm_eps)
    # As transformers: scale in the compute dtype, gate in float32, cast back.
    y_BTHV = params["norm"]["weight"].astype(dtype) * normed.astype(dtype)
    y_BTHV = (y_BTHV.astype(jnp.float32) * jax.nn.silu(z_BTHV.astype(jnp.float32))).astype(dtype)
    B, T = o_BTHV.shape[:2]
    return checkpoint_name(linear(y_BTHV.reshape(B, T, -1), params["out_proj"]["weight"]),
                           GDN_OUTPUT)


def gdn_layer(params: Params, x_BTD, cfg: GDNConfig, *, dtype=jnp.float32,
              rule: Rule = chunk_gated_delta_rule, halo_fn: HaloFn | None = None,
              cu_seqlens=None):
    """Run one GDN layer on x [B, T, D]; returns [B, T, D] in dtype.

    params and x are cast to dtype (the rule itself computes in float32).
    rule: any function of the rule signature family (a CP rule, the naive reference).
    halo_fn: maps this sequence's pre-conv mixed_BTC to the K−1 tokens before it (CP passes a
        halo exchange); None means the sequence starts here (zero left padding).
    cu_seqlens: None, or packed documents (int [N+1], 0 … T, all rows): each document mixed as
        if alone (conv taps and the state stop at each start); passed on to `rule`.
    """
    params = cast_floating(params, dtype)
    mixed_BTC, z_BTHV, b_BTH, a_BTH = project(params, x_BTD.astype(dtype))
    halo_BKC = None if halo_fn is None else halo_fn(mixed_BTC)
    since_T = None
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=x_BTD.shape[1])
        since_T = tokens_since_start(cu_seqlens, jnp.arange(x_BTD.shape[1]))
        rule = partial(rule, cu_seqlens=cu_seqlens)
    conv_BTC = causal_conv(params["conv1d"]["weight"], mixed_BTC, halo_BKC, since_T)
    q, k, v, g, beta = split_heads(params, conv_BTC, a_BTH, b_BTH, cfg)
    o_BTHV = run_rule(q, k, v, g, beta, cfg, rule)
    return output(params, o_BTHV, z_BTHV, cfg)
