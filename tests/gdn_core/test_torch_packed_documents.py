"""Packed variable-length documents (cu_seqlens) in the PyTorch rule and layer, one chip.

Oracles: each document run alone (the first from initial_state, the others from zero state;
the final state is the last document's), and the token-by-token recurrence with the same
cu_seqlens. Inputs are realistic (rule_inputs: keys of a head sharing a direction, β near 1;
strong, weak and mixed decay). Boundaries fall inside a chunk, on a chunk edge, back to back
(a 1-token document), and a document spans several chunks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_core.config import GDNConfig
from gdn_core.testing import assert_close
from gdn_core.torch_gdn import (
    GatedDeltaNet,
    causal_conv1d,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
)

from .rule_inputs import RuleCase, make_inputs

pytestmark = pytest.mark.timeout(120)
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
TOL = 1e-4

# (case, cu_seqlens): chunk 16 unless the case says otherwise.
DOCS = [
    # inside chunks, a chunk edge (32), a 1-token document (40), a long last document
    (RuleCase(1, 100, 2, 4, 16, 16, "mixed", 16), (0, 5, 32, 40, 41, 100)),
    (RuleCase(1, 100, 2, 4, 16, 16, "weak", 16, cosine=0.97), (0, 5, 32, 40, 41, 100)),
    (RuleCase(1, 100, 2, 4, 16, 16, "strong", 16), (0, 5, 32, 40, 41, 100)),
    # a first document of one token, starts on every chunk edge, a last document of one token
    (RuleCase(1, 64, 1, 2, 32, 16, "weak", 16), (0, 1, 16, 32, 48, 63, 64)),
    # T not a multiple of the chunk, several starts in one chunk, iid keys, chunk 64
    (RuleCase(1, 150, 2, 2, 16, 32, "mixed", 64, keys="iid"), (0, 7, 9, 10, 70, 129, 150)),
    # one document (no interior start)
    (RuleCase(1, 40, 1, 1, 16, 16, "weak", 16), (0, 40)),
    # an empty document in the middle (cu_seqlens repeats a value)
    (RuleCase(1, 40, 1, 2, 16, 16, "weak", 16), (0, 10, 10, 40)),
    # two rows packed alike (each row its own sequence of the same documents)
    (RuleCase(2, 48, 1, 2, 16, 16, "mixed", 16), (0, 20, 21, 48)),
]


def doc_id(item) -> str:
    case, cu = item
    return f"{case.id}-cu{'_'.join(map(str, cu))}"


def leaves(case: RuleCase, seed: int = 0) -> dict[str, torch.Tensor]:
    return {n: torch.tensor(a, requires_grad=True) for n, a in make_inputs(case, seed).items()}


def weights(case: RuleCase) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(7)
    return (torch.tensor(rng.standard_normal((case.B, case.T, case.Hv, case.Dv)),
                         dtype=torch.float32),
            torch.tensor(rng.standard_normal((case.B, case.Hv, case.Dk, case.Dv)),
                         dtype=torch.float32))


def packed(case, cu, rule=chunk_gated_delta_rule, **kw):
    """o, final and every input gradient of the packed run under a fixed linear loss."""
    x = leaves(case)
    W_o, W_f = weights(case)
    o, final = rule(*(x[n] for n in NAMES[:5]), initial_state=x["initial_state"],
                    output_final_state=True, use_qk_l2norm=True,
                    cu_seqlens=torch.tensor(cu), **kw)
    ((o * W_o).sum() + (final * W_f).sum()).backward()
    return o.detach(), final.detach(), {n: x[n].grad for n in NAMES}


def alone(case, cu):
    """The same, each document run on its own by the rule without cu_seqlens."""
    x = leaves(case)
    W_o, W_f = weights(case)
    outputs, state = [], x["initial_state"]
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        o, state = chunk_gated_delta_rule(
            *(x[n][:, a:b] for n in NAMES[:5]), initial_state=state if i == 0 else None,
            output_final_state=True, use_qk_l2norm=True, chunk_size=case.chunk_size)
        outputs.append(o)
    o = torch.cat(outputs, dim=1)
    ((o * W_o).sum() + (state * W_f).sum()).backward()
    return o.detach(), state.detach(), {n: x[n].grad for n in NAMES}


@pytest.mark.parametrize("item", DOCS, ids=doc_id)
def test_packed_rule_equals_documents_alone(item):
    case, cu = item
    o, final, grads = packed(case, cu, chunk_size=case.chunk_size)
    o_ref, final_ref, grads_ref = alone(case, cu)
    assert_close("o", o_ref, o, TOL)
    assert_close("final_state", final_ref, final, TOL)
    for n in NAMES:  # dg under strong decay is ~1e-9: relative to the whole gradient's scale
        assert_close(f"d{n}", grads_ref[n], grads[n], TOL, floor=1e-3 * grads_ref["v"].norm())


@pytest.mark.parametrize("item", DOCS[:4], ids=doc_id)
def test_packed_rule_equals_recurrence(item):
    case, cu = item
    o, final, grads = packed(case, cu, chunk_size=case.chunk_size)
    o_ref, final_ref, grads_ref = packed(case, cu, rule=recurrent_gated_delta_rule)
    assert_close("o", o_ref, o, TOL)
    assert_close("final_state", final_ref, final, TOL)
    for n in NAMES:
        assert_close(f"d{n}", grads_ref[n], grads[n], TOL, floor=1e-3 * grads_ref["v"].norm())


def test_bf16_packed_rule_within_stated_tolerance():
    """bf16 inputs: packed vs each document alone, both bf16 (chunk.py's precision notes)."""
    case, cu = DOCS[1]
    x = {n: (t.detach() if n == "initial_state" else t.detach().bfloat16())
         for n, t in leaves(case).items()}
    args = [x[n] for n in NAMES[:5]]
    o, h = chunk_gated_delta_rule(*args, initial_state=x["initial_state"], output_final_state=True,
                                  use_qk_l2norm=True, chunk_size=16, cu_seqlens=torch.tensor(cu))
    outputs, state = [], x["initial_state"]
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        o_doc, state = chunk_gated_delta_rule(
            *(t[:, a:b] for t in args), initial_state=state if i == 0 else None,
            output_final_state=True, use_qk_l2norm=True, chunk_size=16)
        outputs.append(o_doc)
    assert o.dtype == torch.bfloat16
    assert_close("o", torch.cat(outputs, dim=1), o, 2e-2)
    assert_close("final_state", state, h, 1e-5)


def test_one_document_matches_no_cu_seqlens():
    case = RuleCase(1, 70, 2, 4, 16, 16, "mixed", 16)
    x = {n: t.detach() for n, t in leaves(case).items()}
    args = [x[n] for n in NAMES[:5]]
    o, h = chunk_gated_delta_rule(*args, initial_state=x["initial_state"], output_final_state=True,
                                  chunk_size=16, cu_seqlens=torch.tensor([0, 70]))
    o_ref, h_ref = chunk_gated_delta_rule(*args, initial_state=x["initial_state"],
                                          output_final_state=True, chunk_size=16)
    assert_close("o", o_ref, o, 1e-6)
    assert_close("final_state", h_ref, h, 1e-6)


@pytest.mark.parametrize(("B", "cu", "message"), [
    (1, [0, 3, 7], "from 0 to seq_len=8"),
    (1, [1, 8], "from 0 to seq_len=8"),
    (1, [0, 5, 3, 8], "non-decreasing"),
    (1, [[0, 8]], "must be [N+1]"),
    (1, [0.0, 8.0], "integer"),
])
def test_bad_cu_seqlens_raise(B, cu, message):
    q = torch.zeros(B, 8, 1, 16)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("+", r"\+")):
        chunk_gated_delta_rule(q, q, torch.zeros(B, 8, 1, 16), torch.zeros(B, 8, 1),
                               torch.zeros(B, 8, 1), chunk_size=16, cu_seqlens=torch.tensor(cu))


