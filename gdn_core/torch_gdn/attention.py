"""Gated full attention in the Qwen3.5 / Qwen3-Next layout (weights interchangeable with
transformers' Qwen3_5Attention), and the pieces around it: the zero-centred RMSNorm and the
partial rotary embedding.

    x ─┬─ q_proj ─ per head [query | gate] ─ query: q_norm ─ rotary ─┐
       ├─ k_proj ─ k_norm ─ rotary ─────────────────────────────────┤ causal GQA softmax → o
       └─ v_proj ───────────────────────────────────────────────────┘
    o · sigmoid(gate) ─ o_proj

forward is project → attend → output, so that a context-parallel wrapper can swap `attend`
(the only step that mixes tokens) without copying the projections. Packed documents
(`cu_seqlens`, gdn_core.attention_documents) make attention block-diagonal causal; the rotary
positions stay global (positions in the packed sequence, as the published packed training
does), so only `attend` changes.
Shape legend: B batch, T tokens, D hidden, H query heads, G key/value heads, E head_dim,
R rotated channels (E · partial_rotary_factor).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention_documents import cu_seqlens_values, pieces
from ..config import AttentionConfig


class ZeroCenteredRMSNorm(nn.Module):
    """y = x · rsqrt(mean(x²) + eps) · (1 + weight), in fp32, returned in x's dtype.

    transformers' Qwen3_5RMSNorm / Qwen3NextRMSNorm: the weight is stored centred on zero (its
    init), so a checkpoint's values load unchanged. Used for each decoder layer's two norms,
    the final norm and q_norm / k_norm; the GDN layer's gated norm is a plain-weight norm.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise [..., dim] over its last dim."""
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


