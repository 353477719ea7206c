"""Functional GDN language model: embedding, num_layers × (GDN block, SwiGLU MLP block), LM head.

    x = embed[tokens];  for each layer: x += gdn(rmsnorm(x));  x += mlp(rmsnorm(x))
    logits = lm_head(rmsnorm(x));   mlp(x) = down(SiLU(gate(x)) · up(x))

The decoder runs under lax.scan over the stacked params["block"] (params.py): one scan step is
one repeat of the layer pattern's block, so the program's size does not grow with depth.
Activation recomputation (`remat`, TrainConfig.remat) is a jax.checkpoint policy on each
decoder layer. The loss never holds [tokens, vocab] logits: it scans over token chunks, each
chunk's logits recomputed in backward.

The hybrid decoder (params.is_hf_tree: transformers' names, ModelConfig.layers "hybrid") runs
the same way, each layer's mixer a GDN layer ("linear_attn") or gated attention ("self_attn",
attention.py) as its tree says, with zero-centred norms (1 + weight); the block positions of
params["block"] are the layer pattern's period, so GDN and attention layers stack separately.

Hooks, so a context-parallel run reuses this model unchanged: `gdn_layer_fn` replaces the GDN
layer; `attend_fn` the attention layers' token mixing (q, k, v → o), and `positions` gives the
tokens' global positions for the rotary embedding (a sequence shard's, cp_layout);
`fetch(name, tree, dtype)` turns stored weights into compute weights — by default a
cast, under FSDP a per-layer all-gather (named GATHERED_WEIGHTS, so no policy saves them:
backward gathers again). Names: "embed_tokens", "norm", "lm_head", "block.{p}" (one layer of
block position p, its stacking axis already sliced off).
Legend: B batch, T tokens, D hidden, F MLP width, V vocabulary, N tokens flattened, n per chunk.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from ..config import ModelConfig
from ..train_config import REMATS
from .attention import (
    causal_attention,
    gated_attention,
    rotary_cos_sin,
    zero_centered_rms_norm,
)
from .layer import GDN_OUTPUT, GDN_PROJECTIONS, gdn_layer
from .linear import linear
from .params import Params, cast_floating, is_hf_tree

GDNLayerFn = Callable[..., jax.Array]  # (params, x_BTD, cfg, *, dtype) -> [B, T, D]
AttendFn = Callable[..., jax.Array]  # (q_BTHE, k_BTGE, v_BTGE) -> o_BTHE
Fetch = Callable[[str, Params, jnp.dtype], Params]

LOSS_CHUNK_TOKENS = 1024
"""Tokens per cross-entropy chunk: 1024 × Qwen3.5's 248,320 vocab × 4 bytes = 1 GiB of logits."""
DECODER_NORM = "decoder_norm"
MLP_GATE_UP = "mlp_gate_up"
GATHERED_WEIGHTS = "gathered_weights"


def cast_fetch(name: str, tree: Params, dtype) -> Params:
    """The default fetch: the stored (float32 master) weights cast to the compute dtype."""
    del name
    return cast_floating(tree, dtype)


def _is_weight_gather(prim, params) -> bool:
    """Whether a value is a gathered weight: named GATHERED_WEIGHTS, or the output of the
    custom_vjp that gathers it (a body of all_gather and casts only; see cp.param_sharding)."""
    if prim.name == "name":
        return params["name"] == GATHERED_WEIGHTS
    body = params.get("call_jaxpr") if prim.name == "custom_vjp_call" else None
    ops = {eqn.primitive.name for eqn in body.jaxpr.eqns} if body is not None else set()
    return "all_gather" in ops and ops <= {"all_gather", "convert_element_type"}


def _save_all_but_gathered(prim, *_, **params) -> bool:
    # save_anything_except_these_names(GATHERED_WEIGHTS) would not do: it refuses the named
    # value but then saves its unnamed input, the gather's output, which is the same array.
    return not _is_weight_gather(prim, params)


