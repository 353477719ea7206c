"""Keys that share a direction: both chunked rules, the JAX CP modes, and both layers, against
the float64 token-by-token recurrence (tests/gdn_core/float64_reference.py).

Keys of a head at cosine c to one direction (rule_inputs: c up to 0.97, β ∈ U(0.5, 1), weak
decay g = log U(0.95, 1), plus g = −20 on a few tokens), where the product-form inverse the
JAX rule used to have reached a relative error of 1e5 at c = 0.8. Legend: B batch, T tokens,
Hk/Hv key/value heads, Dk/Dv head dims, C chunk. The torch CP modes: test_correlated_keys_cp.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import Mesh

from gdn_core import jax_gdn, torch_gdn
from gdn_core.config import GDNConfig
from gdn_core.cp_modes import CP_MODES
from gdn_core.jax_gdn.cp import chunk_gated_delta_rule_cp
from gdn_core.jax_gdn.layer import gdn_layer
from gdn_core.jax_gdn.params import from_state_dict, to_state_dict
from gdn_core.reference import recurrent_gated_delta_rule_float64
from gdn_core.testing import assert_close
from gdn_core.torch_gdn.layer import GatedDeltaNet

from .float64_reference import NAMES, float64_reference, loss_weights
from .rule_inputs import RuleCase, make_inputs

FP32_TOL = 1e-5  # fp32 rules vs float64, T ≤ 512; measured ≤ 1.1e-6 (values, state, grads)
# bf16 q, k, v, g, beta vs the fp32 rule on the same bf16-rounded inputs (module docs of
# jax_gdn.chunk / torch_gdn.chunk): output and gradients measured ≤ 9e-3 (bf16 output matmuls
# and bf16 results); the final state is float32 math on both sides, measured equal.
BF16_TOL, BF16_STATE_TOL = 2e-2, 1e-5
# Layer gradients vs the same layer with the float64 rule (the rest is fp32 on both sides);
# measured ≤ 1.5e-5 (A_log, dt_bias, in_proj_a), ≤ 1.1e-6 for the others.
LAYER_GRAD_TOL = 1e-4

CI_CASES = [  # (case, use_qk_l2norm); T never a multiple of C
    (RuleCase(1, 200, 2, 4, 32, 16, "weak", 64, cosine=0.97), True),
    (RuleCase(1, 130, 1, 2, 32, 32, "weak", 32, cosine=0.8), False),
]
SLOW_CASES = [pytest.param(RuleCase(2, 300, 2, 4, 64, 32, decay, C, cosine=c), l2,
                           marks=pytest.mark.slow)
              for c in (0.5, 0.8, 0.95, 0.97) for C in (16, 32, 64, 128)
              for decay, l2 in (("weak", True), ("mixed", False))]
ids = lambda p: p.id if isinstance(p, RuleCase) else ("l2norm" if p else "raw")  # noqa: E731


@functools.cache
def inputs(case: RuleCase) -> dict[str, np.ndarray]:
    x = make_inputs(case)
    x["g"][:, 7::29, 0] = -20.0  # strong decay (a near-reset) on some tokens of one head
    return x


def bf16_rounded(x):
    return {n: (a if n == "initial_state" else torch.tensor(a).bfloat16().float().numpy())
            for n, a in x.items()}


@functools.cache
def reference(case: RuleCase, l2norm: bool, rounded: bool = False):
    x = bf16_rounded(inputs(case)) if rounded else inputs(case)
    return float64_reference(x, loss_weights(x), use_qk_l2norm=l2norm)


def jax_loss(rule, weights, **kw):
    def loss(q, k, v, g, beta, h0):
        o, h = rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
        return jnp.sum(o.astype(jnp.float32) * weights["W_o"]) + jnp.sum(h * weights["W_h"]), (o, h)
    return loss


def jax_run(x, rule, *, dtype=jnp.float32, **kw):
    """{o, final_state, d<name>...} of `rule` under jit(grad); q, k, v, g, beta in `dtype`."""
    args = [jnp.asarray(x[n], jnp.float32 if n == "initial_state" else dtype) for n in NAMES]
    grad = jax.grad(jax_loss(rule, loss_weights(x), **kw), argnums=tuple(range(6)), has_aux=True)
    grads, (o, h) = jax.jit(grad)(*args)
    return dict(zip(NAMES, grads), o=o, final_state=h)


def torch_run(x, *, dtype=torch.float32, **kw):
    leaves = {n: torch.tensor(x[n]).to(torch.float32 if n == "initial_state" else dtype)
              .requires_grad_() for n in NAMES}
    o, h = torch_gdn.chunk_gated_delta_rule(*(leaves[n] for n in NAMES[:5]),
                                            initial_state=leaves["initial_state"],
                                            output_final_state=True, **kw)
    w = loss_weights(x)
    ((o.float() * torch.tensor(w["W_o"])).sum() + (h * torch.tensor(w["W_h"])).sum()).backward()
    return dict({n: leaves[n].grad for n in NAMES}, o=o, final_state=h)


def assert_all_close(ref, got, tol, state_tol=None, label=""):
    for name in ("o", "final_state") + NAMES:
        t = state_tol if (name == "final_state" and state_tol is not None) else tol
        assert_close(f"{label}{name if name in ('o', 'final_state') else 'd' + name}",
                     ref[name], got[name], t)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case,l2norm", CI_CASES + SLOW_CASES, ids=ids)
def test_jax_rule_matches_float64(case, l2norm):
    got = jax_run(inputs(case), jax_gdn.chunk_gated_delta_rule, use_qk_l2norm=l2norm,
                  chunk_size=case.chunk_size)
    assert_all_close(reference(case, l2norm), got, FP32_TOL)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case,l2norm", CI_CASES + SLOW_CASES, ids=ids)
def test_torch_rule_matches_float64(case, l2norm):
    got = torch_run(inputs(case), use_qk_l2norm=l2norm, chunk_size=case.chunk_size)
    assert_all_close(reference(case, l2norm), got, FP32_TOL)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case,l2norm", CI_CASES[:1], ids=ids)
def test_bf16_within_stated_tolerance(case, l2norm):
    x = bf16_rounded(inputs(case))
    kw = dict(use_qk_l2norm=l2norm, chunk_size=case.chunk_size)
    fp32 = {"jax": jax_run(x, jax_gdn.chunk_gated_delta_rule, **kw), "torch": torch_run(x, **kw)}
    bf16 = {"jax": jax_run(x, jax_gdn.chunk_gated_delta_rule, dtype=jnp.bfloat16, **kw),
            "torch": torch_run(x, dtype=torch.bfloat16, **kw)}
    for name in fp32:
        assert str(bf16[name]["o"].dtype).endswith("bfloat16"), name
        assert str(bf16[name]["final_state"].dtype).endswith("float32"), name
        # The fp32 rule on these inputs is itself within FP32_TOL of float64.
        assert_all_close(reference(case, l2norm, rounded=True), fp32[name], FP32_TOL, label=name)
        assert_all_close(fp32[name], bf16[name], BF16_TOL, BF16_STATE_TOL, label=f"{name} bf16 ")


def dot_generals(jaxpr):
    """Every dot_general equation of a jaxpr, nested ones (scan, custom_vjp, while) included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from dot_generals(inner)


