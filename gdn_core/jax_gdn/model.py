"""Functional GDN language model: embedding, num_layers × (GDN block, SwiGLU MLP block), LM head.

    x = embed[tokens];  for each layer: x += gdn(rmsnorm(x));  x += mlp(rmsnorm(x))
    logits = lm_head(rmsnorm(x)) in float32;   mlp(x) = down(SiLU(gate(x)) · up(x))

Parameters: see params.py (params["layers"] is a list). The GDN layer is swappable
(`gdn_layer_fn`) so a context-parallel run substitutes its layer without another model.
Legend: B batch, T tokens, D hidden, F MLP width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from ..config import ModelConfig
from .layer import gdn_layer, linear
from .params import Params, cast_floating

GDNLayerFn = Callable[..., jax.Array]  # (params, x_BTD, cfg, *, dtype) -> [B, T, D]


def rms_norm(weight_D, x_BTD, eps: float):
    """x · rsqrt(mean(x²) + eps) · weight, computed in float32, returned in x's dtype."""
    x32 = x_BTD.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight_D.astype(jnp.float32)).astype(x_BTD.dtype)


def mlp(params: Params, x_BTD):
    """SwiGLU MLP: down(SiLU(gate(x)) · up(x)); [B, T, D] -> [B, T, D]."""
    h_BTF = jax.nn.silu(linear(x_BTD, params["gate_proj"]["weight"])) * linear(
        x_BTD, params["up_proj"]["weight"])
    return linear(h_BTF, params["down_proj"]["weight"])


def model_forward(params: Params, tokens_BT, model_cfg: ModelConfig, *, dtype=jnp.float32,
                  gdn_layer_fn: GDNLayerFn | None = None):
    """Token ids [B, T] (int) -> logits [B, T, V] float32; params and activations in dtype."""
    gdn_layer_fn = gdn_layer if gdn_layer_fn is None else gdn_layer_fn
    params = cast_floating(params, dtype)
    eps = model_cfg.gdn.rms_norm_eps
    x_BTD = jnp.take(params["embed_tokens"]["weight"], tokens_BT, axis=0)
    for layer in params["layers"]:
        x_BTD = x_BTD + gdn_layer_fn(
            layer["gdn"], rms_norm(layer["gdn_norm"]["weight"], x_BTD, eps), model_cfg.gdn,
            dtype=dtype)
        x_BTD = x_BTD + mlp(layer["mlp"], rms_norm(layer["mlp_norm"]["weight"], x_BTD, eps))
    x_BTD = rms_norm(params["norm"]["weight"], x_BTD, eps)
    return linear(x_BTD, params["lm_head"]["weight"]).astype(jnp.float32)


def token_loss_sum(logits_BTV, targets_BT):
    """Sum over tokens of the cross-entropy −log softmax(logits)[target], float32 scalar."""
    logits = logits_BTV.astype(jnp.float32)
    target_BT = jnp.take_along_axis(logits, targets_BT[..., None].astype(jnp.int32), axis=-1)
    return jnp.sum(jax.nn.logsumexp(logits, axis=-1) - target_BT[..., 0])


def model_loss(params: Params, inputs_BT, targets_BT, model_cfg: ModelConfig, *,
               global_tokens: int, dtype=jnp.float32, gdn_layer_fn: GDNLayerFn | None = None):
    """Token loss sum / global_tokens: the mean loss, and on a CP shard its share of it.

    global_tokens: B × T of the whole (unsharded) batch, so shards' losses sum to the mean.
    """
    logits_BTV = model_forward(params, inputs_BT, model_cfg, dtype=dtype,
                               gdn_layer_fn=gdn_layer_fn)
    return token_loss_sum(logits_BTV, targets_BT) / global_tokens
