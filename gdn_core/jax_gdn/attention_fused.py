"""The library kernels behind `kernels="fused"` as PairKernels (attention_pairs.py): XLA's
jax.nn.dot_product_attention (CPU), cuDNN flash attention (GPU), splash attention (TPU).

Each returns float32 log-sum-exp statistics from its forward and takes the merged ones in its
backward (attention_pairs' docstring: why). Written against jax 0.10.2:
    xla     the public jax.nn.dot_product_attention; its residual is log Σ exp(q·kᵀ·scale)
            [B, T, N] in natural log, but in the input dtype and under stop_gradient.
    cudnn   the primitives behind jax.nn.dot_product_attention(implementation="cudnn")
            (jax._src.cudnn.fused_attention_stablehlo): the public call casts cuDNN's float32
            statistics to the input dtype and its backward recomputes nothing it could be
            given, while the backward primitive takes the statistics (`activation`) and the
            output whose rowsum(o·do) it needs — the merged ones here. Needs bf16/fp16.
    splash  jax.experimental.pallas.ops.tpu.splash_attention built with save_residuals=True
            (float32 log-sum-exp [H, T]); its backward function fed the merged o and lse.
            No scale argument: queries are scaled by 1/√E first (dq scaled back). On a CPU
            it runs through Pallas's interpreter (splash_kernel(interpret=True), under
            GDN_SWEEP_INTERPRET_KERNELS=1: a correctness path). Its blocks are multiples of
            128 tokens (splash raises below that, interpreted too), so a segment must be one
            (SPLASH_SEGMENT_MULTIPLE); any head_dim runs interpreted (8 and 16 checked).
kernels.py checks what each can serve before a step is built (KernelUnavailable).
Packed documents (a pair's `docs`, attention_pairs.PairDocs): xla takes the pair's
block-diagonal causal mask ([s, s'] bool, beside the [s, s'] scores it materializes anyway;
rows no key reaches come back as o 0, lse MASKED); cudnn and splash as bound here take no
mask, so they raise KernelUnavailable under documents (never a silent fallback).
Legend: B batch, s segment tokens, H query heads, G KV heads, E head_dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ..kernels import KernelUnavailable
from .attention import MASKED, _scores, _tile_grads, from_query_tiles, query_tiles, tile_delta
from .attention_pairs import PairDocs, PairKernel

# ---- one tile as large as the sequence: the dense statistics and gradients -------------------

def _one_tile(x_BTHE, G: int):
    return query_tiles(x_BTHE, G, x_BTHE.shape[1])[0]


def _dense_positions(T: int, causal: bool, docs: PairDocs | None):
    """(q_pos, k_pos, q_start) for _scores: the pair's documents, causal, or no mask."""
    if docs is not None:
        return docs.q_pos, docs.k_pos, docs.q_start
    pos = jnp.arange(T, dtype=jnp.int32) if causal else None
    return pos, pos, None


def dense_log_sum_exp(q_BTHE, k_BTGE, *, causal: bool, docs: PairDocs | None = None):
    """log Σ_j exp(q_i·k_j / √E) over the keys query i sees (causal: j ≤ i, else all; docs:
    the pair's packed documents), float32 [B, T, H]: the statistic
    jax.nn.dot_product_attention's xla implementation computes in float32 but returns rounded
    to the input dtype."""
    T, G = q_BTHE.shape[1], k_BTGE.shape[2]
    s, _ = _scores(_one_tile(q_BTHE, G), k_BTGE, *_dense_positions(T, causal, docs))
    return from_query_tiles(jax.nn.logsumexp(s, axis=-1)[None, ..., None], T)[..., 0]


def dense_grads(q_BTHE, k_BTGE, v_BTGE, o_BTHE, lse_BTH, do_BTHE, *, causal: bool,
                docs: PairDocs | None = None):
    """(dq [B, T, H, E], dk, dv [B, T, G, E]) float32 of attention over T keys (causal or
    all) given its output o and log-sum-exp lse [B, T, H] (FlashAttention-2's backward on one
    tile: probabilities exp(q·kᵀ/√E − lse), correction rowsum(o·do))."""
    T, G = q_BTHE.shape[1], k_BTGE.shape[2]
    q, do, o = (_one_tile(x.astype(q_BTHE.dtype), G) for x in (q_BTHE, do_BTHE, o_BTHE))
    lse = _one_tile(lse_BTH[..., None], G)[..., 0]
    dq, dk, dv = _tile_grads(q, k_BTGE, v_BTGE, do, lse, tile_delta(o, do),
                             *_dense_positions(T, causal, docs))
    return from_query_tiles(dq[None], T), dk, dv