@pytest.mark.timeout(60)
def test_jax_precision_by_input_dtype():
    # fp32 inputs: every matmul fp32 at HIGHEST. bf16 inputs: the output matmuls take bf16
    # operands (their autodiff transposes: a float32 cotangent and a bf16 operand), accumulate
    # in fp32 and are not forced to HIGHEST; every all-fp32 matmul (βKKᵀ, T, w, u, the pairs,
    # the state chain) keeps HIGHEST.
    case = RuleCase(1, 40, 1, 2, 16, 16, "weak", 16)
    x = inputs(case)
    for dtype in (jnp.float32, jnp.bfloat16):
        args = [jnp.asarray(x[n], jnp.float32 if n == "initial_state" else dtype) for n in NAMES]
        loss = jax_loss(jax_gdn.chunk_gated_delta_rule, loss_weights(x), use_qk_l2norm=True,
                        chunk_size=16)
        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=tuple(range(6)), has_aux=True))(*args)
        dots = list(dot_generals(jaxpr.jaxpr))
        low = [e for e in dots if any(v.aval.dtype == jnp.bfloat16 for v in e.invars)]
        fp32 = [e for e in dots if e not in low]
        assert fp32 and all(e.outvars[0].aval.dtype == jnp.float32 for e in dots)
        assert all(jax.lax.Precision.HIGHEST in (e.params["precision"] or ()) for e in fp32)
        if dtype == jnp.float32:
            assert not low
        else:  # q kᵀ, q̃ S, attn (u − w S) in forward, and their transposes
            assert sum(all(v.aval.dtype == jnp.bfloat16 for v in e.invars) for e in low) == 3
            assert all(jax.lax.Precision.HIGHEST not in (e.params["precision"] or ()) for e in low)


