"""Float64 token-by-token gated delta rule in numpy: the framework-free ground truth.

Per value head, state h [Dk, Dv]: h ← e^{g_t} h;  h ← h + k_t ⊗ β_t (v_t − hᵀk_t);  o_t = hᵀ q_t,
with q scaled by Dk^-½ (after the optional L2 norm, eps 1e-6, as the rules do). Every step is a
rank-one update, so in float64 it is exact to ~1e-15 for any input; the chunked rules of both
frameworks (and their CP modes) are measured against it, on keys that share a direction too.
"""

from __future__ import annotations

import numpy as np

from .shapes import check_rule_args


def _float64(x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def recurrent_gated_delta_rule_float64(q, k, v, g, beta, *, initial_state=None,
                                       output_final_state=False, use_qk_l2norm=False):
    """Run the recurrence in float64 numpy (any array type in; numpy float64 out).

    Args: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g (log decay) and beta [B, T, Hv];
    initial_state [B, Hv, Dk, Dv] or None. Returns o [B, T, Hv, Dv] and, if asked, the final
    state [B, Hv, Dk, Dv] (else None), both float64.
    """
    B, T, Hk, Hv, Dk, Dv = check_rule_args(
        np.shape(q), np.shape(k), np.shape(v), np.shape(g), np.shape(beta),
        None if initial_state is None else np.shape(initial_state), 64)
    r = Hv // Hk
    q_BTHK, k_BTHK = (np.repeat(_float64(x), r, axis=2) for x in (q, k))
    if use_qk_l2norm:
        q_BTHK, k_BTHK = _l2norm(q_BTHK), _l2norm(k_BTHK)
    q_BTHK = q_BTHK * Dk ** -0.5
    v_BTHV, g_BTH, beta_BTH = _float64(v), _float64(g), _float64(beta)
    h_BHKV = (np.zeros((B, Hv, Dk, Dv)) if initial_state is None
              else _float64(initial_state).copy())
    o_BTHV = np.zeros((B, T, Hv, Dv))
    for t in range(T):
        h_BHKV *= np.exp(g_BTH[:, t])[..., None, None]
        k_BHK = k_BTHK[:, t]
        predicted_BHV = np.einsum("bhkv,bhk->bhv", h_BHKV, k_BHK)
        delta_BHV = beta_BTH[:, t, :, None] * (v_BTHV[:, t] - predicted_BHV)
        h_BHKV += k_BHK[..., :, None] * delta_BHV[..., None, :]
        o_BTHV[:, t] = np.einsum("bhkv,bhk->bhv", h_BHKV, q_BTHK[:, t])
    return o_BTHV, (h_BHKV if output_final_state else None)
