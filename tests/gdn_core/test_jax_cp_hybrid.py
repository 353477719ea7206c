"""The JAX hybrid decoder (GDN + gated attention layers) under context parallelism: loss and
gradients against one chip for GDN mode × attention CP mode × layout, and one optimizer step
of make_cp_train_step against the one-chip step.

Compiles are the cost. The default tier covers every GDN mode, every attn_cp and both layouts
at D = 2 in a Latin-square subset, one compiled program per combination, and one optimizer step
without sharding or remat; `slow` runs the subset at D = 4, the full product at D = 2, 4 and 8
(several combinations per program) and the optimizer step with each sharding and remat.
Legend: B batch, T tokens, D chips.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gdn_core.config import AttentionConfig, GDNConfig, ModelConfig
from gdn_core.cp_layout import LAYOUTS, shard_order
from gdn_core.cp_modes import ATTN_CP_MODES, CP_MODES, CPSettings
from gdn_core.jax_gdn.cp.step import cp_training_inputs, make_cp_train_step, synthetic_batch
from gdn_core.jax_gdn.cp.verify import cp_loss_and_grads_fn
from gdn_core.jax_gdn.model import model_loss
from gdn_core.jax_gdn.params import init_model_params
from gdn_core.jax_gdn.train import make_optimizer, make_train_step
from gdn_core.testing import assert_close, max_verify_error
from gdn_core.train_config import TrainConfig

TOL = 1e-4
# One GDN layer then one attention layer (two block positions); GDN Hv = 8 and attention
# H = 8 split over 8 chips (ulysses), G = 2 KV heads (replicated for D > 2).
MODEL = ModelConfig(
    name="cp-hybrid-test",
    gdn=GDNConfig(hidden_size=32, num_k_heads=4, num_v_heads=8, head_k_dim=8, head_v_dim=8,
                  conv_kernel_size=4, chunk_size=16),
    num_layers=2, intermediate_size=64, vocab_size=64, layers="hybrid",
    attention=AttentionConfig(num_heads=8, num_kv_heads=2, head_dim=8, rope_theta=10_000.0,
                              partial_rotary_factor=0.5, full_attention_interval=2))
# T = 64: zigzag segments of 64/(2D) ≥ 4 tokens ≥ the conv halo (3) up to D = 8. lr as
# test_jax_cp_train.py (Adam's first step is ±lr; 1e-5 keeps sign flips of ~0 gradients small).
TRAIN = TrainConfig(batch_size=2, seq_len=64, learning_rate=1e-5, weight_decay=0.1, seed=3)

# Every GDN mode, attn_cp and layout at each D, in 4 combinations per D.
DEFAULT_CASES = {
    2: [("ulysses", "ring", "zigzag"), ("p2p", "all_gather_kv", "contiguous"),
        ("all_gather", "ulysses", "zigzag"), ("log_scan", "ring", "contiguous")],
    4: [("ulysses", "all_gather_kv", "contiguous"), ("p2p", "ring", "zigzag"),
        ("all_gather", "ring", "contiguous"), ("log_scan", "ulysses", "zigzag")],
}


def mesh_of(D):
    return Mesh(np.array(jax.devices()[:D]), ("cp",))


@functools.cache
def one_chip_loss_and_grads():
    params = init_model_params(MODEL, jax.random.PRNGKey(TRAIN.seed))
    tokens_BT1 = synthetic_batch(MODEL, TRAIN)
    loss, grads = jax.jit(jax.value_and_grad(
        lambda p: model_loss(p, tokens_BT1[:, :-1], tokens_BT1[:, 1:], MODEL,
                             global_tokens=TRAIN.batch_size * TRAIN.seq_len))).lower(
        params).compile()(params)
    return params, tokens_BT1, jax.device_get(loss), jax.device_get(grads)


def check_cases(D, cases, train_cfg=TRAIN):
    """Loss and every gradient of each (GDN mode, attn_cp, layout) against one chip, all the
    cases compiled as one program."""
    params, tokens_BT1, ref_loss, ref_grads = one_chip_loss_and_grads()
    mesh = mesh_of(D)
    fns = [cp_loss_and_grads_fn(MODEL, train_cfg, mesh=mesh, axis="cp",
                                cp=CPSettings(mode=mode, chips=D, attn_cp=attn_cp, layout=layout))
           for mode, attn_cp, layout in cases]
    orders = [shard_order(chips=D, seq_len=TRAIN.seq_len, layout=layout)
              for _, _, layout in cases]
    seq = NamedSharding(mesh, P(None, "cp"))
    batches = [tuple(jax.device_put(x[:, order], seq)
                     for x in (tokens_BT1[:, :-1], tokens_BT1[:, 1:])) for order in orders]
    replicated = jax.device_put(params, NamedSharding(mesh, P()))

    def all_cases(params, batches):
        return [fn(params, *batch) for fn, batch in zip(fns, batches)]

    results = jax.jit(all_cases).lower(replicated, batches).compile()(replicated, batches)
    for case, (loss, grads) in zip(cases, results):
        error = max_verify_error(ref_loss, loss, jax.tree.leaves(ref_grads),
                                 jax.tree.leaves(jax.device_get(grads)))
        assert error <= TOL, f"{case} D={D}: max relative error {error:.2e} > {TOL}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", DEFAULT_CASES[2], ids="-".join)
def test_each_mode_attn_cp_and_layout_equals_one_chip_on_2_chips(case):
    check_cases(2, [case])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_mode_attn_cp_and_layout_equals_one_chip_on_4_chips():
    check_cases(4, DEFAULT_CASES[4])


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("D", [2, 4, 8])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_full_product_equals_one_chip(D, layout):
    check_cases(D, [(mode, attn_cp, layout)
                    for mode, attn_cp in itertools.product(CP_MODES, ATTN_CP_MODES)])


def one_step(step, params, opt_state, inputs_BT, targets_BT):
    args = (params, opt_state, inputs_BT, targets_BT)
    return jax.device_get(step.lower(*args).compile()(*args))


@functools.cache
def one_chip_step(train_cfg):
    params = init_model_params(MODEL, jax.random.PRNGKey(train_cfg.seed))
    tokens_BT1 = synthetic_batch(MODEL, train_cfg)
    step = make_train_step(MODEL, train_cfg,
                           global_tokens=train_cfg.batch_size * train_cfg.seq_len)
    return one_step(step, params, make_optimizer(train_cfg).init(params), tokens_BT1[:, :-1],
                    tokens_BT1[:, 1:])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("D, mode, attn_cp, layout, sharding, remat", [
    # All in the slow tier (12 s and up): the default tier's hybrid cases are
    # test_each_mode_attn_cp_and_layout_equals_one_chip_on_2_chips, its optimizer steps
    # test_jax_cp_train.py's.
    pytest.param(2, "p2p", "ring", "zigzag", "replicated", "none", marks=pytest.mark.slow),
    pytest.param(2, "log_scan", "ring", "zigzag", "fsdp", "full", marks=pytest.mark.slow),
    pytest.param(4, "p2p", "ulysses", "zigzag", "zero1", "gdn", marks=pytest.mark.slow),
    pytest.param(4, "all_gather", "all_gather_kv", "contiguous", "replicated", "none",
                 marks=pytest.mark.slow),
])
def test_one_optimizer_step_equals_one_chip(D, mode, attn_cp, layout, sharding, remat):
    """make_cp_train_step (weights laid out by param_sharding, remat policy) on data fed by
    cp_training_inputs in the layout's order: loss, new weights and AdamW moments as one
    chip's step."""
    train_cfg = dataclasses.replace(TRAIN, param_sharding=sharding, remat=remat)
    ref_params, ref_opt, ref_loss = one_chip_step(dataclasses.replace(TRAIN, remat=remat))
    mesh = mesh_of(D)
    inputs = cp_training_inputs(MODEL, train_cfg, mesh=mesh, axis="cp", layout=layout)
    step = make_cp_train_step(MODEL, train_cfg, mesh=mesh, axis="cp",
                              cp=CPSettings(mode=mode, chips=D, attn_cp=attn_cp, layout=layout))
    params, opt_state, loss = one_step(step, *inputs)
    assert_close("loss", ref_loss, loss, TOL)
    for name, ref, got in zip(("params", "adam state"), (ref_params, ref_opt),
                              (params, opt_state)):
        for (path, r), g in zip(jax.tree_util.tree_leaves_with_path(ref), jax.tree.leaves(got)):
            if np.asarray(r).size > 1:
                assert_close(f"{name}{jax.tree_util.keystr(path)}", r, g, TOL)


@pytest.mark.timeout(60)
def test_bad_combinations_are_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"attn_cp='ring-ish' is not one of: all_gather_kv, "
                                         r"ring, ulysses"):
        make_cp_train_step(MODEL, TRAIN, mesh=mesh_of(2), axis="cp",
                           cp=CPSettings(mode="p2p", chips=2, attn_cp="ring-ish"))
    many_heads = dataclasses.replace(MODEL, attention=dataclasses.replace(MODEL.attention,
                                                                          num_heads=4))
    with pytest.raises(ValueError, match=r"query heads \(4\) divisible by chips=8"):
        make_cp_train_step(many_heads, TRAIN, mesh=mesh_of(8), axis="cp",
                           cp=CPSettings(mode="p2p", chips=8, attn_cp="ulysses"))
    with pytest.raises(ValueError, match="layout='spiral' is not one of"):
        make_cp_train_step(MODEL, TRAIN, mesh=mesh_of(2), axis="cp",
                           cp=CPSettings(mode="p2p", chips=2, layout="spiral"))
