"""The JAX hybrid decoder (GDN + gated attention layers) against torch_gdn.HybridLanguageModel on
the same weights, through params.from_state_dict: logits, loss and every gradient (fp32).

The torch model is itself checked against transformers' Qwen3_5ForCausalLM
(test_torch_hybrid.py), so this chains the JAX model to transformers.
Legend: B batch, T tokens, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from gdn_core.config import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    AttentionConfig,
    GDNConfig,
    ModelConfig,
)
from gdn_core.jax_gdn.attention import causal_attention
from gdn_core.jax_gdn.model import model_forward, model_loss
from gdn_core.jax_gdn.params import from_state_dict, init_model_params, to_state_dict
from gdn_core.jax_gdn.train import make_optimizer, make_train_step
from gdn_core.testing import assert_close
from gdn_core.torch_gdn import HybridLanguageModel
from gdn_core.train_config import TrainConfig

LIN, FULL = LINEAR_ATTENTION, FULL_ATTENTION
V = 97
# GDN and full attention alternating (a block of 2 positions, 2 repeats under the scan), GQA 4:2,
# head_dim 16 with 8 rotated channels, Dk != Dv in the GDN layers.
MODEL = ModelConfig(
    name="jax-hybrid-test",
    gdn=GDNConfig(hidden_size=48, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=12,
                  conv_kernel_size=4, chunk_size=16),
    num_layers=4, intermediate_size=80, vocab_size=V, layers="hybrid",
    attention=AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10_000.0,
                              partial_rotary_factor=0.5, full_attention_interval=2))


def random_torch_model(cfg: ModelConfig, seed: int = 0) -> HybridLanguageModel:
    """Every weight random (norms away from their init so the (1 + w) convention matters)."""
    model = HybridLanguageModel(cfg, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("norm.weight"):
                p.copy_(0.3 * noise)
            elif name.endswith(("A_log", "dt_bias")):
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise * (0.3 if "conv1d" in name else 0.15))
    return model


def tokens(B: int, T: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, (B, T)).astype(np.int32)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tied", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["untied", "tied-head"])
def test_logits_loss_and_gradients_match_torch(tied):
    """T = 40 (not a multiple of the chunk): same logits, mean loss and every gradient. The
    logits with the default attention tiles (one tile of 40), loss and gradients with tiles of
    at most 10 tokens (T = 39: 4 tiles of 10, one padding token)."""
    cfg = dataclasses.replace(MODEL, tie_word_embeddings=tied)
    torch_model = random_torch_model(cfg)
    state = torch_model.state_dict()
    params = from_state_dict(state)
    if tied:  # the tree of a tied model has no head of its own (params.py)
        params.pop("lm_head")
    assert len(params["block"]) == 2  # the pattern's period: GDN position, attention position
    tokens_BT = tokens(2, 40)
    inputs_BT, targets_BT = tokens_BT[:, :-1], tokens_BT[:, 1:]

    def logits_loss_and_grads(params):
        loss, grads = jax.value_and_grad(
            lambda p: model_loss(p, inputs_BT, targets_BT, cfg, global_tokens=targets_BT.size,
                                 loss_chunk_tokens=24,
                                 attend_fn=partial(causal_attention, block=10)))(params)
        return model_forward(params, tokens_BT, cfg), loss, grads

    # One compile for logits, loss and gradients, unoptimised (same numerics, half the time).
    logits_BTV, jax_loss, grads = jax.jit(logits_loss_and_grads).lower(params).compile()(
        params)
    assert_close("logits", torch_model(torch.from_numpy(tokens_BT)), logits_BTV, 1e-4)
    loss = torch_model(torch.from_numpy(inputs_BT).long(), torch.from_numpy(targets_BT).long(),
                       loss_chunk_tokens=24) / targets_BT.size
    loss.backward()
    assert_close("loss", loss, jax_loss, 1e-5)
    jax_grads = to_state_dict(grads)
    assert set(jax_grads) == set(state)
    for name, p in torch_model.named_parameters():
        assert_close(f"grad {name}", p.grad, jax_grads[name], 1e-4)


@pytest.mark.timeout(60)
def test_state_dict_round_trips_and_init_loads_into_torch():
    state = random_torch_model(MODEL).state_dict()
    back = to_state_dict(from_state_dict(state))
    assert sorted(back) == sorted(state)
    assert all(np.array_equal(back[k], state[k].numpy()) for k in state)
    # A fresh JAX hybrid loads strictly into the torch model, and the pattern is the config's.
    fresh = to_state_dict(init_model_params(MODEL, jax.random.PRNGKey(0)))
    HybridLanguageModel(MODEL).load_state_dict({k: torch.from_numpy(np.array(v))
                                                for k, v in fresh.items()}, strict=True)
    kinds = [FULL if f"model.layers.{i}.self_attn.q_proj.weight" in fresh else LIN
             for i in range(MODEL.num_layers)]
    assert tuple(kinds) == MODEL.layer_pattern


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bfloat16_train_step_trains_the_hybrid_close_to_float32():
    """One jitted step (bf16, remat gdn, pattern LIN LIN LIN FULL: 4 block positions) on fresh
    JAX weights: finite new weights, and its loss within 2% of torch's fp32 loss on them."""
    cfg = dataclasses.replace(MODEL, attention=dataclasses.replace(
        MODEL.attention, full_attention_interval=4))
    params = init_model_params(cfg, jax.random.PRNGKey(0))
    assert len(params["block"]) == 4
    torch_model = HybridLanguageModel(cfg)
    torch_model.load_state_dict({k: torch.from_numpy(np.array(v))
                                 for k, v in to_state_dict(params).items()}, strict=True)
    tokens_BT1 = tokens(2, 33)
    inputs_BT, targets_BT = tokens_BT1[:, :-1], tokens_BT1[:, 1:]
    with torch.no_grad():
        fp32_loss = float(torch_model(torch.from_numpy(inputs_BT).long(),
                                      torch.from_numpy(targets_BT).long()) / targets_BT.size)
    train_cfg = TrainConfig(batch_size=2, seq_len=32, dtype="bfloat16", remat="gdn",
                            learning_rate=1e-3)
    args = (params, make_optimizer(train_cfg).init(params), inputs_BT, targets_BT)
    step = make_train_step(cfg, train_cfg, global_tokens=targets_BT.size)
    new_params, _, loss = step.lower(*args).compile()(*args)
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(new_params))
    assert abs(float(loss) - fp32_loss) < 2e-2 * fp32_loss
    assert abs(fp32_loss - np.log(V)) < 0.5  # a fresh model: about uniform