# ---- xla (CPU): the public call's o, float32 statistics -----------------------------------


def _xla_forward(q_BsHE, k_BsGE, v_BsGE, causal: bool, docs: PairDocs | None = None):
    if docs is None:
        o_BsHE, lse_BsH = jax.nn.dot_product_attention(
            q_BsHE, k_BsGE, v_BsGE, is_causal=causal, implementation="xla",
            return_residual=True)
        if lse_BsH.dtype != jnp.float32:  # rounded to bf16/fp16 by jax: ~0.03 off at lse ≈ 10
            lse_BsH = dense_log_sum_exp(q_BsHE, k_BsGE, causal=causal)
        return o_BsHE, lse_BsH
    mask_ss = docs.mask()
    o_BsHE, lse_BsH = jax.nn.dot_product_attention(
        q_BsHE, k_BsGE, v_BsGE, mask=mask_ss[None, None], implementation="xla",
        return_residual=True)
    if lse_BsH.dtype != jnp.float32:
        lse_BsH = dense_log_sum_exp(q_BsHE, k_BsGE, causal=False, docs=docs)
    seen_s = mask_ss.any(-1)[None, :, None]  # a query no key of this pair reaches
    return (jnp.where(seen_s[..., None], o_BsHE, 0).astype(o_BsHE.dtype),
            jnp.where(seen_s, lse_BsH.astype(jnp.float32), MASKED))


def _xla_backward(q_BsHE, k_BsGE, v_BsGE, o_BsHE, lse_BsH, do_BsHE, causal: bool,
                  docs: PairDocs | None = None):
    return dense_grads(q_BsHE, k_BsGE, v_BsGE, o_BsHE, lse_BsH, do_BsHE, causal=causal,
                       docs=docs)


def xla_kernel() -> PairKernel:
    """jax.nn.dot_product_attention(implementation="xla") forward; backward the dense
    FlashAttention-2 formula (attention.dense_grads: the scores the xla implementation
    materializes too) fed the merged statistics."""
    return PairKernel(_xla_forward, _xla_backward, documents=True)


# ---- cudnn (GPU): the primitives, float32 statistics both ways -----------------------------

CUDNN_BIND_CHECKED = ("0.10.2", "0.11.0", "0.11.1.dev (main, 2026-08-08)")
"""jax versions whose jax/_src/cudnn/fused_attention_stablehlo.py this bind was read against:
the same two primitives with the same operands and parameters (CUDNN_*_PARAMS),
check_is_flash_attention(query, key, value, layout, cudnn_version, has_bias, is_training, …),
check_cudnn_version(), MaskType and AttentionLayout (0.10.2 and 0.11.0 are identical; main
changed only batching rules and the public call's dbias). 0.11.2, which the GPU machines run,
was not readable here: kernels.py lowers the primitives before a step is built
(lower_cudnn_pair) and tests compare these names with the installed primitives."""
CUDNN_FORWARD_PARAMS = ("scale", "seed", "dropout_rate", "variadic_args", "mask_type", "layout",
                        "sliding_window_length", "is_training")
CUDNN_BACKWARD_PARAMS = CUDNN_FORWARD_PARAMS[:-1]
CUDNN_UNUSED_OPERANDS = ("bias", "q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets",
                         "page_table_k", "page_table_v")
"""The operands between (query, key, value) and the backward's (activation, fwd_output,
grad_output) that this bind leaves empty."""


def _cudnn():
    from jax._src.cudnn import fused_attention_stablehlo

    return fused_attention_stablehlo


def _cudnn_call(q_BsHE, causal: bool):
    """(module, the arguments and parameters every cuDNN primitive call shares)."""
    cudnn = _cudnn()
    unused = jnp.zeros(0, dtype=q_BsHE.dtype)  # no bias, seqlens, offsets or page tables
    params = dict(scale=float(q_BsHE.shape[-1]) ** -0.5, seed=42, dropout_rate=0.0,
                  variadic_args=(False, False),
                  mask_type=cudnn.MaskType.CAUSAL if causal else cudnn.MaskType.NO_MASK,
                  layout=cudnn.AttentionLayout.BTNH.value, sliding_window_length=None)
    return cudnn, (unused,) * len(CUDNN_UNUSED_OPERANDS), params