# ---- JAX CP modes at the rule level (virtual CPU chips) ----
CP_CASE = RuleCase(1, 192, 4, 8, 32, 16, "weak", 64, cosine=0.95)  # T/D = 96, 48: not ×64


@pytest.mark.timeout(240)
@pytest.mark.parametrize("D", [2, pytest.param(4, marks=pytest.mark.slow)], ids="D{}".format)
@pytest.mark.parametrize("mode", CP_MODES)
def test_jax_cp_modes_match_float64(mode, D):
    mesh = Mesh(np.array(jax.devices()[:D]), ("cp",))
    ref = reference(CP_CASE, True)
    rule = functools.partial(chunk_gated_delta_rule_cp, mesh=mesh, axis="cp", mode=mode)
    got = jax_run(inputs(CP_CASE), rule, use_qk_l2norm=True, chunk_size=CP_CASE.chunk_size)
    assert_all_close(ref, got, FP32_TOL, label=f"{mode} D{D} ")


# ---- the GDN layer of both frameworks, with weights whose keys share a direction ----
LAYER_CFG = GDNConfig(hidden_size=64, num_k_heads=2, num_v_heads=4, head_k_dim=32,
                      head_v_dim=16, conv_kernel_size=4, chunk_size=64)
LAYER_B, LAYER_T = 1, 150  # not a multiple of the chunk


def correlated_key_layer() -> tuple[GatedDeltaNet, torch.Tensor, torch.Tensor]:
    """A torch layer, its input and an output cotangent, such that the keys share a direction.

    The hidden states have a common component m·a; the key rows of in_proj_qkv are u_h ⊗ a
    (u_h one direction per key head) plus small noise, so every token's key ≈ silu(conv(u_h)·m);
    in_proj_b ∝ a makes β ≈ 0.95; small A gives weak decay, except head 3 (A = 8, strong).
    """
    cfg, gen = LAYER_CFG, torch.Generator().manual_seed(0)
    module = GatedDeltaNet(cfg)
    module.reset_parameters(generator=gen)
    D, kd = cfg.hidden_size, cfg.key_dim
    a_D = torch.nn.functional.normalize(torch.randn(D, generator=gen), dim=0)
    u_C = torch.randn(kd, generator=gen)
    with torch.no_grad():
        module.in_proj_qkv.weight[kd:2 * kd] = (torch.outer(u_C, a_D)
                                                + 0.05 * torch.randn(kd, D, generator=gen))
        module.in_proj_b.weight.copy_(torch.outer(torch.full((cfg.num_v_heads,), 1.0), a_D))
        module.A_log.copy_(torch.tensor([0.01, 0.02, 0.05, 8.0]).log())
        module.in_proj_a.weight.mul_(0.1)
    x = 3.0 * a_D + 0.3 * torch.randn(LAYER_B, LAYER_T, D, generator=gen)
    return module, x, torch.randn(LAYER_B, LAYER_T, D, generator=gen)


