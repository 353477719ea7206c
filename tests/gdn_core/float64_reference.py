"""The float64 oracle of the rule tests: token-by-token recurrence, its output, state and grads.

    ref = float64_reference(x, weights, use_qk_l2norm=True)

x: q, k, v, g, beta, initial_state (numpy, any float dtype); weights: W_o [B, T, Hv, Dv] and
W_h [B, Hv, Dk, Dv]. The loss is Σ o·W_o + Σ h_T·W_h, so every output element and the final
state reach every gradient. Gradients come from torch autograd through
gdn_core.torch_gdn.recurrent_gated_delta_rule run in float64 (independent of both chunked
rules); values also from the numpy recurrence gdn_core.reference, as a cross-check.
"""

from __future__ import annotations

import numpy as np
import torch

from gdn_core.reference import recurrent_gated_delta_rule_float64
from gdn_core.torch_gdn import recurrent_gated_delta_rule

NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def loss_weights(x: dict[str, np.ndarray], seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"W_o": rng.standard_normal(x["v"].shape).astype(np.float32),
            "W_h": rng.standard_normal(x["initial_state"].shape).astype(np.float32)}


def float64_reference(x, weights, *, use_qk_l2norm: bool) -> dict[str, np.ndarray]:
    """{"o", "final_state", and one gradient per name in NAMES}, float64 numpy."""
    leaves = {n: torch.tensor(np.asarray(x[n], np.float64), requires_grad=True) for n in NAMES}
    o, h = recurrent_gated_delta_rule(*(leaves[n] for n in NAMES[:5]),
                                      initial_state=leaves["initial_state"],
                                      output_final_state=True, use_qk_l2norm=use_qk_l2norm)
    assert o.dtype == torch.float64 and h.dtype == torch.float64
    loss = (o * torch.tensor(weights["W_o"], dtype=torch.float64)).sum() + (
        h * torch.tensor(weights["W_h"], dtype=torch.float64)).sum()
    loss.backward()
    o_np, h_np = recurrent_gated_delta_rule_float64(
        *(x[n] for n in NAMES[:5]), initial_state=x["initial_state"], output_final_state=True,
        use_qk_l2norm=use_qk_l2norm)
    # Two float64 recurrences (torch, numpy) agree to ~1e-15: a wrong oracle would show here.
    assert np.allclose(o_np, o.detach().numpy(), rtol=1e-9, atol=1e-9)
    assert np.allclose(h_np, h.detach().numpy(), rtol=1e-9, atol=1e-9)
    out = {n: leaves[n].grad.numpy() for n in NAMES}
    out.update(o=o_np, final_state=h_np)
    return out
