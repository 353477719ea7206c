"""The gated delta rule as a Pallas kernel with the state in and out: the public call.

    chunk_gated_delta_rule_pallas(q, k, v, g, beta, *, initial_state=None,
        output_final_state=False, use_qk_l2norm=False, chunk_size=64, cu_seqlens=None,
        doc_starts=None, platform=None, interpret=False) -> (o, final_state | None)

fla's signature family and layout ([B, T, H, D], g in log space), so it composes with every CP
mode through state in / state out (cp/kernel_rule.py). Outside the kernel, in XLA (autodiff
carries their gradients): padding, the chunk-local cumulative log decay G (restarting at each
document start), the per-token rows and the [B, H, T, D] layout. Inside (chunk_kernels.py on
TPU, gpu_kernels.py on GPU): everything per chunk, l2norm of q, k included; forward and
backward are Pallas kernels joined by a jax.custom_vjp whose residuals are the inputs and the
state entering each chunk ([B, Hv, N, Dk, Dv] float32; on GPU also w, [B, Hv, T, Dk]).

T not a multiple of chunk_size is PADDED (zero keys, values, β and log decay: the padded tokens
change neither the state nor the real tokens' outputs) and the output cut back to T.
Packed documents: cu_seqlens (global boundaries, as chunk_gated_delta_rule) or doc_starts
(bool [T] or [B, T]: tokens whose entering state is zero; token 0 may be one, which a CP
segment that begins a document needs), not both.
platform: 'tpu' (Mosaic) or 'gpu' (Triton); None takes jax.default_backend()'s ('cuda'/'rocm'
→ 'gpu'). On a CPU only interpret=True runs it (Pallas's interpreter, either
parameterisation; 'tpu' when None).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ...kernels import JAX_PALLAS_GDN
from ...shapes import check_rule_args
from ..documents import check_cu_seqlens, document_starts
from .blocks import PLATFORMS, BlockPlan, block_plan
from .chunk_kernels import backward_call, forward_call
from .chunk_math import F32

KERNEL_NAME = JAX_PALLAS_GDN
"""What a result records for this kernel, with the platform: '… (tpu)', '… (gpu)' (one name,
gdn_core.kernels owns it)."""


class RuleConfig(NamedTuple):
    """The static part of a call (hashable: custom_vjp's non-differentiable argument)."""

    plan: BlockPlan
    use_qk_l2norm: bool
    low: object  # dtype of the output-only dots' operands
    interpret: bool

    @property
    def rule(self):
        return dict(use_qk_l2norm=self.use_qk_l2norm, low=self.low)


def resolve_platform(platform: str | None, interpret: bool) -> str:
    """The kernel parameterisation to run: `platform`, or the default backend's."""
    if platform is None:
        backend = jax.default_backend()
        platform = {"tpu": "tpu", "cuda": "gpu", "rocm": "gpu", "gpu": "gpu"}.get(backend)
        if platform is None:
            if not interpret:
                raise ValueError(f"the Pallas chunk rule has no kernel for backend {backend!r}; "
                                 "run it with interpret=True (Pallas's interpreter) or on a "
                                 "TPU or GPU")
            platform = "tpu"
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r} is not one of: {', '.join(PLATFORMS)}")
    return platform


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _rule(config: RuleConfig, q, k, v, G, beta, seg, h0):
    o, final, _ = forward_call(config.plan, q, k, v, G, beta, seg, h0, store_states=False,
                               rule=config.rule, interpret=config.interpret)
    return o, final


def _rule_fwd(config, q, k, v, G, beta, seg, h0):
    o, final, states = forward_call(config.plan, q, k, v, G, beta, seg, h0, store_states=True,
                                    rule=config.rule, interpret=config.interpret)
    return (o, final), (q, k, v, G, beta, seg, states)


def _rule_bwd(config, residuals, cotangents):
    q, k, v, G, beta, seg, states = residuals
    do, dfinal = cotangents
    dq, dk, dv, dG, dbeta, dh0 = backward_call(
        config.plan, q, k, v, G, beta, seg, states, do, dfinal.astype(F32), rule=config.rule,
        interpret=config.interpret)
    B, Hk, T, K = q.shape
    group = v.shape[1] // Hk

    def per_key_head(x):  # [B, H, T, K] → [B, Hk, T, K]: a key head's value heads summed
        return x.reshape(B, Hk, group, T, K).sum(axis=2)

    return (per_key_head(dq).astype(q.dtype), per_key_head(dk).astype(k.dtype),
            dv.astype(v.dtype), dG, dbeta, None if seg is None else jnp.zeros_like(seg), dh0)