def _no_documents(kernel: str, docs) -> None:
    if docs is not None:
        raise KernelUnavailable(
            f"{kernel} attention as bound here takes no mask, so it cannot serve packed "
            "documents (cu_seqlens); run kernels='reference' (or 'fused' on a CPU without "
            "GDN_SWEEP_INTERPRET_KERNELS=1: xla)")


def cudnn_bind_forward(q_BsHE, k_BsGE, v_BsGE, causal: bool):
    """The forward primitive alone: (o [B, s, H, E], lse [B, s, H] float32), no device checks
    (it lowers for "cuda" on any host: lower_cudnn_pair)."""
    cudnn, unused, params = _cudnn_call(q_BsHE, causal)
    o_BsHE, stats_BHs = cudnn._dot_product_attention_fwd_p_wrapper.bind(
        q_BsHE, k_BsGE, v_BsGE, *unused, **params, is_training=True)
    return o_BsHE, jnp.transpose(stats_BHs, (0, 2, 1)).astype(jnp.float32)


def cudnn_bind_backward(q_BsHE, k_BsGE, v_BsGE, o_BsHE, lse_BsH, do_BsHE, causal: bool):
    """The backward primitive alone, fed (o, lse): (dq, dk, dv) float32."""
    cudnn, unused, params = _cudnn_call(q_BsHE, causal)
    dq, dk, dv = cudnn._dot_product_attention_bwd_p_wrapper.bind(
        q_BsHE, k_BsGE, v_BsGE, *unused, jnp.transpose(lse_BsH, (0, 2, 1)).astype(jnp.float32),
        o_BsHE.astype(q_BsHE.dtype), do_BsHE.astype(q_BsHE.dtype), **params)[:3]
    return dq.astype(jnp.float32), dk.astype(jnp.float32), dv.astype(jnp.float32)


def _cudnn_forward(q_BsHE, k_BsGE, v_BsGE, causal: bool, docs=None):
    _no_documents("cuDNN", docs)
    cudnn, _, params = _cudnn_call(q_BsHE, causal)
    # What jax's own call checks on the device it runs on (cuDNN version, head dim for the
    # GPU's compute capability): raises there rather than failing inside cuDNN.
    cudnn.check_is_flash_attention(q_BsHE, k_BsGE, v_BsGE, params["layout"],
                                   cudnn.check_cudnn_version(), False, True)
    return cudnn_bind_forward(q_BsHE, k_BsGE, v_BsGE, causal)


def _cudnn_backward(q_BsHE, k_BsGE, v_BsGE, o_BsHE, lse_BsH, do_BsHE, causal: bool,
                    docs=None):
    _no_documents("cuDNN", docs)
    return cudnn_bind_backward(q_BsHE, k_BsGE, v_BsGE, o_BsHE, lse_BsH, do_BsHE, causal)


def cudnn_kernel() -> PairKernel:
    return PairKernel(_cudnn_forward, _cudnn_backward)


def lower_cudnn_pair(platform: str = "cuda", *, B: int = 1, s: int = 128, H: int = 2,
                     G: int = 1, E: int = 64):
    """jax.Lowered of one causal pair's forward and backward primitives (bf16 [B, s, H|G, E])
    for `platform`: the installed jax's abstract evaluation and cuDNN lowering accept exactly
    what this module binds. Runs on any host (no cuDNN library needed to lower; compiling
    needs a GPU). Raises what jax raises when the bind no longer fits its primitives."""
    def pair(q, k, v, do):
        o, lse = cudnn_bind_forward(q, k, v, True)
        return o, lse, cudnn_bind_backward(q, k, v, o, lse, do, True)

    q = jax.ShapeDtypeStruct((B, s, H, E), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B, s, G, E), jnp.bfloat16)
    return jax.jit(pair).trace(q, kv, kv, q).lower(lowering_platforms=(platform,))


# ---- splash (TPU) --------------------------------------------------------------------------

SPLASH_BLOCK = 512
"""Largest splash block edge; blocks are multiples of 128 (TPU lanes) dividing the segment."""
SPLASH_SEGMENT_MULTIPLE = 128
"""Splash's kv compute block must be a multiple of 128 (it raises otherwise, interpreted too):
the segments it serves are multiples of this."""