def remat_policy(remat: str):
    """jax.checkpoint policy of one decoder layer for TrainConfig.remat.

    none: save everything but gathered weights; full: save nothing (the layer's input is kept
    by the scan); gdn: save the projections around the GDN core, the norms and the MLP's
    gate/up outputs, so only conv, gates and rule run again in backward.
    """
    policies = jax.checkpoint_policies
    if remat == "none":
        return _save_all_but_gathered
    if remat == "full":
        return policies.nothing_saveable
    if remat == "gdn":
        return policies.save_only_these_names(GDN_PROJECTIONS, GDN_OUTPUT, DECODER_NORM,
                                              MLP_GATE_UP)
    raise ValueError(f"remat={remat!r} is not one of: {', '.join(REMATS)}")


def rms_norm(weight_D, x_BTD, eps: float):
    """x · rsqrt(mean(x²) + eps) · weight, computed in float32, returned in x's dtype."""
    x32 = x_BTD.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return checkpoint_name((y * weight_D.astype(jnp.float32)).astype(x_BTD.dtype), DECODER_NORM)


def mlp(params: Params, x_BTD):
    """SwiGLU MLP: down(SiLU(gate(x)) · up(x)); [B, T, D] -> [B, T, D]."""
    gate_BTF = checkpoint_name(linear(x_BTD, params["gate_proj"]["weight"]), MLP_GATE_UP)
    up_BTF = checkpoint_name(linear(x_BTD, params["up_proj"]["weight"]), MLP_GATE_UP)
    return linear(jax.nn.silu(gate_BTF) * up_BTF, params["down_proj"]["weight"])


def decoder_layer(layer: Params, x_BTD, model_cfg: ModelConfig, *, dtype,
                  gdn_layer_fn: GDNLayerFn | None = None, cu_seqlens=None):
    """One decoder layer (compute-dtype weights, unstacked): x + gdn(norm x), then + mlp(norm x).
    cu_seqlens: None, or packed documents (GLOBAL boundaries), each mixed as if alone."""
    gdn_layer_fn = gdn_layer if gdn_layer_fn is None else gdn_layer_fn
    eps = model_cfg.gdn.rms_norm_eps
    x_BTD = x_BTD + gdn_layer_fn(layer["gdn"], rms_norm(layer["gdn_norm"]["weight"], x_BTD, eps),
                                 model_cfg.gdn, dtype=dtype, **_documents(cu_seqlens))
    return x_BTD + mlp(layer["mlp"], rms_norm(layer["mlp_norm"]["weight"], x_BTD, eps))


def hybrid_decoder_layer(layer: Params, x_BTD, model_cfg: ModelConfig, *, dtype, cos_TR, sin_TR,
                         gdn_layer_fn: GDNLayerFn | None = None,
                         attend_fn: AttendFn | None = None, cu_seqlens=None):
    """One hybrid decoder layer (compute-dtype weights, HF names): x + mixer(norm x), then
    + mlp(norm x); the mixer is GDN or gated attention as the layer's tree says. cu_seqlens:
    None, or packed documents (GLOBAL boundaries), each mixed as if alone by either mixer."""
    gdn_layer_fn = gdn_layer if gdn_layer_fn is None else gdn_layer_fn
    eps = model_cfg.gdn.rms_norm_eps
    normed_BTD = _zero_centered_norm(layer["input_layernorm"]["weight"], x_BTD, eps)
    if "linear_attn" in layer:
        x_BTD = x_BTD + gdn_layer_fn(layer["linear_attn"], normed_BTD, model_cfg.gdn,
                                     dtype=dtype, **_documents(cu_seqlens))
    else:
        x_BTD = x_BTD + gated_attention(
            layer["self_attn"], normed_BTD, model_cfg.attention, eps=eps, cos_TR=cos_TR,
            sin_TR=sin_TR, attend=causal_attention if attend_fn is None else attend_fn,
            cu_seqlens=cu_seqlens)
    return x_BTD + mlp(layer["mlp"],
                       _zero_centered_norm(layer["post_attention_layernorm"]["weight"], x_BTD, eps))


