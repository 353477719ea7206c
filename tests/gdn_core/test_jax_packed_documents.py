"""Packed documents (cu_seqlens) in the JAX rule, layer and every CP mode × layout, on virtual
CPU chips.

Oracles: each document run alone (the first from initial_state, the others from zero state;
the final state is the last document's) and the token-by-token recurrence; under CP, the
single-chip rule or layer with the same cu_seqlens. Inputs are realistic (rule_inputs: keys of
a head sharing a direction, β ∈ U(0.5, 1); weak decay, so state would cross boundaries if it
could). Boundary sets (T = 96, C = 16; D = 2: t = 48, zigzag segments of 24): `spanning` — 1-token
documents at 5 and 32 (a chunk edge), a start inside a chunk (30), documents spanning the
zigzag chip edge 24, the contiguous chip edge 48 and the zigzag edge 72; `edges` — starts on
every segment edge (so every shard edge, both layouts), at 16 and 17. cu_seqlens is a traced
argument (both sets padded to one length with empty documents at T), so one compile per (D,
layout) serves both sets and all four modes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from gdn_core import jax_gdn
from gdn_core.config import GDNConfig
from gdn_core.cp_layout import LAYOUTS, shard_order
from gdn_core.cp_modes import CP_MODES
from gdn_core.jax_gdn.cp import chunk_gated_delta_rule_cp, gdn_layer_cp
from gdn_core.jax_gdn.layer import gdn_layer
from gdn_core.jax_gdn.params import init_layer_params
from gdn_core.testing import assert_close

from .rule_inputs import RuleCase, make_inputs

MODES = CP_MODES
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
CASE = RuleCase(1, 96, 2, 4, 16, 16, "weak", 16)
CFG = GDNConfig(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8,
                conv_kernel_size=4, chunk_size=16)
TOL = 1e-4
CHIPS = [2, pytest.param(4, marks=pytest.mark.slow)]
# zigzag by default: its shards hold two pieces each, so a document crosses more shard edges
# than under contiguous (slow: another compile of every mode, ~7 s).
CP_LAYOUTS = [pytest.param(layout, marks=[] if layout == "zigzag" else pytest.mark.slow)
              for layout in LAYOUTS]


def boundary_sets(D: int) -> dict[str, tuple[int, ...]]:
    T = CASE.T
    s = T // (2 * D)
    edges = (0, *sorted({s * i for i in range(1, 2 * D)} | {16, 17}), T)
    sets = {"spanning": (0, 5, 6, 30, 32, 33, 80, T), "edges": edges}
    width = max(len(c) for c in sets.values())  # pad with empty documents at T: one shape
    return {name: c + (T,) * (width - len(c)) for name, c in sets.items()}


@functools.cache
def rule_inputs():
    x = make_inputs(CASE)
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((1, CASE.T, CASE.Hv, CASE.Dv)).astype(np.float32),
         rng.standard_normal((1, CASE.Hv, CASE.Dk, CASE.Dv)).astype(np.float32))
    return [jnp.asarray(x[n]) for n in NAMES], tuple(jnp.asarray(a) for a in w)


def rule_loss(rule, order):
    """grad of Σ o·w + Σ h·w_h (w in `order`, as the sequence is fed) in q … h0; aux (o, h)."""
    _, (w_o, w_h) = rule_inputs()

    def loss(q, k, v, g, beta, h0, cu):
        o, h = rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                    use_qk_l2norm=True, chunk_size=CASE.chunk_size, cu_seqlens=cu)
        return jnp.sum(o * w_o[:, order]) + jnp.sum(h * w_h), (o, h)

    return jax.grad(loss, argnums=tuple(range(6)), has_aux=True)


@functools.cache
def single_chip(cu: tuple[int, ...]):
    args, _ = rule_inputs()
    loss = rule_loss(jax_gdn.chunk_gated_delta_rule, np.arange(CASE.T))
    grads, (o, h) = jax.jit(loss)(*args, jnp.asarray(cu))
    return o, h, grads


def documents_alone(cu: tuple[int, ...]):
    """grads, (o, h) with every document run alone by the rule without cu_seqlens."""
    args, (w_o, w_h) = rule_inputs()

    def loss(q, k, v, g, beta, h0):
        outputs, state = [], h0
        for i, (a, b) in enumerate(zip(cu, cu[1:])):
            if a == b:
                continue
            o, state = jax_gdn.chunk_gated_delta_rule(
                *(x[:, a:b] for x in (q, k, v, g, beta)), initial_state=state if i == 0 else None,
                output_final_state=True, use_qk_l2norm=True, chunk_size=CASE.chunk_size)
            outputs.append(o)
        o = jnp.concatenate(outputs, axis=1)
        return jnp.sum(o * w_o) + jnp.sum(state * w_h), (o, state)

    return jax.jit(jax.grad(loss, argnums=tuple(range(6)), has_aux=True))(*args)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("name", ["spanning", "edges"])
def test_packed_rule_equals_documents_alone_and_recurrence(name):
    cu = boundary_sets(2)[name]
    o, h, grads = single_chip(cu)
    grads_ref, (o_ref, h_ref) = documents_alone(cu)
    args, _ = rule_inputs()
    o_rec, h_rec = jax.jit(lambda *a: jax_gdn.recurrent_gated_delta_rule(
        *a[:5], initial_state=a[5], output_final_state=True, use_qk_l2norm=True,
        cu_seqlens=a[6]))(*args, jnp.asarray(cu))
    assert_close("o", o_ref, o, TOL)
    assert_close("o vs recurrence", o_rec, o, TOL)
    assert_close("final_state", h_ref, h, TOL)
    assert_close("final_state vs recurrence", h_rec, h, TOL)
    for n, ref, got in zip(NAMES, grads_ref, grads):
        assert_close(f"d{n}", ref, got, TOL)


@pytest.mark.timeout(120)
def test_packed_rule_matches_torch():
    """The same packed inputs through the PyTorch rule (outputs and final state)."""
    import torch

    from gdn_core.torch_gdn import chunk_gated_delta_rule as torch_rule

    cu = boundary_sets(2)["spanning"]
    o, h, _ = single_chip(cu)
    args, _ = rule_inputs()
    t = [torch.tensor(np.asarray(a)) for a in args]
    o_t, h_t = torch_rule(*t[:5], initial_state=t[5], output_final_state=True,
                          use_qk_l2norm=True, chunk_size=CASE.chunk_size,
                          cu_seqlens=torch.tensor(cu))
    assert_close("o", o_t.numpy(), o, TOL)
    assert_close("final_state", h_t.numpy(), h, TOL)


@functools.cache
def cp_rules(D: int, layout: str):
    """{(boundaries, mode): (o, h, grads)} in sequence order; one compile for all modes."""
    mesh = Mesh(np.array(jax.devices()[:D]), ("cp",))
    order = shard_order(chips=D, seq_len=CASE.T, layout=layout)
    args, _ = rule_inputs()
    sharded = [a[:, order] for a in args[:5]] + [args[5]]

    def every_mode(*a):
        return {mode: rule_loss(functools.partial(chunk_gated_delta_rule_cp, mesh=mesh,
                                                  axis="cp", mode=mode, layout=layout),
                                order)(*a) for mode in MODES}

    compiled = jax.jit(every_mode)
    back = np.argsort(order)
    results = {}
    for name, cu in boundary_sets(D).items():
        for mode, (grads, (o, h)) in compiled(*sharded, jnp.asarray(cu)).items():
            results[name, mode] = (o[:, back], h, [g[:, back] for g in grads[:5]] + [grads[5]])
    return results


@pytest.mark.timeout(300)
@pytest.mark.parametrize("D", CHIPS, ids="D{}".format)
@pytest.mark.parametrize("layout", CP_LAYOUTS)
def test_packed_cp_rule_matches_one_chip(layout, D):
    results = cp_rules(D, layout)
    for name, cu in boundary_sets(D).items():
        o_ref, h_ref, grads_ref = single_chip(cu)
        for mode in MODES:
            o, h, grads = results[name, mode]
            assert_close(f"{name} {mode} o", o_ref, o, TOL)
            assert_close(f"{name} {mode} final_state", h_ref, h, TOL)
            for n, ref, got in zip(NAMES, grads_ref, grads):
                assert_close(f"{name} {mode} d{n}", ref, got, TOL)


# --- the layer -------------------------------------------------------------------------------

@functools.cache
def layer_inputs():
    params = init_layer_params(CFG, jax.random.PRNGKey(0))
    params["A_log"] = jnp.log(jnp.linspace(0.005, 0.1, CFG.num_v_heads))  # slow decay
    rng = np.random.default_rng(2)
    x, w = (jnp.asarray(rng.standard_normal((1, CASE.T, CFG.hidden_size)), jnp.float32)
            for _ in range(2))
    return params, x, w


def layer_grads(layer, order):
    params, _, w = layer_inputs()

    def loss(params, x, cu):
        y = layer(params, x, CFG, cu_seqlens=cu)
        return jnp.sum(y * w[:, order]), y

    return jax.grad(loss, argnums=(0, 1), has_aux=True)


@functools.cache
def single_chip_layer(cu: tuple[int, ...]):
    params, x, _ = layer_inputs()
    return jax.jit(layer_grads(gdn_layer, np.arange(CASE.T)))(
        params, x, jnp.asarray(cu))


@pytest.mark.timeout(200)
def test_packed_layer_equals_documents_alone():
    cu = (0, 1, 30, 80, CASE.T)  # a 1-token document, a start inside a chunk, a chunk edge
    (d_params, dx), y = single_chip_layer(cu)
    params, x, w = layer_inputs()

    def alone(params, x):
        y = jnp.concatenate([gdn_layer(params, x[:, a:b], CFG) for a, b in zip(cu, cu[1:])
                             if a < b], axis=1)
        return jnp.sum(y * w), y

    grad_alone = jax.jit(jax.grad(alone, argnums=(0, 1), has_aux=True))
    (d_params_ref, dx_ref), y_ref = grad_alone(params, x)
    assert_close("y", y_ref, y, TOL)
    assert_close("dx", dx_ref, dx, TOL)
    for path, ref in jax.tree_util.tree_leaves_with_path(d_params_ref):
        got = functools.reduce(lambda t, k: t[k.key], path, d_params)
        assert_close(f"d{jax.tree_util.keystr(path)}", ref, got, TOL)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("D", CHIPS, ids="D{}".format)
@pytest.mark.parametrize("layout", CP_LAYOUTS)
def test_packed_cp_layer_matches_one_chip(layout, D):
    mesh = Mesh(np.array(jax.devices()[:D]), ("cp",))
    order = shard_order(chips=D, seq_len=CASE.T, layout=layout)
    params, x, _ = layer_inputs()

    def every_mode(params, x, cu):
        return {mode: layer_grads(functools.partial(gdn_layer_cp, mesh=mesh, axis="cp",
                                                    mode=mode, layout=layout), order)(
            params, x, cu) for mode in MODES}

    compiled = jax.jit(every_mode)
    back = np.argsort(order)
    for name, cu in boundary_sets(D).items():
        (d_params_ref, dx_ref), y_ref = single_chip_layer(cu)
        for mode, ((d_params, dx), y) in compiled(params, x[:, order], jnp.asarray(cu)).items():
            assert_close(f"{name} {mode} y", y_ref, y[:, back], TOL)
            assert_close(f"{name} {mode} dx", dx_ref, dx[:, back], TOL)
            for (path, ref), got in zip(jax.tree_util.tree_leaves_with_path(d_params_ref),
                                        jax.tree_util.tree_leaves(d_params)):
                assert_close(f"{name} {mode} d{jax.tree_util.keystr(path)}", ref, got, TOL)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("B", "cu", "message"), [
    (1, [0, 3, 7], "from 0 to seq_len=32"),
    (1, [0, 20, 3, 32], "non-decreasing"),
    (1, [0.0, 32.0], "integer"),
])
def test_bad_cu_seqlens_raise(B, cu, message):
    q = jnp.zeros((B, 32, 1, 16))
    rest = (jnp.zeros((B, 32, 2, 16)), jnp.zeros((B, 32, 2)), jnp.zeros((B, 32, 2)))
    with pytest.raises(ValueError, match=message):
        jax_gdn.chunk_gated_delta_rule(q, q, *rest, chunk_size=16, cu_seqlens=jnp.asarray(cu))
    mesh = Mesh(np.array(jax.devices()[:2]), ("cp",))
    with pytest.raises(ValueError, match=message):
        chunk_gated_delta_rule_cp(q, q, *rest, mesh=mesh, axis="cp", mode="p2p", chunk_size=16,
                                  cu_seqlens=jnp.asarray(cu))