def splash_block(s: int) -> int:
    """The largest multiple of 128 ≤ SPLASH_BLOCK dividing s; KernelUnavailable for an s
    that is no multiple of 128 (kernels.py refuses such segments before a step is built)."""
    if s <= 0 or s % SPLASH_SEGMENT_MULTIPLE:
        raise KernelUnavailable(f"splash attention needs segments of a multiple of "
                                f"{SPLASH_SEGMENT_MULTIPLE} tokens (its blocks, <= "
                                f"{SPLASH_BLOCK}, divide them), got segment_len={s}")
    return max(b for b in range(128, SPLASH_BLOCK + 1, 128) if s % b == 0)


@functools.lru_cache(maxsize=64)
def _splash(num_heads: int, s: int, causal: bool, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    b = splash_block(s)
    mask = (splash.CausalMask if causal else splash.FullMask)((s, s))
    blocks = splash.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                               block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b,
                               block_kv_dq=b)
    # The kernel is built the first time a trace asks for it and cached: its mask tables
    # (jnp.array of numpy) must be concrete, not tracers of that trace, or the next trace
    # (the backward's, another layer's) finds a leaked tracer.
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(splash.MultiHeadMask([mask] * num_heads),
                                      block_sizes=blocks, head_shards=1, q_seq_shards=1,
                                      save_residuals=True, interpret=interpret)


def _heads_first(x_BsXE):
    return jnp.transpose(x_BsXE, (0, 2, 1, 3))


def _splash_inputs(q_BsHE, k_BsGE, v_BsGE):
    scale = q_BsHE.shape[-1] ** -0.5
    return (_heads_first(q_BsHE * jnp.asarray(scale, q_BsHE.dtype)), _heads_first(k_BsGE),
            _heads_first(v_BsGE)), scale


def _splash_forward(interpret: bool, q_BsHE, k_BsGE, v_BsGE, causal: bool, docs=None):
    _no_documents("splash", docs)
    kernel = _splash(q_BsHE.shape[2], q_BsHE.shape[1], causal, interpret)
    (q, k, v), _ = _splash_inputs(q_BsHE, k_BsGE, v_BsGE)
    o_BHsE, (lse_BHs,) = jax.vmap(kernel)(q, k, v)
    return _heads_first(o_BHsE), jnp.transpose(lse_BHs, (0, 2, 1)).astype(jnp.float32)


def _collapsed(mask_info):
    """As splash's own call does before its custom VJP: partial mask blocks as one axis."""
    if mask_info is None or mask_info.partial_mask_blocks is None:
        return mask_info
    blocks = mask_info.partial_mask_blocks
    return mask_info._replace(partial_mask_blocks=blocks.reshape(-1, *blocks.shape[-2:]))


def _splash_backward(interpret: bool, q_BsHE, k_BsGE, v_BsGE, o_BsHE, lse_BsH, do_BsHE,
                     causal: bool, docs=None):
    _no_documents("splash", docs)
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    kernel = _splash(q_BsHE.shape[2], q_BsHE.shape[1], causal, interpret)
    (q, k, v), scale = _splash_inputs(q_BsHE, k_BsGE, v_BsGE)
    kw = kernel.kwargs
    static = (kw["save_residuals"], kw["mask_value"], kw["is_mqa"], kw["block_sizes"],
              kw["residual_checkpoint_name"], kw["mask_function"], kw["attn_logits_soft_cap"],
              kw["interpret"])
    masks = (_collapsed(kernel.dq_mask_info), _collapsed(kernel.dkv_mask_info))

    def one_sequence(q, k, v, o, lse, do):
        grads = sk._splash_attention_bwd(*static, (q, k, v, None, None, o, lse, *masks), do)
        return grads[3:6]

    o, do = _heads_first(o_BsHE.astype(q_BsHE.dtype)), _heads_first(do_BsHE.astype(q_BsHE.dtype))
    dq, dk, dv = jax.vmap(one_sequence)(q, k, v, o, jnp.transpose(lse_BsH, (0, 2, 1)), do)
    return (_heads_first(dq).astype(jnp.float32) * scale, _heads_first(dk).astype(jnp.float32),
            _heads_first(dv).astype(jnp.float32))


def splash_kernel(interpret: bool = False) -> PairKernel:
    """Splash attention pairs; interpret: through Pallas's interpreter (runs on any backend,
    a CPU's included: a correctness path, never a speed)."""
    return PairKernel(functools.partial(_splash_forward, interpret),
                      functools.partial(_splash_backward, interpret))
