"""JAX context-parallel GDN layer and model forward against the single-chip ones.

Legend: B batch, T global tokens, D chips, Hk/Hv key/value heads, Dk/Dv head dims.
Oracle: gdn_core.jax_gdn.layer.gdn_layer (and model_forward) on the same global arrays. One jit
per (mode, layout) returns the output, the input gradient and every parameter gradient of
Σ y·w (w a fixed random weight, so every output element reaches the loss).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gdn_core.config import GDNConfig, ModelConfig
from gdn_core.cp_modes import CP_MODES
from gdn_core.jax_gdn.cp import cp_gdn_layer, cp_layer_fn, gdn_layer_cp
from gdn_core.jax_gdn.layer import gdn_layer
from gdn_core.jax_gdn.model import model_forward
from gdn_core.jax_gdn.params import init_layer_params, init_model_params
from gdn_core.testing import assert_close

# GQA r = 2, Dk ≠ Dv, heads divisible by 4 (ulysses); T/D = 60, 30 (15 under slow): never a
# multiple of the 16-token chunk, always at least the conv halo of 3.
CFG = GDNConfig(hidden_size=32, num_k_heads=4, num_v_heads=8, head_k_dim=8, head_v_dim=16,
                conv_kernel_size=4, chunk_size=16)
MODEL = ModelConfig(name="cp-test", gdn=CFG, num_layers=2, intermediate_size=64, vocab_size=64)
B, T = 2, 120
TOL = 1e-4
MODES = CP_MODES
# layout → (mesh shape, mesh axis names, the `axis` argument)
LAYOUTS = {"D2": ((2,), ("cp",), "cp"), "D4": ((4,), ("cp",), "cp"),
           "2x2-ba": ((2, 2), ("a", "b"), ("b", "a")), "D8": ((8,), ("cp",), "cp")}
CASES = [(mode, "D2") for mode in MODES]
# ulysses with fewer key heads than chips (their q, k conv channels copied), and Hk, D coprime.
GQA_CASES = [("D2", dataclasses.replace(CFG, num_k_heads=1, num_v_heads=4)),
             pytest.param("D4", dataclasses.replace(CFG, num_k_heads=2, num_v_heads=4),
                          marks=pytest.mark.slow),
             pytest.param("D4", dataclasses.replace(CFG, num_k_heads=3, num_v_heads=12),
                          marks=pytest.mark.slow)]
SLOW_CASES = [pytest.param(mode, layout, marks=pytest.mark.slow) for mode, layout in (
    *((mode, "D4") for mode in MODES), ("ulysses", "2x2-ba"), ("p2p", "2x2-ba"), ("p2p", "D8"), ("all_gather", "D8"),
    ("log_scan", "D8"))]


def mesh_of(layout):
    shape, names, axis = LAYOUTS[layout]
    devices = np.array(jax.devices()[:math.prod(shape)]).reshape(shape)
    return Mesh(devices, names), axis


@functools.cache
def layer_inputs(cfg=CFG):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = init_layer_params(cfg, keys[0])
    x_BTD = jax.random.normal(keys[1], (B, T, cfg.hidden_size), jnp.float32)
    w_BTD = jax.random.normal(keys[2], (B, T, cfg.hidden_size), jnp.float32)
    return params, x_BTD, w_BTD


def output_and_grads(layer, cfg=CFG):
    """(y, dx, dparams) of Σ layer(params, x)·w, one compile."""
    params, x_BTD, w_BTD = layer_inputs(cfg)

    def loss(params, x_BTD):
        y_BTD = layer(params, x_BTD, cfg)
        return jnp.sum(y_BTD * w_BTD), y_BTD

    (dparams, dx_BTD), y_BTD = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x_BTD)
    return y_BTD, dx_BTD, dparams


@functools.cache
def single_chip(cfg=CFG):
    return output_and_grads(gdn_layer, cfg)


def assert_layer_matches(y, dx, dparams, cfg=CFG):
    y_ref, dx_ref, dparams_ref = single_chip(cfg)
    assert_close("y", y_ref, y, TOL)
    assert_close("dx", dx_ref, dx, TOL)
    for path, ref in jax.tree_util.tree_leaves_with_path(dparams_ref):
        got = functools.reduce(lambda node, key: node[key.key], path, dparams)
        assert_close(f"d{jax.tree_util.keystr(path)}", ref, got, TOL)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode,layout", CASES + SLOW_CASES)
def test_cp_layer_matches_single_chip(mode, layout):
    mesh, axis = mesh_of(layout)
    y, dx, dparams = output_and_grads(functools.partial(gdn_layer_cp, mesh=mesh, axis=axis,
                                                        mode=mode))
    assert_layer_matches(y, dx, dparams)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout,cfg", GQA_CASES,
                         ids=lambda x: f"Hk{x.num_k_heads}-Hv{x.num_v_heads}"
                         if isinstance(x, GDNConfig) else x)
def test_ulysses_layer_gqa_heads(layout, cfg):
    """Every chip gets the q, k conv channels of the key heads its value heads use."""
    mesh, axis = mesh_of(layout)
    y, dx, dparams = output_and_grads(functools.partial(gdn_layer_cp, mesh=mesh, axis=axis,
                                                        mode="ulysses"), cfg)
    assert_layer_matches(y, dx, dparams, cfg)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,layout,T_bad,match", [
    ("ring", "D2", T, "mode='ring' is not one of: ulysses, p2p, all_gather, log_scan"),
    ("p2p", "D4", 122, "seq_len=122 is not divisible by chips=4"),
    ("log_scan", "D4", 8, (r"local shard of 2 tokens \(seq_len=8 / chips=4\) is shorter than "
                           r"the conv halo of 3 tokens \(conv_kernel_size=4\)")),
])
def test_validation_errors_name_numbers(mode, layout, T_bad, match):
    mesh, axis = mesh_of(layout)
    params, x_BTD, _ = layer_inputs()
    x_bad = jnp.zeros((B, T_bad, CFG.hidden_size), jnp.float32)
    with pytest.raises(ValueError, match=match):
        gdn_layer_cp(params, x_bad, CFG, mesh=mesh, axis=axis, mode=mode)
    if mode != "ring" and T_bad % mesh.size == 0:  # the per-shard entry point checks the same
        spec = P(None, axis)
        with pytest.raises(ValueError, match=match):
            jax.shard_map(functools.partial(cp_gdn_layer, cfg=CFG, axis=axis, mode=mode),
                          mesh=mesh, in_specs=(P(), spec), out_specs=spec)(params, x_bad)
    with pytest.raises(ValueError, match=r"axis='seq' must name axes of the mesh"):
        gdn_layer_cp(params, x_BTD, CFG, mesh=mesh, axis="seq", mode="p2p")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,layout", [("all_gather", "D2"),
                                         pytest.param("ulysses", "D4", marks=pytest.mark.slow)])
def test_cp_model_logits_match_single_chip(mode, layout):
    mesh, axis = mesh_of(layout)
    params = init_model_params(MODEL, jax.random.PRNGKey(1))
    tokens_BT = jax.random.randint(jax.random.PRNGKey(2), (B, T), 0, MODEL.vocab_size)
    spec = P(None, axis)
    cp_forward = jax.shard_map(
        functools.partial(model_forward, model_cfg=MODEL,
                          gdn_layer_fn=cp_layer_fn(axis=axis, mode=mode)),
        mesh=mesh, in_specs=(P(), spec), out_specs=spec)
    logits = jax.jit(cp_forward)(params, tokens_BT)
    logits_ref = jax.jit(functools.partial(model_forward, model_cfg=MODEL))(params, tokens_BT)
    assert logits.shape == (B, T, MODEL.vocab_size)
    assert_close("logits", logits_ref, logits, TOL)


@pytest.mark.timeout(60)
def test_ulysses_layer_value_heads_not_divisible():
    cfg = dataclasses.replace(CFG, num_k_heads=3, num_v_heads=6)
    mesh, axis = mesh_of("D4")
    params, x_BTD, _ = layer_inputs(cfg)
    with pytest.raises(ValueError, match=r"value heads \(6\) divisible by chips=4"):
        gdn_layer_cp(params, x_BTD, cfg, mesh=mesh, axis=axis, mode="ulysses")
