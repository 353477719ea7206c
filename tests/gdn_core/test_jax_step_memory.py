"""What the JAX training step holds per chip: remat, the chunked loss, FSDP; flat HLO in depth.

Legend: B batch, T tokens (T_local per chip), D hidden / chips, L layers, V vocabulary,
P parameters. Programs are compiled, never run (the suite compiles without LLVM optimisation:
XLA's buffer assignment, which memory_analysis reads, is the same). Bytes are XLA's
memory_analysis per chip.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from gdn_core.config import GDNConfig, ModelConfig
from gdn_core.cp_modes import CPSettings
from gdn_core.jax_gdn.cp.step import cp_step_shapes, make_cp_train_step
from gdn_core.jax_gdn.hlo_comm import received_bytes_per_chip
from gdn_core.jax_gdn.model import model_loss
from gdn_core.jax_gdn.params import init_model_params
from gdn_core.jax_gdn.train import compiled_peak_bytes, make_optimizer, make_train_step
from gdn_core.testing import assert_close
from gdn_core.train_config import TrainConfig

GDN = GDNConfig(hidden_size=64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16,
                conv_kernel_size=4, chunk_size=16)
B, T = 1, 1024  # long enough that activations, not weights, set the single-chip figures


def model(num_layers, vocab_size=64, gdn=GDN, intermediate_size=128):
    return ModelConfig(name="memory-test", gdn=gdn, num_layers=num_layers,
                       intermediate_size=intermediate_size, vocab_size=vocab_size)


def param_shapes(model_cfg):
    return jax.eval_shape(lambda: init_model_params(model_cfg, jax.random.PRNGKey(0)))


@functools.cache
def grad_memory(num_layers, remat):
    """memory_analysis of jit(grad(model_loss)) on one chip."""
    model_cfg = model(num_layers)
    tokens_BT = jax.ShapeDtypeStruct((B, T), jnp.int32)
    grad = jax.jit(jax.grad(lambda p, i, t: model_loss(p, i, t, model_cfg, global_tokens=B * T,
                                                       remat=remat)))
    return grad.lower(param_shapes(model_cfg), tokens_BT, tokens_BT).compile().memory_analysis()


@pytest.mark.slow  # seven compiles; remat's memory runs by default in test_memory.py
@pytest.mark.timeout(240)
def test_remat_full_keeps_one_hidden_state_per_layer():
    hidden_bytes = B * T * GDN.hidden_size * 4  # the layer input the scan keeps (float32)
    growth = {remat: (grad_memory(6, remat).temp_size_in_bytes
                      - grad_memory(2, remat).temp_size_in_bytes) / 4
              for remat in ("none", "full", "gdn")}
    print(f"temp bytes per extra layer: {growth}; hidden state {hidden_bytes}")
    assert growth["full"] <= 1.05 * hidden_bytes
    # All of it: L hidden states plus one layer's whole working set (everything kept).
    assert grad_memory(6, "full").temp_size_in_bytes <= (
        6 * hidden_bytes + grad_memory(1, "none").temp_size_in_bytes)
    # remat gdn keeps the projections around the core (~10 hidden states' worth here), none
    # also the rule's and conv's residuals.
    assert growth["full"] < growth["gdn"] < growth["none"] / 3


@pytest.mark.slow  # 11 s; remat's gradients in the default tier: test_jax_cp_train.py (p2p, fsdp, full)
@pytest.mark.timeout(120)
def test_remat_leaves_loss_and_grads_unchanged():
    model_cfg = model(2)
    params = init_model_params(model_cfg, jax.random.PRNGKey(1))
    tokens = jax.random.randint(jax.random.PRNGKey(2), (B, 257), 0, model_cfg.vocab_size)

    @functools.partial(jax.jit, static_argnames="remat")
    def loss_and_grads(params, remat):
        return jax.value_and_grad(model_loss)(params, tokens[:, :-1], tokens[:, 1:], model_cfg,
                                              global_tokens=256, remat=remat)

    loss_ref, grads_ref = loss_and_grads(params, "none")
    for remat in ("full", "gdn"):
        loss, grads = loss_and_grads(params, remat)
        assert_close(f"{remat} loss", loss_ref, loss, 1e-6)
        for ref, got in zip(jax.tree.leaves(grads_ref), jax.tree.leaves(grads), strict=True):
            assert_close(f"{remat} grad", ref, got, 1e-6)


@pytest.mark.timeout(120)
def test_chunked_loss_holds_no_full_logits():
    # A vocabulary large enough that the logits would dominate the step (remat full keeps the
    # layer's share small).
    model_cfg = model(1, vocab_size=16384)
    batch, seq_len = 2, 256
    logits_bytes = batch * seq_len * model_cfg.vocab_size * 4  # B·T·V·4 = 32 MiB
    train_cfg = TrainConfig(batch_size=batch, seq_len=seq_len, remat="full")

    def step_temp_bytes(loss_chunk_tokens):
        params = param_shapes(model_cfg)
        opt_state = jax.eval_shape(make_optimizer(train_cfg).init, params)
        tokens_BT = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
        step = make_train_step(model_cfg, train_cfg, global_tokens=batch * seq_len,
                               loss_chunk_tokens=loss_chunk_tokens)
        compiled = step.lower(params, opt_state, tokens_BT, tokens_BT).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    chunked, whole = step_temp_bytes(64), step_temp_bytes(batch * seq_len)
    print(f"step temps: chunked {chunked}, one chunk {whole}, B·T·V·4 = {logits_bytes}")
    assert whole >= logits_bytes  # the check can fail: one chunk does hold the logits
    assert chunked < logits_bytes and whole - chunked >= logits_bytes


# FSDP at D = 8: weights heavier than activations, so sharding them shows.
FSDP_GDN = GDNConfig(hidden_size=128, num_k_heads=4, num_v_heads=8, head_k_dim=16,
                     head_v_dim=16, conv_kernel_size=4, chunk_size=16)
FSDP_MODEL = model(4, vocab_size=256, gdn=FSDP_GDN, intermediate_size=512)
FSDP_D, FSDP_T_LOCAL = 8, 32


@functools.cache
def cp_step(param_sharding, remat="full"):
    mesh = Mesh(np.array(jax.devices()[:FSDP_D]), ("cp",))
    train_cfg = TrainConfig(batch_size=1, seq_len=FSDP_D * FSDP_T_LOCAL,
                            param_sharding=param_sharding, remat=remat)
    return make_cp_train_step(FSDP_MODEL, train_cfg, mesh=mesh, axis="cp",
                              cp=CPSettings(mode="p2p", chips=FSDP_D)).lower(
        *cp_step_shapes(FSDP_MODEL, train_cfg, mesh=mesh, axis="cp")).compile()


def tree_bytes(tree):
    return 4 * sum(x.size for x in jax.tree.leaves(tree))


@pytest.mark.timeout(120)
def test_fsdp_peak_is_the_sharded_state_plus_two_layers():
    params = param_shapes(FSDP_MODEL)
    state_bytes = 4 * tree_bytes(params)  # float32 params, grads, AdamW mu and nu
    layer_bytes = tree_bytes(params["block"]) // FSDP_MODEL.num_layers
    top = params["embed_tokens"], params["lm_head"], params["norm"]
    replicated = compiled_peak_bytes(cp_step("replicated"))
    activations = replicated - state_bytes  # what the replicated step holds beyond its state
    # Embedding and LM head are gathered whole where used, with their whole gradients.
    bound = state_bytes / FSDP_D + 2 * layer_bytes + 2 * tree_bytes(top) + activations
    fsdp = compiled_peak_bytes(cp_step("fsdp"))
    print(f"peak per chip: replicated {replicated}, fsdp {fsdp}, bound {bound:.0f}")
    assert activations > 0 and replicated > bound  # the bound is below the replicated peak
    assert fsdp <= bound


@pytest.mark.timeout(120)
def test_fsdp_gathers_each_layer_inside_the_scan_body():
    ops = received_bytes_per_chip(cp_step("fsdp"), FSDP_D)["ops"]
    gathers = [op for op in ops if op["op"] == "all-gather"]
    in_loop = [op for op in gathers if op["times"] == FSDP_MODEL.num_layers]
    at_top = [op for op in gathers if op["times"] == 1]
    layer_leaves = len(jax.tree.leaves(param_shapes(FSDP_MODEL)["block"]))
    # Every layer leaf gathered in the layer scan's body, forward and again in backward; at the
    # top of the step only the embedding, the final norm and the LM head.
    assert len(in_loop) == 2 * layer_leaves, [(op["times"], op["operand_bytes"]) for op in gathers]
    assert len(at_top) == 3 and len(gathers) == len(in_loop) + len(at_top)
    # zero1 gathers its updated slices once, at the top (no loop).
    zero1 = [op for op in received_bytes_per_chip(cp_step("zero1"), FSDP_D)["ops"]
             if op["op"] == "all-gather"]
    assert zero1 and all(op["times"] == 1 for op in zero1)


@pytest.mark.timeout(240)
def test_hlo_size_flat_in_depth():
    train_cfg = TrainConfig(batch_size=1, seq_len=64, remat="full")

    def hlo_chars(num_layers):
        model_cfg = dataclasses.replace(model(num_layers), vocab_size=64)
        params = param_shapes(model_cfg)
        opt_state = jax.eval_shape(make_optimizer(train_cfg).init, params)
        tokens_BT = jax.ShapeDtypeStruct((1, 64), jnp.int32)
        lowered = make_train_step(model_cfg, train_cfg, global_tokens=64).lower(
            params, opt_state, tokens_BT, tokens_BT)
        return len(lowered.as_text())

    shallow, deep = hlo_chars(2), hlo_chars(16)
    print(f"lowered program text: 2 layers {shallow} chars, 16 layers {deep}")
    assert deep <= 1.01 * shallow  # only shape literals ([2, ...] vs [16, ...]) differ
