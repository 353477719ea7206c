"""Token-by-token gated delta rule: the ground truth every faster form is tested against.

The GDN recurrence, per value head, with state h [Dk, Dv]:
    h ← exp(g_t) · h
    h ← h + k_t ⊗ β_t (v_t − hᵀ k_t)
    o_t = hᵀ (q_t · Dk^-½)
"""

from __future__ import annotations

import torch

from ..shapes import check_rule_args
from .documents import check_cu_seqlens


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x²) + eps) over the last dim, in float32 (float64 stays float64)."""
    x = x.to(state_dtype(x.dtype))
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs (a float64 reference), else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def recurrent_gated_delta_rule(q, k, v, g, beta, *, initial_state=None, output_final_state=False,
                               use_qk_l2norm=False, cu_seqlens=None):
    """Run the recurrence one token at a time (slow; for tests and tiny inputs).

    Args: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g (log decay) and beta [B, T, Hv];
    initial_state [B, Hv, Dk, Dv]. Returns o [B, T, Hv, Dv] in q's dtype and the float32
    final state [B, Hv, Dk, Dv] (or None). cu_seqlens (int [N+1], all rows; as in
    chunk_gated_delta_rule): h ← 0 before each document start after the first.
    With float64 q it runs, and returns its state, in float64: autograd through it is then
    the float64 gradient reference.
    """
    B, T, Hk, Hv, Dk, Dv = check_rule_args(
        q.shape, k.shape, v.shape, g.shape, beta.shape,
        None if initial_state is None else initial_state.shape, 64)
    starts = set()
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=T)
        starts = set(cu_seqlens.tolist()[1:-1]) - {0}
    r, dtype = Hv // Hk, state_dtype(q.dtype)
    q_BTHK = q.to(dtype).repeat_interleave(r, dim=2)
    k_BTHK = k.to(dtype).repeat_interleave(r, dim=2)
    if use_qk_l2norm:
        q_BTHK, k_BTHK = l2norm(q_BTHK), l2norm(k_BTHK)
    q_BTHK = q_BTHK * Dk ** -0.5
    v_BTHV, g_BTH, beta_BTH = v.to(dtype), g.to(dtype), beta.to(dtype)
    h_BHKV = (torch.zeros(B, Hv, Dk, Dv, dtype=dtype, device=q.device)
              if initial_state is None else initial_state.to(dtype))
    outputs = []
    for t in range(T):
        if t in starts:  # a new document: nothing of the previous one carries over
            h_BHKV = torch.zeros_like(h_BHKV)
        h_BHKV = h_BHKV * g_BTH[:, t].exp()[..., None, None]
        k_BHK = k_BTHK[:, t]
        predicted_BHV = torch.einsum("bhkv,bhk->bhv", h_BHKV, k_BHK)
        delta_BHV = beta_BTH[:, t, :, None] * (v_BTHV[:, t] - predicted_BHV)
        h_BHKV = h_BHKV + k_BHK[..., :, None] * delta_BHV[..., None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", h_BHKV, q_BTHK[:, t]))
    o = torch.stack(outputs, dim=1) if outputs else v_BTHV.new_zeros(B, 0, Hv, Dv)
    return o.to(q.dtype), (h_BHKV if output_final_state else None)