def rotary_cos_sin(position_ids: torch.Tensor, cfg: AttentionConfig):
    """Return (cos, sin) [..., R] in fp32 for integer positions [...] (e.g. [B, T] or [T]).

    Frequencies θ^(−2i/R), i < R/2, each used twice (rotate-half layout), as transformers'
    default rotary. Qwen3.5's multimodal rotary gives text one position in all three sections,
    which is this 1-D rotary.
    """
    R = cfg.rotary_dim
    exponent = torch.arange(0, R, 2, dtype=torch.float32, device=position_ids.device) / R
    inv_freq = 1.0 / (cfg.rope_theta ** exponent)
    freqs = position_ids.float()[..., None] * inv_freq
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x_BTHE: torch.Tensor, cos_BTR: torch.Tensor, sin_BTR: torch.Tensor):
    """Rotate the first R channels of each head of x [B, T, heads, E]; the rest pass through.

    cos/sin [B, T, R] or [T, R] are cast to x's dtype first (as transformers does).
    """
    R = cos_BTR.shape[-1]
    cos = cos_BTR.to(x_BTHE.dtype).unsqueeze(-2)
    sin = sin_BTR.to(x_BTHE.dtype).unsqueeze(-2)
    rot, rest = x_BTHE[..., :R], x_BTHE[..., R:]
    first, second = rot[..., : R // 2], rot[..., R // 2:]
    rotated = torch.cat([-second, first], dim=-1)
    return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


class GatedAttention(nn.Module):
    """One gated full-attention layer: [B, T, D] → [B, T, D]; state_dict keys as transformers'
    Qwen3_5Attention (q_proj, k_proj, v_proj, o_proj, q_norm, k_norm)."""

    def __init__(self, cfg: AttentionConfig, hidden_size: int, rms_norm_eps: float) -> None:
        super().__init__()
        self.cfg = cfg
        H, G, E, bias = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attention_bias
        # Registered in transformers' order, so state_dict keys come out in the same order.
        self.q_proj = nn.Linear(hidden_size, H * E * 2, bias=bias)  # per head: [query | gate]
        self.k_proj = nn.Linear(hidden_size, G * E, bias=bias)
        self.v_proj = nn.Linear(hidden_size, G * E, bias=bias)
        self.o_proj = nn.Linear(H * E, hidden_size, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(E, rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(E, rms_norm_eps)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None,
                         std: float = 0.02) -> None:
        """Linears N(0, std), biases and norms 0 (the norms then scale by 1)."""
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            nn.init.normal_(lin.weight, 0.0, std, generator=generator)
            if lin.bias is not None:
                lin.bias.zero_()
        self.q_norm.weight.zero_()
        self.k_norm.weight.zero_()

    def project(self, hidden_BTD: torch.Tensor, cos_BTR: torch.Tensor, sin_BTR: torch.Tensor):
        """Return q [B, T, H, E], k, v [B, T, G, E] (q, k normed and rotated) and the output
        gate's logits [B, T, H·E]."""
        B, T, _ = hidden_BTD.shape
        E = self.cfg.head_dim
        q_BTHE, gate_BTHE = self.q_proj(hidden_BTD).view(B, T, -1, 2 * E).chunk(2, dim=-1)
        k_BTGE = self.k_proj(hidden_BTD).view(B, T, -1, E)
        v_BTGE = self.v_proj(hidden_BTD).view(B, T, -1, E)
        q_BTHE = apply_rotary(self.q_norm(q_BTHE), cos_BTR, sin_BTR)
        k_BTGE = apply_rotary(self.k_norm(k_BTGE), cos_BTR, sin_BTR)
        return q_BTHE, k_BTGE, v_BTGE, gate_BTHE.reshape(B, T, -1)

    def attend(self, q_BTHE: torch.Tensor, k_BTGE: torch.Tensor, v_BTGE: torch.Tensor,
               cu_seqlens=None) -> torch.Tensor:
        """Causal softmax attention, each query head reading key/value head h // (H/G);
        returns o [B, T, H, E]. A context-parallel wrapper overrides this. cu_seqlens: None,
        or packed documents (module docstring): block-diagonal causal attention."""
        return causal_attention(q_BTHE, k_BTGE, v_BTGE, scale=self.cfg.head_dim ** -0.5,
                                cu_seqlens=cu_seqlens)

    def output(self, o_BTHE: torch.Tensor, gate_BTX: torch.Tensor) -> torch.Tensor:
        """o · sigmoid(gate), then o_proj: [B, T, D]."""
        B, T = o_BTHE.shape[:2]
        return self.o_proj(o_BTHE.reshape(B, T, -1) * torch.sigmoid(gate_BTX))

    def forward(self, hidden_BTD: torch.Tensor, cos_BTR: torch.Tensor,
                sin_BTR: torch.Tensor, cu_seqlens=None) -> torch.Tensor:
        """Map hidden states [B, T, D] at the positions of cos/sin [B, T, R] (global
        positions, also under packed documents) to [B, T, D]; cu_seqlens as attend's."""
        q_BTHE, k_BTGE, v_BTGE, gate_BTX = self.project(hidden_BTD, cos_BTR, sin_BTR)
        return self.output(self.attend(q_BTHE, k_BTGE, v_BTGE, cu_seqlens), gate_BTX)


def causal_attention(q_BTHE: torch.Tensor, k_BTGE: torch.Tensor, v_BTGE: torch.Tensor, *,
                     scale: float | None = None, cu_seqlens=None) -> torch.Tensor:
    """One chip's causal GQA softmax attention o [B, T, H, E] (query head h reading key/value
    head h // (H/G); scale defaults to E^−½) through scaled_dot_product_attention.

    cu_seqlens None: one causal call over T. Packed documents (int [N+1], 0 … T; a tensor,
    array or sequence, read on the host): one causal call per document, on its tokens alone —
    block-diagonal causal attention with no score computed between documents (the
    blocks a mask would discard are never formed)."""
    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            scale=scale, enable_gqa=True).transpose(1, 2)

    if cu_seqlens is None:
        return sdpa(q_BTHE, k_BTGE, v_BTGE)
    T = q_BTHE.shape[1]
    runs = pieces(cu_seqlens_values(cu_seqlens, seq_len=T), 0, T)
    return torch.cat([sdpa(q_BTHE[:, a:b], k_BTGE[:, a:b], v_BTGE[:, a:b]) for a, b in runs],
                     dim=1)
