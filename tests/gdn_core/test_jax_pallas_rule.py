"""The Pallas chunk rule (gdn_core.jax_gdn.pallas) under Pallas's interpreter on this CPU.

Oracles: this package's JAX chunk rule (jax_gdn.chunk) and transformers' torch rule (Qwen3.5's
torch_chunk_gated_delta_rule, an independent implementation). float32 within 1e-4 (relative,
Frobenius): o, the final state and the gradients of q, k, v, g, β and the initial state, on
keys that share a direction (cosine 0.97) with β near 1, where a careless triangular inverse
fails. bf16 inputs against the float32 reference on the same bf16-rounded inputs: 2e-2 (the
reference's own bf16 tolerance, jax_gdn/chunk.py), final state 1e-5 (float32 math on both).
T not a multiple of the chunk is padded (zero tokens), never rejected.
Both parameterisations run here: 'tpu' (one kernel, a sequential grid over chunks) and 'gpu'
(chunk-parallel calls around sequential state passes over blocks of the state's columns; Dv =
64 makes two blocks).
Legend: B batch, T tokens, Hk/Hv key/value heads, Dk/Dv head dims.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_core.jax_gdn.chunk import chunk_gated_delta_rule
from gdn_core.jax_gdn.pallas import chunk_math
from gdn_core.jax_gdn.pallas.chunk_rule import chunk_gated_delta_rule_pallas
from gdn_core.testing import assert_close, rel_err

from .rule_inputs import RuleCase, make_inputs

TOL = 1e-4
BF16_TOL, BF16_STATE_TOL = 2e-2, 1e-5
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def near_one_beta(case: RuleCase, seed: int = 0):
    x = make_inputs(case, seed)
    x["beta"] = np.random.default_rng(seed + 1).uniform(0.95, 1.0, x["beta"].shape)
    return {name: jnp.asarray(a, jnp.float32) for name, a in x.items()}


def run_rule(rule, x, *, dtype=jnp.float32, **kwargs):
    """o, final state and the gradients of a loss touching both, as a dict of arrays."""
    def loss(q, k, v, g, beta, h0):
        o, final = rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                        use_qk_l2norm=True, **kwargs)
        o = o.astype(jnp.float32)
        return jnp.sum(o * jnp.cos(o)) + jnp.sum(final * final), (o, final)

    args = [x[n].astype(dtype) for n in ("q", "k", "v", "g", "beta")] + [x["initial_state"]]
    (_, (o, final)), grads = jax.jit(jax.value_and_grad(loss, argnums=range(6),
                                                        has_aux=True))(*args)
    return dict(o=o, final=final, **dict(zip(NAMES, grads)))


def assert_all_close(want, got, tol, label, *, grad_floor=0.0):
    for name in ("o", "final") + NAMES:
        assert_close(f"{label}: {name}", want[name], got[name], tol,
                     floor=grad_floor if name in NAMES else 0.0)


CASES = [RuleCase(1, 100, 1, 2, 16, 64, "weak", cosine=0.97),  # GVA, T padded to 128
         RuleCase(1, 128, 2, 2, 32, 16, "mixed", cosine=0.97)]  # Hk = Hv, T a multiple


@pytest.mark.timeout(120)
@pytest.mark.parametrize("platform", ["tpu", "gpu"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_the_reference_rule(case, platform):
    x = near_one_beta(case)
    want = run_rule(chunk_gated_delta_rule, x)
    got = run_rule(chunk_gated_delta_rule_pallas, x, platform=platform, interpret=True)
    assert_all_close(want, got, TOL, f"pallas ({platform}) vs reference")


@pytest.mark.timeout(120)
def test_matches_transformers_rule():
    """transformers' torch_chunk_gated_delta_rule (GVA by repeating key heads), float32."""
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    x = near_one_beta(RuleCase(1, 100, 1, 2, 16, 16, "weak", cosine=0.97), seed=2)
    t = {name: torch.tensor(np.asarray(a), requires_grad=True) for name, a in x.items()}
    r = x["v"].shape[2] // x["q"].shape[2]
    o, final = torch_chunk_gated_delta_rule(
        t["q"].repeat_interleave(r, dim=2), t["k"].repeat_interleave(r, dim=2), t["v"], t["g"],
        t["beta"], chunk_size=64, initial_state=t["initial_state"], output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    (torch.sum(o * torch.cos(o)) + torch.sum(final * final)).backward()
    want = dict(o=o.detach(), final=final.detach(),
                **{name: t[key].grad for name, key in zip(
                    NAMES, ("q", "k", "v", "g", "beta", "initial_state"))})
    got = run_rule(chunk_gated_delta_rule_pallas, x, interpret=True)
    assert_all_close(want, got, TOL, "pallas vs transformers")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_packed_documents_match_the_reference(platform):
    """cu_seqlens: the state resets at each boundary, one inside a chunk, one on a chunk's
    first token, a short last document."""
    x = near_one_beta(RuleCase(2, 150, 2, 2, 16, 16, "weak", cosine=0.9), seed=3)
    cu = jnp.array([0, 40, 64, 130, 150])
    want = run_rule(chunk_gated_delta_rule, x, cu_seqlens=cu)
    got = run_rule(chunk_gated_delta_rule_pallas, x, cu_seqlens=cu, platform=platform,
                   interpret=True)
    assert_all_close(want, got, TOL, f"pallas ({platform}) vs reference, packed documents")


@pytest.mark.timeout(120)
def test_a_start_on_the_first_token_ignores_the_initial_state():
    """doc_starts may mark token 0 (a CP segment beginning a document): the initial state
    then reaches nothing; the result equals the reference run from a zero state."""
    x = near_one_beta(RuleCase(1, 64, 1, 1, 16, 16, "weak"), seed=4)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    starts = jnp.zeros(64, bool).at[jnp.array([0, 30])].set(True)
    o, final = chunk_gated_delta_rule_pallas(
        *args, initial_state=x["initial_state"], output_final_state=True, doc_starts=starts,
        interpret=True)
    o_ref, final_ref = chunk_gated_delta_rule(*args, output_final_state=True,
                                              cu_seqlens=jnp.array([0, 30, 64]))
    assert_close("o", o_ref, o, TOL)
    assert_close("final", final_ref, final, TOL)


@pytest.mark.timeout(120)
def test_bfloat16_inputs_against_float32_reference():
    x = near_one_beta(RuleCase(1, 128, 1, 2, 32, 32, "mixed", cosine=0.9), seed=5)
    x = {name: a.astype(jnp.bfloat16).astype(jnp.float32) for name, a in x.items()}
    want = run_rule(chunk_gated_delta_rule, x)
    got = run_rule(chunk_gated_delta_rule_pallas, x, dtype=jnp.bfloat16, interpret=True)
    assert got["o"].dtype == jnp.float32 and got["final"].dtype == jnp.float32
    assert_close("final", want["final"], got["final"], BF16_STATE_TOL)
    for name in ("o",) + NAMES:
        assert_close(f"bf16: {name}", want[name], got[name], BF16_TOL)


@pytest.mark.parametrize("cosine", [0.5, 0.97])
def test_unit_lower_inverse_is_exact_on_keys_sharing_a_direction(cosine):
    """(I + L)⁻¹ by blockwise merges against float64, β near 1, no decay: the L on which the
    product form loses everything (ENVIRONMENT-NOTES)."""
    x = near_one_beta(RuleCase(1, 64, 1, 1, 128, 16, "zero", cosine=cosine), seed=6)
    L = chunk_math.lower_matrix(x["k"][0, :, 0], jnp.zeros((1, 64)), x["beta"][0, :, 0][None],
                                None, use_qk_l2norm=False)
    T = jax.jit(chunk_math.unit_lower_inverse)(L)
    want = np.linalg.inv(np.eye(64) + np.asarray(L, np.float64))
    assert rel_err(want, T) <= 1e-6


def test_arguments_are_checked():
    x = near_one_beta(RuleCase(1, 16, 1, 1, 16, 16), seed=7)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    with pytest.raises(ValueError, match="platform='cuda' is not one of: tpu, gpu"):
        chunk_gated_delta_rule_pallas(*args, platform="cuda", interpret=True)
    with pytest.raises(ValueError, match="no kernel for backend 'cpu'"):
        chunk_gated_delta_rule_pallas(*args)
    with pytest.raises(ValueError, match="not both"):
        chunk_gated_delta_rule_pallas(*args, cu_seqlens=jnp.array([0, 16]),
                                      doc_starts=jnp.zeros(16, bool), interpret=True)
    with pytest.raises(ValueError, match="chunk_size=48"):
        chunk_gated_delta_rule_pallas(*args, chunk_size=48, interpret=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("platform", ["tpu", "gpu"])
@pytest.mark.parametrize("case", [RuleCase(2, 300, 2, 4, 32, 32, "mixed", 32, cosine=0.97),
                                  RuleCase(1, 257, 1, 1, 64, 64, "strong"),
                                  RuleCase(1, 512, 2, 4, 32, 16, "zero", 128, keys="iid")],
                         ids=lambda c: c.id)
def test_matches_the_reference_rule_at_more_shapes(case, platform):
    x = near_one_beta(case)
    want = run_rule(chunk_gated_delta_rule, x, chunk_size=case.chunk_size)
    got = run_rule(chunk_gated_delta_rule_pallas, x, chunk_size=case.chunk_size,
                   platform=platform, interpret=True)
    # Under strong decay (g ≈ −20) dg and dh0 are ~1e-9 and carry only round-off (the
    # reference differs from the token-by-token recurrence there by 3× their norm): floor 1,
    # as tests/gdn_core/test_jax_chunk.py.
    floor = 1.0 if case.decay == "strong" else 0.0
    assert_all_close(want, got, TOL, f"pallas ({platform}) vs reference", grad_floor=floor)
