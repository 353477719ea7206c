"""MoE presets: memory counts the published experts, the step (and its time) is the stand-in's.

- parameter_count / active_parameter_count against transformers' own Qwen3-Next and Qwen3.5
  MoE models (built on the meta device: shapes only) and the published totals;
- predict_step_memory: the parameter parts grow by exactly the experts' parameters (counted
  here from the config numbers), the per-token parts stay the stand-in's, and fsdp divides
  the experts by the chips;
- the stand-in counting path (moe=None, every dense preset) counts what jax_gdn builds.
"""

from __future__ import annotations

import dataclasses

import jax
import pytest
import torch

from gdn_core.jax_gdn.params import init_model_params
from gdn_core.memory.parameters import active_parameter_count, parameter_count
from gdn_core.memory.step import predict_step_memory
from gdn_core.presets import PRESETS
from gdn_core.train_config import TrainConfig

import transformers  # noqa: E402

MOE_PRESETS = [name for name, cfg in PRESETS.items() if cfg.moe is not None]
DENSE_PRESETS = [name for name, cfg in PRESETS.items() if cfg.moe is None]
# Published totals (model cards: "N B in total"), in parameters.
PUBLISHED_TOTAL = {"qwen3-next-80b-a3b": 80e9, "qwen3.5-35b-a3b": 35e9,
                   "qwen3.5-122b-a10b": 122e9, "qwen3.5-397b-a17b": 397e9}
# The model cards' geometry of the two checkpoints transformers has no defaults for.
CARD_122B = dict(hidden_size=3072, num_hidden_layers=48, num_attention_heads=32,
                 linear_num_value_heads=64, num_experts=256, num_experts_per_tok=8,
                 moe_intermediate_size=1024, shared_expert_intermediate_size=1024)
CARD_397B = dict(CARD_122B, hidden_size=4096, num_hidden_layers=60, num_experts=512,
                 num_experts_per_tok=10)


def hf_model(name):
    """transformers' model of the preset's checkpoint; its defaults are the 80B-A3B's and
    the 35B-A3B's released configs."""
    if name == "qwen3-next-80b-a3b":
        return transformers.Qwen3NextForCausalLM, transformers.Qwen3NextConfig()
    config = {"qwen3.5-35b-a3b": {}, "qwen3.5-122b-a10b": CARD_122B,
              "qwen3.5-397b-a17b": CARD_397B}[name]
    return transformers.Qwen3_5MoeForCausalLM, transformers.Qwen3_5MoeTextConfig(**config)


def hf_counts(name) -> tuple[int, int, int]:
    """(total, active, embedding + LM head) parameters of the real model."""
    model_cls, config = hf_model(name)
    with torch.device("meta"):
        model = model_cls(config)
    total = experts = embedding = 0
    for param_name, param in model.named_parameters():
        total += param.numel()
        experts += param.numel() if ".mlp.experts." in param_name else 0
        embedding += param.numel() if "embed_tokens" in param_name or "lm_head" in param_name \
            else 0
    active = total - experts + experts * config.num_experts_per_tok // config.num_experts
    return total, active, embedding


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", MOE_PRESETS)
def test_parameter_counts_match_the_real_model(name):
    cfg = PRESETS[name]
    total, active, embedding = hf_counts(name)
    # Our step models every layer as a GDN layer, where 1 in 4 is gated attention: a GDN
    # layer's projections are a few M parameters larger (measured: 0.05-0.2% of the total,
    # 1-2% of the active count).
    assert parameter_count(cfg) == pytest.approx(total, rel=0.005)
    assert active_parameter_count(cfg) == pytest.approx(active, rel=0.03)
    assert parameter_count(cfg) == pytest.approx(PUBLISHED_TOTAL[name], rel=0.02)
    # The stand-in alone is a small fraction of the real model.
    assert parameter_count(dataclasses.replace(cfg, moe=None)) < 0.2 * parameter_count(cfg)
    if name == "qwen3-next-80b-a3b":
        # "A3B" is a rounded label: transformers' own model has 3.25B non-embedding active
        # parameters (3.9B with the embedding and LM head).
        assert (active_parameter_count(cfg) - embedding) == pytest.approx(3e9, rel=0.12)


def standin(cfg):
    return dataclasses.replace(cfg, moe=None)