def _documents(cu_seqlens) -> dict:
    """A GDN layer's keyword for packed documents: none at all without them, so hooks that
    predate documents (a rule's test double) still fit."""
    return {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}


def _zero_centered_norm(weight_D, x_BTD, eps: float):
    return checkpoint_name(zero_centered_rms_norm(weight_D, x_BTD, eps), DECODER_NORM)


def hidden_states(params: Params, tokens_BT, model_cfg: ModelConfig, *, dtype=jnp.float32,
                  gdn_layer_fn: GDNLayerFn | None = None, fetch: Fetch = cast_fetch,
                  remat: str = "none", attend_fn: AttendFn | None = None, positions=None,
                  cu_seqlens=None):
    """Token ids [B, T] -> final normed hidden states [B, T, D] in dtype (the LM head's input).

    positions: the tokens' positions in the sequence [T] (default 0 … T−1), for the rotary
    embedding of attention layers; attend_fn: their token mixing (default causal_attention).
    cu_seqlens: None, or the packed documents of every row (int [N+1], GLOBAL boundaries:
    the same array on every CP chip): GDN and attention layers mix each document alone.
    """
    policy = remat_policy(remat)
    hybrid = is_hf_tree(params)
    # Rows are taken from the float32 table, so the embedding's gradient accumulates in float32.
    embed_VD = fetch("embed_tokens", params["embed_tokens"], jnp.float32)["weight"]
    x_BTD = jnp.take(embed_VD, tokens_BT, axis=0).astype(dtype)
    if hybrid and model_cfg.attention is not None:
        positions = jnp.arange(tokens_BT.shape[1]) if positions is None else positions
        cos_TR, sin_TR = rotary_cos_sin(positions, model_cfg.attention)
    else:
        cos_TR = sin_TR = None

    def layer_at(p):
        def run(stored_layer, x_BTD):
            layer = fetch(f"block.{p}", stored_layer, dtype)
            if hybrid:
                return hybrid_decoder_layer(layer, x_BTD, model_cfg, dtype=dtype, cos_TR=cos_TR,
                                            sin_TR=sin_TR, gdn_layer_fn=gdn_layer_fn,
                                            attend_fn=attend_fn, cu_seqlens=cu_seqlens)
            return decoder_layer(layer, x_BTD, model_cfg, dtype=dtype, gdn_layer_fn=gdn_layer_fn,
                                 cu_seqlens=cu_seqlens)
        return jax.checkpoint(run, policy=policy, prevent_cse=False)

    layers = [layer_at(p) for p in range(len(params["block"]))]

    def one_block(x_BTD, block_slice):
        for layer_fn, stored_layer in zip(layers, block_slice, strict=True):
            x_BTD = layer_fn(stored_layer, x_BTD)
        return x_BTD, None

    x_BTD, _ = lax.scan(one_block, x_BTD, params["block"])
    norm = fetch("norm", params["norm"], dtype)["weight"]
    if hybrid:
        return _zero_centered_norm(norm, x_BTD, model_cfg.gdn.rms_norm_eps)
    return rms_norm(norm, x_BTD, model_cfg.gdn.rms_norm_eps)


def lm_head_weight(params: Params, fetch: Fetch, dtype):
    """The LM head [V, D] (tied embeddings, no "lm_head" in the tree: the embedding)."""
    name = "lm_head" if "lm_head" in params else "embed_tokens"
    return fetch(name, params[name], dtype)["weight"]