def float64_rule(q, k, v, g, beta, *, initial_state=None, output_final_state=False):
    """The torch layer's rule hook, run as the float64 recurrence (gradients in float64)."""
    o, h = torch_gdn.recurrent_gated_delta_rule(
        q.double(), k.double(), v.double(), g.double(), beta.double(),
        initial_state=None if initial_state is None else initial_state.double(),
        output_final_state=output_final_state, use_qk_l2norm=True)
    return o.to(q.dtype), h


def torch_layer_run(module, x, cotangent):
    x = x.clone().requires_grad_()
    module.zero_grad()
    y = module(x)
    y.backward(cotangent)
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


@functools.cache
def layer_reference():
    """(module, x, cotangent, keys' mean cosine, the float64-rule layer's y, dx, param grads)."""
    module, x, cotangent = correlated_key_layer()
    seen = {}

    def capture(q, k, v, g, beta, **kw):
        seen["k"] = torch.nn.functional.normalize(k.detach().double(), dim=-1)
        return float64_rule(q, k, v, g, beta, **kw)

    module.rule = capture  # instance attribute: shadows the chunked rule
    ref = torch_layer_run(module, x, cotangent)
    del module.rule
    k_BTGK = seen["k"]
    cos_GTT = torch.einsum("btgk,bsgk->gts", k_BTGK, k_BTGK)[..., ~torch.eye(LAYER_T, dtype=bool)]
    return module, x, cotangent, float(cos_GTT.mean()), ref


@pytest.mark.timeout(120)
def test_torch_layer_matches_float64_rule_layer():
    module, x, cotangent, cosine, (y_ref, dx_ref, grads_ref) = layer_reference()
    assert cosine > 0.8, f"keys of a head should share a direction: mean cosine {cosine:.2f}"
    y, dx, grads = torch_layer_run(module, x, cotangent)
    assert_close("y", y_ref, y, FP32_TOL)
    assert_close("dx", dx_ref, dx, LAYER_GRAD_TOL)
    for name, ref in grads_ref.items():
        assert_close(f"d{name}", ref, grads[name], LAYER_GRAD_TOL)


@pytest.mark.timeout(120)
def test_jax_layer_matches_float64_rule_layer():
    module, x, cotangent, _, (y_ref, dx_ref, grads_ref) = layer_reference()
    params = from_state_dict(module.state_dict())
    x_BTD, r_BTD = jnp.asarray(x.numpy()), jnp.asarray(cotangent.numpy())

    def callback_rule(q, k, v, g, beta, *, use_qk_l2norm, chunk_size):
        del chunk_size  # the float64 recurrence, on the host: forward only
        out = jax.ShapeDtypeStruct(v.shape, jnp.float32)
        o = jax.pure_callback(lambda *a: recurrent_gated_delta_rule_float64(
            *a, use_qk_l2norm=use_qk_l2norm)[0].astype(np.float32), out, q, k, v, g, beta)
        return o, None

    @jax.jit
    def run(params, x_BTD):
        y, vjp = jax.vjp(lambda p, x: gdn_layer(p, x, LAYER_CFG), params, x_BTD)
        return y, vjp(r_BTD), gdn_layer(params, x_BTD, LAYER_CFG, rule=callback_rule)

    y, (grad_params, dx), y_float64_rule = run(params, x_BTD)
    assert_close("y vs the JAX layer with the float64 rule", y_float64_rule, y, FP32_TOL)
    assert_close("y", y_ref, y, FP32_TOL)
    assert_close("dx", dx_ref, dx, LAYER_GRAD_TOL)
    grads = to_state_dict(grad_params)
    for name, ref in grads_ref.items():
        assert_close(f"d{name}", ref, grads[name], LAYER_GRAD_TOL)