def test_conv_sees_no_earlier_document():
    """causal_conv1d with since_start equals the conv of each document alone."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 20, 6, generator=gen), torch.randn(6, 4, generator=gen)
    cu = [0, 1, 3, 11, 20]
    since = torch.tensor([p - max(c for c in cu[:-1] if c <= p) for p in range(20)])
    y = causal_conv1d(x, w, since_start_T=since)
    ref = torch.cat([causal_conv1d(x[:, a:b], w) for a, b in zip(cu, cu[1:])], dim=1)
    assert_close("conv", ref, y, 1e-6)


# --- the layer -------------------------------------------------------------------------------

CFG = GDNConfig(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8,
                conv_kernel_size=4, chunk_size=16)


def make_layer() -> GatedDeltaNet:
    """Seeded weights, slow decay (A ≤ 0.1) so that state would cross documents if it could."""
    layer = GatedDeltaNet(CFG)
    gen = torch.Generator().manual_seed(0)
    layer.reset_parameters(gen)
    with torch.no_grad():
        layer.A_log.copy_(torch.empty(CFG.num_v_heads).uniform_(0.005, 0.1, generator=gen).log())
    return layer


@pytest.mark.parametrize("remat", [False, True], ids=["plain", "remat"])
def test_packed_layer_equals_documents_alone(remat):
    cu = [0, 2, 3, 19, 32, 57, 64]  # 1-token document, a chunk edge (32), inside chunks
    rng = np.random.default_rng(0)
    x_np, W_np = (rng.standard_normal((1, 64, CFG.hidden_size)).astype(np.float32)
                  for _ in range(2))
    W = torch.tensor(W_np)

    def run(packed_run: bool):
        layer = make_layer()
        layer.recompute_core = remat
        x = torch.tensor(x_np, requires_grad=True)
        if packed_run:
            y = layer(x, torch.tensor(cu))
        else:
            y = torch.cat([layer(x[:, a:b]) for a, b in zip(cu, cu[1:])], dim=1)
        (y * W).sum().backward()
        return y.detach(), x.grad, {n: p.grad for n, p in layer.named_parameters()}

    y, dx, grads = run(True)
    y_ref, dx_ref, grads_ref = run(False)
    assert_close("y", y_ref, y, TOL)
    assert_close("dx", dx_ref, dx, TOL)
    for n in grads_ref:
        assert_close(f"d{n}", grads_ref[n], grads[n], TOL)