_rule.defvjp(_rule_fwd, _rule_bwd)


def _starts_BT(B, T, cu_seqlens, doc_starts):
    """bool [1 or B, T] document starts, or None."""
    if cu_seqlens is not None and doc_starts is not None:
        raise ValueError("give packed documents as cu_seqlens or as doc_starts, not both")
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=T)
        return document_starts(cu_seqlens, jnp.arange(T))[None]
    if doc_starts is None:
        return None
    starts = jnp.asarray(doc_starts, bool)
    starts = starts[None] if starts.ndim == 1 else starts
    if starts.ndim != 2 or starts.shape[1] != T or starts.shape[0] not in (1, B):
        raise ValueError(f"doc_starts {tuple(jnp.shape(doc_starts))} must be [T={T}] or "
                         f"[B={B}, T={T}]")
    return starts


def chunk_local_decay(g_BHNC, starts_BNC=None):
    """G: the cumulative sum of g inside each chunk, restarting at each document start
    (G_i = Σ g_j over j ≤ i in i's chunk and document); float32."""
    cs = jnp.cumsum(g_BHNC.astype(F32), axis=-1)
    if starts_BNC is None:
        return cs
    C = g_BHNC.shape[-1]
    pos = jnp.arange(C)
    last_start = jax.lax.cummax(jnp.where(starts_BNC, pos, -1), axis=starts_BNC.ndim - 1)
    before = cs - g_BHNC.astype(F32)  # exclusive sums: the total before token i
    base = jnp.take_along_axis(before, jnp.maximum(last_start, 0)[:, None], axis=-1)
    return cs - jnp.where(last_start[:, None] >= 0, base, 0.0)


def chunk_gated_delta_rule_pallas(q, k, v, g, beta, *, initial_state=None,
                                  output_final_state=False, use_qk_l2norm=False, chunk_size=64,
                                  cu_seqlens=None, doc_starts=None, platform=None,
                                  interpret=False):
    """Gated delta rule through the Pallas chunk kernel; jit-, grad- and export-able.

    Args: as gdn_core.jax_gdn.chunk.chunk_gated_delta_rule — q, k [B, T, Hk, Dk], v [B, T, Hv,
        Dv], g (log decay) and beta [B, T, Hv], initial_state [B, Hv, Dk, Dv] or None — plus
        doc_starts, platform and interpret (module docstring). bf16 or float32 inputs; the
        state and every dot feeding it float32.
    Returns: o [B, T, Hv, Dv] in q's dtype, and the float32 final state if asked.
    """
    B, T, Hk, Hv, Dk, Dv = check_rule_args(
        q.shape, k.shape, v.shape, g.shape, beta.shape,
        None if initial_state is None else initial_state.shape, chunk_size)
    starts = _starts_BT(B, T, cu_seqlens, doc_starts)
    h0 = (jnp.zeros((B, Hv, Dk, Dv), F32) if initial_state is None
          else initial_state.astype(F32))
    if T == 0:
        return jnp.zeros((B, 0, Hv, Dv), q.dtype), (h0 if output_final_state else None)
    platform = resolve_platform(platform, interpret)
    C = chunk_size
    pad = (-T) % C
    N = (T + pad) // C

    def heads_major(x):  # [B, T, H, D] → [B, H, N·C, D], zero-padded
        return jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    def rows(x):  # [B, T, H] → [B, H, N, 1, C] float32, zero-padded
        x = jnp.pad(x.astype(F32), ((0, 0), (0, pad), (0, 0)))
        return x.transpose(0, 2, 1).reshape(B, Hv, N, 1, C)

    seg = starts_BNC = None
    if starts is not None:
        starts_BNC = jnp.broadcast_to(jnp.pad(starts, ((0, 0), (0, pad))).reshape(-1, N, C),
                                      (B, N, C))
        seg = jnp.cumsum(starts_BNC.astype(F32), axis=-1)[:, :, None, :]
    G = chunk_local_decay(rows(g)[:, :, :, 0], starts_BNC)[:, :, :, None, :]
    low = q.dtype if q.dtype in (jnp.bfloat16, jnp.float16) else F32
    config = RuleConfig(block_plan(platform, C), bool(use_qk_l2norm), low, bool(interpret))
    o_BHTV, final = _rule(config, heads_major(q), heads_major(k), heads_major(v), G,
                          rows(beta), seg, h0)
    o = o_BHTV.transpose(0, 2, 1, 3)[:, :T]
    return o, (final if output_final_state else None)