def moe_mlp_minus_standin_mlp(cfg) -> int:
    """Elements one layer gains when the stand-in's SwiGLU is replaced by the published MoE
    block, from the config numbers: router, experts, shared expert and its gate."""
    E, moe = cfg.hidden_size, cfg.moe
    real = (E * moe.num_experts + moe.num_experts * 3 * E * moe.expert_intermediate_size
            + 3 * E * moe.shared_expert_intermediate_size + E)
    return real - 3 * E * cfg.intermediate_size


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("name", MOE_PRESETS)
def test_weights_and_optimizer_grow_by_the_experts(name, framework):
    cfg = PRESETS[name]
    train_cfg = TrainConfig(seq_len=4096, remat="full")
    moe = predict_step_memory(cfg, train_cfg, mode="p2p", chips=1, framework=framework)
    dense = predict_step_memory(standin(cfg), train_cfg, mode="p2p", chips=1,
                                framework=framework)
    assert (moe.mlp_params, dense.mlp_params) == ("experts", "dense")
    extra = cfg.num_layers * moe_mlp_minus_standin_mlp(cfg)
    # float32 weights and gradients, AdamW's m and v: 4 + 4 + 8 bytes per parameter.
    assert moe.weights - dense.weights == 4 * extra
    assert moe.grads - dense.grads == 4 * extra
    assert moe.optimizer_state - dense.optimizer_state == 8 * extra
    standin_params = dense.weights // 4
    factor = (standin_params + extra) / standin_params
    assert (moe.weights + moe.optimizer_state) / (dense.weights + dense.optimizer_state) == \
        pytest.approx(factor, rel=1e-12)
    assert factor > 5  # e.g. 80B vs 3.3B for Qwen3-Next
    # Per active token the stand-in matches the real model: those parts are unchanged.
    for part in ("activations", "backward_working", "exchange_buffers", "loss_logits"):
        assert getattr(moe, part) == getattr(dense, part), part


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("chips", [2, 8, 64])
def test_fsdp_divides_the_experts_by_the_chips(chips, framework):
    cfg = PRESETS["qwen3-next-80b-a3b"]

    def experts_bytes(sharding):
        train_cfg = TrainConfig(seq_len=chips * 1024, param_sharding=sharding)
        moe, dense = (predict_step_memory(c, train_cfg, mode="p2p", chips=chips,
                                          framework=framework) for c in (cfg, standin(cfg)))
        return moe.weights - dense.weights, moe.optimizer_state - dense.optimizer_state

    whole_weights, whole_state = experts_bytes("replicated")
    assert whole_weights == 4 * cfg.num_layers * moe_mlp_minus_standin_mlp(cfg)
    fsdp_weights, fsdp_state = experts_bytes("fsdp")
    # rel: FSDP2 pads the shared expert's [1, E] gate along dim 0 rather than splitting it.
    assert fsdp_weights == pytest.approx(whole_weights / chips, rel=1e-4)
    assert fsdp_state == pytest.approx(whole_state / chips, rel=1e-4)
    zero1_weights, _ = experts_bytes("zero1")
    assert zero1_weights == whole_weights  # zero1 shards the optimizer state only


def built_parameter_count(cfg) -> int:
    """Parameters jax_gdn initialises for cfg (shapes only, nothing allocated)."""
    shapes = jax.eval_shape(lambda key: init_model_params(cfg, key), jax.random.PRNGKey(0))
    return sum(leaf.size for leaf in jax.tree_util.tree_leaves(shapes))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", DENSE_PRESETS + MOE_PRESETS)
def test_the_standin_path_counts_what_the_step_builds(name):
    # Dense presets (and a MoE preset with moe=None) are counted as before: the parameters
    # the compute path builds, whole under replicated.
    cfg = PRESETS[name] if name in DENSE_PRESETS else standin(PRESETS[name])
    built = built_parameter_count(dataclasses.replace(cfg, num_layers=2))
    assert parameter_count(dataclasses.replace(cfg, num_layers=2)) == built
    prediction = predict_step_memory(dataclasses.replace(cfg, num_layers=2),
                                     TrainConfig(seq_len=1024), mode="p2p", chips=1,
                                     framework="jax")
    assert prediction.weights == prediction.grads == 4 * built
    assert prediction.optimizer_state == 8 * built and prediction.mlp_params == "dense"
    if name in MOE_PRESETS:
        assert built < parameter_count(dataclasses.replace(PRESETS[name], num_layers=2))


def test_moe_notes_say_the_step_time_is_the_standins():
    for name in MOE_PRESETS:
        cfg = PRESETS[name]
        assert cfg.intermediate_size == cfg.moe.active_intermediate_size
        assert "step time and FLOPs are the stand-in's" in cfg.note
        assert cfg.moe.source in cfg.note
    # Where a number is not read from the released config, the source says so.
    for name in ("qwen3.5-122b-a10b", "qwen3.5-397b-a17b"):
        assert "shared expert width 1024 assumed" in PRESETS[name].moe.source
