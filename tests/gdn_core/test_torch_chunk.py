"""The chunked PyTorch rule against the token-by-token recurrence (and itself, split)."""

import numpy as np
import pytest
import torch

from gdn_core.testing import assert_close
from gdn_core.torch_gdn import chunk_gated_delta_rule, recurrent_gated_delta_rule

from .rule_inputs import RULE_CASES, RuleCase, make_inputs

pytestmark = pytest.mark.timeout(120)
NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def tensors(case, seed=0, requires_grad=False):
    return {n: torch.tensor(a, requires_grad=requires_grad) for n, a in make_inputs(case, seed).items()}


def run(rule, x, **kw):
    return rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                output_final_state=True, **kw)


@pytest.mark.parametrize("case", RULE_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "raw"])
def test_chunk_matches_recurrence(case, l2norm):
    x = tensors(case)
    if not l2norm:  # keep the raw keys well conditioned: unit norm
        x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    o, h = run(chunk_gated_delta_rule, x, use_qk_l2norm=l2norm, chunk_size=case.chunk_size)
    o_ref, h_ref = run(recurrent_gated_delta_rule, x, use_qk_l2norm=l2norm)
    tol = 1e-5 if case.T <= 512 else 1e-4
    assert_close("o", o_ref, o, tol)
    assert_close("final_state", h_ref, h, tol)
    assert o.dtype == torch.float32 and h.dtype == torch.float32


def test_long_sequence_matches_recurrence():
    case = RuleCase(1, 4096, 1, 2, 32, 32)
    x = tensors(case)
    o, h = run(chunk_gated_delta_rule, x, use_qk_l2norm=True)
    o_ref, h_ref = run(recurrent_gated_delta_rule, x, use_qk_l2norm=True)
    assert_close("o", o_ref, o, 1e-4)
    assert_close("final_state", h_ref, h, 1e-4)


@pytest.mark.parametrize("split", [1, 64, 77])
def test_split_sequence_passes_state(split):
    case = RuleCase(2, 200, 2, 4, 16, 32)
    x = tensors(case)
    whole_o, whole_h = run(chunk_gated_delta_rule, x, use_qk_l2norm=True)
    first = {n: (t[:, :split] if n != "initial_state" else t) for n, t in x.items()}
    o1, h1 = run(chunk_gated_delta_rule, first, use_qk_l2norm=True)
    second = {n: t[:, split:] for n, t in x.items() if n != "initial_state"}
    second["initial_state"] = h1
    o2, h2 = run(chunk_gated_delta_rule, second, use_qk_l2norm=True)
    assert_close("o", whole_o, torch.cat([o1, o2], dim=1), 1e-5)
    assert_close("final_state", whole_h, h2, 1e-5)


@pytest.mark.parametrize("case", [RuleCase(1, 100, 2, 4, 16, 32, "mixed", 32),
                                  RuleCase(1, 70, 1, 1, 16, 16, "strong", 16)], ids=lambda c: c.id)
def test_gradients_match_recurrence(case):
    grads = []
    for rule, kw in ((chunk_gated_delta_rule, dict(chunk_size=case.chunk_size)),
                     (recurrent_gated_delta_rule, {})):
        x = tensors(case, requires_grad=True)
        o, h = run(rule, x, use_qk_l2norm=True, **kw)
        weights = torch.linspace(-1, 1, o.numel()).reshape(o.shape)
        ((o * weights).sum() + (h ** 2).sum()).backward()
        grads.append({n: x[n].grad for n in NAMES})
    for n in NAMES:
        assert grads[0][n] is not None, n
        # floor=1: under strong decay dg and dh0 are ~1e-9 and only their round-off differs.
        assert_close(f"d{n}", grads[1][n], grads[0][n], 1e-4, floor=1.0)


def test_strong_decay_is_finite_with_gradients():
    case = RuleCase(1, 128, 1, 1, 16, 16, "strong")
    x = tensors(case, requires_grad=True)
    x_g = {n: t for n, t in x.items()}
    o, h = run(chunk_gated_delta_rule, x_g, use_qk_l2norm=True)
    (o.sum() + h.sum()).backward()
    for n in NAMES:
        assert torch.isfinite(x[n].grad).all(), n


def test_bfloat16_inputs_give_bfloat16_outputs_close_to_fp32():
    case = RuleCase(1, 256, 2, 4, 32, 32)
    x = tensors(case)
    o32, h32 = run(chunk_gated_delta_rule, x, use_qk_l2norm=True)
    x16 = {n: (t.bfloat16() if n != "initial_state" else t) for n, t in x.items()}
    o16, h16 = run(chunk_gated_delta_rule, x16, use_qk_l2norm=True)
    assert o16.dtype == torch.bfloat16 and h16.dtype == torch.float32
    # bf16 rounds the inputs (8 bits of mantissa) and the output; state math stays fp32.
    assert_close("o(bf16)", o32, o16, 2e-2)
    assert_close("final_state(bf16)", h32, h16, 2e-2)


def test_rejects_bad_shapes_naming_values():
    x = tensors(RuleCase(1, 16, 2, 3, 8, 8))
    with pytest.raises(ValueError, match="Hv=3 must be a multiple of key heads Hk=2"):
        run(chunk_gated_delta_rule, x)
    x = tensors(RuleCase(1, 16, 1, 1, 8, 8))
    with pytest.raises(ValueError, match=r"chunk_size=48 is not one of \(16, 32, 64, 128\)"):
        run(chunk_gated_delta_rule, x, chunk_size=48)
    with pytest.raises(ValueError, match="initial_state"):
        x["initial_state"] = torch.zeros(1, 1, 8, 9)
        run(chunk_gated_delta_rule, x)


def test_no_final_state_unless_asked():
    x = tensors(RuleCase(1, 10, 1, 1, 8, 8))
    o, h = chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])
    assert h is None and o.shape == (1, 10, 1, 8)
    assert np.isfinite(o.numpy()).all()