def model_forward(params: Params, tokens_BT, model_cfg: ModelConfig, *, dtype=jnp.float32,
                  gdn_layer_fn: GDNLayerFn | None = None, fetch: Fetch = cast_fetch,
                  remat: str = "none", attend_fn: AttendFn | None = None, positions=None):
    """Token ids [B, T] (int) -> logits [B, T, V] float32 (bf16 matmul inputs under bf16)."""
    x_BTD = hidden_states(params, tokens_BT, model_cfg, dtype=dtype, gdn_layer_fn=gdn_layer_fn,
                          fetch=fetch, remat=remat, attend_fn=attend_fn, positions=positions)
    return linear(x_BTD, lm_head_weight(params, fetch, dtype), jnp.float32)


def token_losses(logits_BTV, targets_BT):
    """Per-token cross-entropy −log softmax(logits)[target] [B, T], float32."""
    logits = logits_BTV.astype(jnp.float32)
    target_BT = jnp.take_along_axis(logits, targets_BT[..., None].astype(jnp.int32), axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - target_BT[..., 0]


def token_loss_sum(logits_BTV, targets_BT):
    """Sum over tokens of the cross-entropy −log softmax(logits)[target], float32 scalar."""
    return jnp.sum(token_losses(logits_BTV, targets_BT))


def chunked_token_loss_sum(x_BTD, head_VD, targets_BT, *, chunk_tokens: int = LOSS_CHUNK_TOKENS):
    """token_loss_sum(linear(x, head), targets) without the [B·T, V] logits buffer.

    x_BTD: final hidden states (compute dtype); head_VD: float32 LM head, cast to x's dtype per
    chunk (its gradient accumulates over chunks in float32). A lax.scan over chunks of
    chunk_tokens tokens (the last padded and masked), each chunk's loss under jax.checkpoint:
    backward recomputes that chunk's logits instead of keeping them.
    """
    if not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens!r} must be a positive integer")
    B, T, D = x_BTD.shape
    N = B * T
    n = min(chunk_tokens, N)
    chunks = -(-N // n)
    pad = chunks * n - N
    x_CnD = jnp.pad(x_BTD.reshape(N, D), ((0, pad), (0, 0))).reshape(chunks, n, D)
    targets_Cn = jnp.pad(targets_BT.reshape(N), (0, pad)).reshape(chunks, n)
    mask_Cn = (jnp.arange(chunks * n) < N).reshape(chunks, n)

    @jax.checkpoint
    def chunk_loss(head_VD, x_nD, targets_n, mask_n):
        logits_nV = linear(x_nD, head_VD, jnp.float32)
        return jnp.sum(jnp.where(mask_n, token_losses(logits_nV, targets_n), 0.0))

    def step(total, chunk):
        return total + chunk_loss(head_VD, *chunk), None

    total, _ = lax.scan(step, jnp.zeros((), jnp.float32), (x_CnD, targets_Cn, mask_Cn))
    return total


def model_loss(params: Params, inputs_BT, targets_BT, model_cfg: ModelConfig, *,
               global_tokens: int, dtype=jnp.float32, gdn_layer_fn: GDNLayerFn | None = None,
               fetch: Fetch = cast_fetch, remat: str = "none",
               loss_chunk_tokens: int = LOSS_CHUNK_TOKENS, attend_fn: AttendFn | None = None,
               positions=None, cu_seqlens=None):
    """Token loss sum / global_tokens: the mean loss, and on a CP shard its share of it.

    global_tokens: B × T of the whole (unsharded) batch, so shards' losses sum to the mean.
    The loss is chunked_token_loss_sum (no [tokens, vocab] buffer); cu_seqlens: packed
    documents (hidden_states).
    """
    x_BTD = hidden_states(params, inputs_BT, model_cfg, dtype=dtype, gdn_layer_fn=gdn_layer_fn,
                          fetch=fetch, remat=remat, attend_fn=attend_fn, positions=positions,
                          cu_seqlens=cu_seqlens)
    head_VD = lm_head_weight(params, fetch, jnp.float32)
    return chunked_token_loss_sum(x_BTD, head_VD, targets_BT,
                                  chunk_tokens=loss_chunk_tokens) / global_tokens
