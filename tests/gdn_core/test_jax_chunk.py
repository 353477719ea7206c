"""The chunked JAX rule against its token-by-token recurrence and against the PyTorch rule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from gdn_core import jax_gdn, torch_gdn
from gdn_core.jax_gdn.chunk import unit_lower_inverse
from gdn_core.testing import assert_close

from .rule_inputs import RuleCase, correlated_keys, make_inputs

pytestmark = pytest.mark.timeout(180)
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
CASES = [
    RuleCase(1, 1, 1, 1, 16, 16),
    RuleCase(1, 100, 2, 4, 16, 32, "strong", 32),
    RuleCase(2, 200, 1, 2, 32, 16, "zero"),
    RuleCase(1, 300, 2, 4, 32, 32),
]


def run(rule, x, **kw):
    return rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                output_final_state=True, **kw)


def jax_forward(x, chunk_size=64, l2norm=True):
    fn = jax.jit(lambda x: run(jax_gdn.chunk_gated_delta_rule, x, use_qk_l2norm=l2norm,
                               chunk_size=chunk_size))
    return fn({n: jnp.asarray(a) for n, a in x.items()})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_chunk_matches_recurrence_and_torch(case):
    x = make_inputs(case)
    o, h = jax_forward(x, case.chunk_size)
    o_ref, h_ref = jax.jit(lambda x: run(jax_gdn.recurrent_gated_delta_rule, x, use_qk_l2norm=True))(x)
    assert_close("o vs recurrence", o_ref, o, 1e-5)
    assert_close("final_state vs recurrence", h_ref, h, 1e-5)
    o_t, h_t = run(torch_gdn.chunk_gated_delta_rule, {n: torch.tensor(a) for n, a in x.items()},
                   use_qk_l2norm=True, chunk_size=case.chunk_size)
    assert_close("o vs torch", o_t, o, 1e-5)
    assert_close("final_state vs torch", h_t, h, 1e-5)


@pytest.mark.timeout(300)
def test_long_sequence_under_jit_matches_torch_recurrence():
    # T = 4096 with 64-token chunks: the size at which jaxlib's solve_triangular hangs on this
    # host; the blockwise inverse must neither hang nor lose accuracy.
    case = RuleCase(1, 4096, 1, 2, 32, 32)
    x = make_inputs(case)
    o, h = jax_forward(x)
    o_ref, h_ref = run(torch_gdn.recurrent_gated_delta_rule,
                       {n: torch.tensor(a) for n, a in x.items()}, use_qk_l2norm=True)
    assert_close("o", o_ref, o, 1e-4)
    assert_close("final_state", h_ref, h, 1e-4)


@pytest.mark.parametrize("case", [RuleCase(1, 100, 2, 4, 16, 32, "mixed", 32),
                                  RuleCase(1, 70, 1, 1, 16, 16, "strong", 16)], ids=lambda c: c.id)
def test_gradients_match_recurrence(case):
    x = {n: jnp.asarray(a) for n, a in make_inputs(case).items()}

    def loss(x, rule, **kw):
        o, h = run(rule, x, use_qk_l2norm=True, **kw)
        weights = jnp.linspace(-1, 1, o.size).reshape(o.shape)
        return jnp.sum(o * weights) + jnp.sum(h ** 2)

    grads = jax.jit(jax.grad(lambda x: loss(x, jax_gdn.chunk_gated_delta_rule,
                                            chunk_size=case.chunk_size)))(x)
    grads_ref = jax.jit(jax.grad(lambda x: loss(x, jax_gdn.recurrent_gated_delta_rule)))(x)
    for n in NAMES:
        # floor=1: under strong decay dg and dh0 are ~1e-9 and only their round-off differs.
        assert_close(f"d{n}", grads_ref[n], grads[n], 1e-4, floor=1.0)


def test_split_sequence_passes_state():
    case = RuleCase(1, 160, 2, 4, 16, 16)
    x = make_inputs(case)
    o, h = jax_forward(x, 32)
    first = {n: (a[:, :70] if n != "initial_state" else a) for n, a in x.items()}
    o1, h1 = jax_forward(first, 32)
    second = {n: a[:, 70:] for n, a in x.items() if n != "initial_state"}
    second["initial_state"] = np.asarray(h1)
    o2, h2 = jax_forward(second, 32)
    assert_close("o", o, np.concatenate([o1, o2], axis=1), 1e-5)
    assert_close("final_state", h, h2, 1e-5)


def test_bfloat16_inputs_give_bfloat16_outputs_close_to_fp32():
    case = RuleCase(1, 256, 2, 4, 32, 32)
    x = make_inputs(case)
    o32, h32 = jax_forward(x)
    fn = jax.jit(lambda x: run(jax_gdn.chunk_gated_delta_rule, x, use_qk_l2norm=True))
    o16, h16 = fn({n: (jnp.asarray(a, jnp.bfloat16) if n != "initial_state" else jnp.asarray(a))
                   for n, a in x.items()})
    assert o16.dtype == jnp.bfloat16 and h16.dtype == jnp.float32
    assert_close("o(bf16)", o32, o16.astype(jnp.float32), 2e-2)
    assert_close("final_state(bf16)", h32, h16, 2e-2)


def test_rejects_bad_chunk_size():
    x = make_inputs(RuleCase(1, 16, 1, 1, 8, 8))
    with pytest.raises(ValueError, match="chunk_size=24"):
        run(jax_gdn.chunk_gated_delta_rule, x, chunk_size=24)


@pytest.mark.parametrize("C", [16, 64, *(pytest.param(C, marks=pytest.mark.slow)
                                          for C in (32, 128))])
def test_unit_lower_inverse_and_its_vjp_are_exact_on_correlated_keys(C):
    # L = β (k kᵀ) e^{G_i−G_j}, strictly lower, keys at cosine 0.97, β near 1, weak decay:
    # the L on which the product form (I − L)(I + L²)… lost all accuracy (1e4 at C = 64).
    rng = np.random.default_rng(C)
    k_NCK = correlated_keys(rng, 1, 8 * C, 1, 32, 0.97).reshape(8, C, 32)
    beta_NC = rng.uniform(0.9, 1.0, (8, C))
    G_NC = np.cumsum(np.log(rng.uniform(0.95, 1.0, (8, C))), axis=-1)
    decay_NCC = np.exp(np.tril(G_NC[:, :, None] - G_NC[:, None, :]))
    L = np.tril(beta_NC[..., None] * (k_NCK @ k_NCK.transpose(0, 2, 1)) * decay_NCC, -1)
    L = L.astype(np.float32)
    exact = np.linalg.inv(np.eye(C) + L.astype(np.float64))
    W = rng.standard_normal(L.shape)
    T, vjp = jax.vjp(jax.jit(unit_lower_inverse), jnp.asarray(L))
    (dL,) = vjp(jnp.asarray(W, jnp.float32))
    exact_dL = np.tril(-exact.transpose(0, 2, 1) @ W @ exact.transpose(0, 2, 1), -1)
    assert_close("T", exact, T, 1e-6)
    assert_close("dL", exact_dL, dL, 1e-6)
    # Only the strictly lower part of L is read: the diagonal and above are ignored.
    assert_close("T(L + upper)", exact, jax.jit(unit_lower_inverse)(jnp.asarray(L + np.triu(W))),
                 1e-6)
