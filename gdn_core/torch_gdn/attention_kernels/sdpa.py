"""The fused attention kernel, `sdpa`: ONE call of torch's SDPA flash op per segment pair.

    cpu   aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
          *, attn_mask, scale) -> (output, logsumexp) and its _backward(grad_out, q, k, v,
          out, logsumexp, dropout_p, is_causal, *, attn_mask, scale) -> (dq, dk, dv)
    cuda  aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal,
          return_debug_mask, *, scale) -> (output, logsumexp, cum_seq_q, cum_seq_k, max_q,
          max_k, philox_seed, philox_offset, debug_attn_mask) and its _backward(grad_out, q, k,
          v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
          philox_seed, philox_offset, *, scale) -> (dq, dk, dv)

Both take [B, heads, tokens, E] with the last dim contiguous, GQA as given (key/value heads G
dividing the query heads H, head h reading h // (H/G): checked on CPU against tiles, and
flash's dense GQA on CUDA), and return the log-sum-exp float32 [B, H, s] in natural log (checked
on CPU: logsumexp(S·scale) to 2e-7). The backward reads the output and log-sum-exp it is given
(the final merged ones: P = exp(S·scale − lse), Δ = rowsum(dO ∘ O)), which must be in q's
dtype and (CUDA, as torch's own ring attention notes) contiguous. No dropout, so the CUDA
backward never reads philox_seed / philox_offset; dense inputs have no cum_seq (None).
The scale is always passed explicitly. q, k, v, dO are in the step's dtype: the op computes in
it with float32 statistics (bf16 operands, float32 accumulation and log-sum-exp).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

aten = torch.ops.aten
CUDA_FLASH_DTYPES = (torch.float16, torch.bfloat16)
CUDA_FLASH_MAX_HEAD_DIM = 256


def cuda_flash_refusal(*, dtype: torch.dtype, head_dim: int, capability: tuple[int, int],
                       built: bool = True) -> str | None:
    """Why CUDA's flash op cannot serve attention in `dtype` with this head_dim on a GPU of
    compute `capability`, or None when it can (torch's sdp_utils.cpp can_use_flash_attention
    gates, for training)."""
    major, minor = capability
    if not built:
        return "this torch build has no CUDA flash attention"
    if capability < (8, 0):
        return f"flash attention needs sm80 or newer; this GPU is sm{major}{minor}"
    if dtype not in CUDA_FLASH_DTYPES:
        return (f"flash attention on CUDA computes in float16 or bfloat16, not {dtype}; run "
                "the point in bfloat16, or with kernels='reference'")
    if head_dim > CUDA_FLASH_MAX_HEAD_DIM or head_dim % 8:
        return (f"flash attention on CUDA needs head_dim <= {CUDA_FLASH_MAX_HEAD_DIM} and a "
                f"multiple of 8 (SDPA pads to 8 before calling it), got {head_dim}")
    if capability in ((8, 6), (8, 7), (8, 8), (8, 9), (12, 0), (12, 1)) and 192 < head_dim <= 224:
        return (f"flash attention cannot train head_dim in (192, 224] on sm{major}{minor}, "
                f"got {head_dim}")
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class SdpaKernel:
    """The fused kernel (module docstring)."""

    name: ClassVar[str] = "sdpa"

    def forward(self, q_BHsE, k_BGsE, v_BGsE, *, causal: bool, scale: float):
        """(o [B, H, s, E] in q's dtype, lse [B, H, s] float32) of one pair: one fused call."""
        if q_BHsE.device.type == "cuda":
            o, lse, *_ = aten._scaled_dot_product_flash_attention(
                q_BHsE, k_BGsE, v_BGsE, 0.0, causal, False, scale=scale)
        else:
            o, lse = aten._scaled_dot_product_flash_attention_for_cpu(
                q_BHsE, k_BGsE, v_BGsE, 0.0, causal, scale=scale)
        return o, lse[..., :q_BHsE.shape[2]]

    def backward(self, do_BHsE, q_BHsE, k_BGsE, v_BGsE, o_BHsE, lse_BHs, *, causal: bool,
                 scale: float):
        """(dq [B, H, s, E], dk, dv [B, G, s', E]) in q's dtype, from the final o and lse."""
        dtype = q_BHsE.dtype
        do, o = do_BHsE.to(dtype).contiguous(), o_BHsE.to(dtype).contiguous()
        lse = lse_BHs.float().contiguous()
        if q_BHsE.device.type == "cuda":
            unread = torch.empty((), dtype=torch.int64, device=q_BHsE.device)  # no dropout
            return aten._scaled_dot_product_flash_attention_backward(
                do, q_BHsE, k_BGsE, v_BGsE, o, lse, None, None, q_BHsE.shape[2],
                k_BGsE.shape[2], 0.0, causal, unread, unread, scale=scale)
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do, q_BHsE, k_BGsE, v_BGsE, o, lse, 0.0, causal, scale=scale)
