"""HybridLanguageModel against transformers' Qwen3_5ForCausalLM, ModelConfig.from_hf's
attention geometry, and the presets' published attention geometry.

Legend: B batch, T tokens, V vocabulary.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gdn_core.config import FULL_ATTENTION, LINEAR_ATTENTION, AttentionConfig, ModelConfig
from gdn_core.presets import PRESETS, get_preset
from gdn_core.testing import assert_close
from gdn_core.torch_gdn import GatedAttention, GatedDeltaNet, HybridLanguageModel

import transformers  # noqa: E402
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM  # noqa: E402

LIN, FULL = LINEAR_ATTENTION, FULL_ATTENTION
V = 97
# A small decoder with full attention at layers 1 and 4 (not an interval pattern), GQA 4:2,
# head_dim 16 of which 8 channels rotate, Dk != Dv in the GDN layers.
TINY_HF = dict(
    vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=5,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=12, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
    layer_types=[LIN, FULL, LIN, LIN, FULL],
    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0,
                     "partial_rotary_factor": 0.5})


def tiny_hf_config(**changes):
    return transformers.Qwen3_5TextConfig(**(TINY_HF | changes))


def random_hf_model(hf_config, seed: int = 0, key_cosine: float = 0.8) -> Qwen3_5ForCausalLM:
    """transformers' model (eager attention) with every parameter random, not its init values:
    norm weights away from 0 so the (1 + weight) convention is exercised, and embedding rows
    sharing one direction (cosine ≈ key_cosine), so the GDN layers' keys do too, as a trained
    model's (tests/gdn_core/rule_inputs.py)."""
    hf_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(hf_config)
    gen = torch.Generator().manual_seed(seed)
    scales = {"A_log": 0.5, "dt_bias": 0.5, "conv1d.weight": 0.3}
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            leaf = name.split(".", 3)[-1] if ".layers." in name else name
            if name.endswith("linear_attn.norm.weight"):  # plain-weight gated norm
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("norm.weight"):  # zero-centred norms
                p.copy_(0.3 * noise)
            else:
                p.copy_(noise * scales.get(leaf.split(".", 1)[-1], 0.15))
        embed = model.model.embed_tokens.weight
        direction = F.normalize(torch.randn(embed.shape[1], generator=gen), dim=0)
        rows = F.normalize(embed, dim=1)
        embed.copy_(F.normalize(key_cosine * direction + (1 - key_cosine ** 2) ** 0.5 * rows,
                                dim=1) * embed.shape[1] ** 0.5 * 0.3)
    return model


def ours_from(hf_model, chunk_size: int = 16) -> HybridLanguageModel:
    model = HybridLanguageModel(ModelConfig.from_hf(hf_model.config, chunk_size=chunk_size))
    model.load_state_dict(hf_model.state_dict(), strict=True)
    return model


def random_tokens(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.timeout(60)
def test_state_dict_round_trips_strictly():
    hf = random_hf_model(tiny_hf_config())
    ours = ours_from(hf)
    assert list(ours.state_dict()) == list(hf.state_dict())
    fresh = Qwen3_5ForCausalLM(tiny_hf_config())
    fresh.load_state_dict(ours.state_dict(), strict=True)
    for name, value in hf.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    kinds = [LIN if isinstance(getattr(layer, "linear_attn", None), GatedDeltaNet) else
             FULL if isinstance(getattr(layer, "self_attn", None), GatedAttention) else None
             for layer in ours.model.layers]
    assert kinds == TINY_HF["layer_types"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied-head"])
def test_logits_loss_and_gradients_match_transformers(tied):
    """fp32, T = 40 (not a multiple of the GDN chunk 16): the same logits, the same mean loss
    (ours: the chunked sum over shifted targets) and the same gradient of every parameter."""
    hf = random_hf_model(tiny_hf_config(tie_word_embeddings=tied))
    ours = ours_from(hf)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tied
    tokens_BT = random_tokens(2, 40)

    hf_out = hf(tokens_BT, labels=tokens_BT)
    assert_close("logits", hf_out.logits, ours(tokens_BT), 1e-4)

    # transformers shifts the labels itself; our loss takes the next-token targets.
    inputs_BT, targets_BT = tokens_BT[:, :-1], tokens_BT[:, 1:]
    loss = ours(inputs_BT, targets_BT, loss_chunk_tokens=24) / targets_BT.numel()
    assert_close("loss", hf_out.loss, loss, 1e-5)
    hf_out.loss.backward()
    loss.backward()
    hf_grads = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        assert_close(f"grad {name}", hf_grads[name].grad, p.grad, 1e-4)
    assert len(dict(ours.named_parameters())) == len(hf_grads)


@pytest.mark.timeout(60)
def test_bfloat16_autocast_trains_close_to_float32():
    model = HybridLanguageModel(get_preset("tiny", layers="hybrid"))
    tokens_BT = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits_BTV = model(tokens_BT)
        loss = model(tokens_BT[:, :-1], tokens_BT[:, 1:])
    loss.backward()
    assert logits_BTV.dtype == torch.float32 and loss.dtype == torch.float32
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert_close("bf16 logits vs fp32", model(tokens_BT), logits_BTV, 2e-2)


@pytest.mark.timeout(60)
def test_from_hf_reads_the_attention_geometry():
    hf = tiny_hf_config(tie_word_embeddings=True)
    cfg = ModelConfig.from_hf(transformers.Qwen3_5Config(text_config=hf.to_dict()),
                              chunk_size=32, name="tiny-hf")
    assert cfg.attention == AttentionConfig(
        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10_000.0,
        partial_rotary_factor=0.5, full_attention_interval=2, attention_bias=False)
    assert cfg.attention.rotary_dim == 8
    assert (cfg.name, cfg.layers, cfg.num_layers, cfg.intermediate_size, cfg.vocab_size) == (
        "tiny-hf", "hybrid", 5, 80, V)
    assert cfg.tie_word_embeddings and cfg.moe is None and cfg.gdn.chunk_size == 32
    # Not the interval pattern: the config's own list is kept, and is the decoder's.
    assert cfg.layer_types == tuple(TINY_HF["layer_types"]) == cfg.layer_pattern

    interval = ModelConfig.from_hf(tiny_hf_config(layer_types=None, num_hidden_layers=6,
                                                  full_attention_interval=3))
    assert interval.layer_types is None and interval.attention.full_attention_interval == 3
    assert interval.layer_pattern == (LIN, LIN, FULL, LIN, LIN, FULL)


@pytest.mark.timeout(60)
def test_from_hf_reads_a_moe_model_as_its_dense_stand_in():
    hf = transformers.Qwen3NextConfig(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        head_dim=32, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=24,
        shared_expert_intermediate_size=40,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25})
    cfg = ModelConfig.from_hf(hf)
    assert (cfg.attention.num_heads, cfg.attention.num_kv_heads, cfg.attention.head_dim,
            cfg.attention.rope_theta, cfg.attention.rotary_dim) == (8, 2, 32, 1e6, 8)
    assert cfg.layer_pattern == (LIN, LIN, LIN, FULL)
    assert cfg.intermediate_size == 4 * 24 + 40 and cfg.moe.num_experts == 16
    assert "dense SwiGLU stand-in" in cfg.note
    assert "dense SwiGLU stand-in" in repr(HybridLanguageModel(cfg))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hf_config, match", [
    (lambda: transformers.Qwen3_5TextConfig(rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e7, "factor": 4.0,
        "original_max_position_embeddings": 262144}),
     "rope_type='yarn' is not supported; expected 'default'"),
    (lambda: transformers.Qwen3NextConfig(mlp_only_layers=[0]),
     r"mixes dense and MoE layers \(mlp_only_layers=\[0\]"),
    (lambda: transformers.LlamaConfig(), "LlamaConfig is not a Qwen3.5"),
], ids=["yarn", "mixed-moe", "llama"])
def test_from_hf_rejects_what_it_cannot_model(hf_config, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(hf_config())


# The published models' geometry, as this test reads the sources cited in presets.py:
# hidden, layers, GDN (Hk, Hv), MLP width or MoE (experts, per token, width, shared), vocab,
# attention heads, KV heads. Every model: head_dim 256, factor 0.25, rope_theta 1e7, 3:1.
PUBLISHED = {
    "qwen3.5-0.8b": (1024, 24, (16, 16), 3584, 248_320, 8, 2),
    "qwen3.5-4b": (2560, 32, (16, 32), 9216, 248_320, 16, 4),
    "qwen3.5-9b": (4096, 32, (16, 32), 12288, 248_320, 16, 4),
    "qwen3.5-27b": (5120, 64, (16, 48), 17408, 248_320, 24, 4),
    "qwen3.5-35b-a3b": (2048, 40, (16, 32), (256, 8, 512, 512), 248_320, 16, 2),
    "qwen3.5-122b-a10b": (3072, 48, (16, 64), (256, 8, 1024, 1024), 248_320, 32, 2),
    "qwen3.5-397b-a17b": (4096, 60, (16, 64), (512, 10, 1024, 1024), 248_320, 32, 2),
    "qwen3-next-80b-a3b": (2048, 48, (16, 32), (512, 10, 512, 512), 151_936, 16, 2),
}


def published_hf_config(name: str):
    """A transformers config with the published values, as its config.json spells them."""
    hidden, layers, (k_heads, v_heads), mlp, vocab, heads, kv_heads = PUBLISHED[name]
    fields = dict(
        hidden_size=hidden, num_hidden_layers=layers, vocab_size=vocab,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=256,
        linear_num_key_heads=k_heads, linear_num_value_heads=v_heads, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4,
        layer_types=[FULL if i % 4 == 3 else LIN for i in range(layers)],
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0,
                         "partial_rotary_factor": 0.25})
    if isinstance(mlp, int):
        return transformers.Qwen3_5TextConfig(intermediate_size=mlp, **fields)
    experts, per_token, width, shared = mlp
    moe = dict(num_experts=experts, num_experts_per_tok=per_token, moe_intermediate_size=width,
               shared_expert_intermediate_size=shared)
    if name.startswith("qwen3-next"):
        return transformers.Qwen3NextConfig(**fields, **moe)
    fields["rope_parameters"] |= {"mrope_section": [11, 11, 10], "mrope_interleaved": True}
    return transformers.Qwen3_5MoeTextConfig(**fields, **moe)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_attention_geometry_is_what_from_hf_reads_from_the_published_config(name):
    read = ModelConfig.from_hf(published_hf_config(name), name=name)
    preset = get_preset(name)
    assert preset.attention == read.attention
    assert (preset.gdn, preset.num_layers, preset.intermediate_size, preset.vocab_size) == (
        read.gdn, read.num_layers, read.intermediate_size, read.vocab_size)
    assert read.layer_types is None  # the published pattern is the interval's
    assert get_preset(name, layers="hybrid").layer_pattern == read.layer_pattern
    if preset.moe is not None:
        assert dataclasses.replace(preset.moe, source="-") == dataclasses.replace(read.moe,
                                                                                  source="-")


@pytest.mark.timeout(60)
def test_presets_stay_gdn_only_and_hybrid_follows_the_pattern():
    for cfg in PRESETS.values():
        assert cfg.layers == "gdn_only" and cfg.layer_pattern == (LIN,) * cfg.num_layers
        assert cfg.attention is not None
    hybrid = get_preset("qwen3.5-9b", layers="hybrid", num_layers=10)
    assert [i for i, kind in enumerate(hybrid.layer_pattern) if kind == FULL] == [3, 7]
    tiny = HybridLanguageModel(get_preset("tiny", layers="hybrid"), seed=3)
    assert [hasattr(layer, "self_attn") for layer in tiny.model.layers] == [False, True]
    gdn_only = HybridLanguageModel(get_preset("tiny"))
    assert [hasattr(layer, "linear_attn") for layer in gdn_only.model.layers] == [True, True]
    # Seeded init: zero-centred norms at 0, the same seed the same weights.
    again = HybridLanguageModel(get_preset("tiny", layers="hybrid"), seed=3).state_dict()
    state = tiny.state_dict()
    assert all(torch.equal(state[k], again[k]) for k in state)
    assert torch.equal(state["model.layers.1.self_attn.q_norm.weight"], torch.zeros(16))
    assert abs(state["model.layers.1.self_attn.q_proj.weight"].std().item() - 0.02) < 3e-3
    logits_BTV = tiny(torch.zeros(1, 5, dtype=torch.long))
    assert logits_BTV.shape == (1, 5, 256) and logits_BTV.dtype == torch.float32


@pytest.mark.timeout(60)
@pytest.mark.parametrize("build, match", [
    (lambda: AttentionConfig(num_heads=6, num_kv_heads=4),
     "num_heads=6 must be a multiple of num_kv_heads=4"),
    (lambda: AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=12,
                             partial_rotary_factor=0.25),
     "head_dim=12 × partial_rotary_factor=0.25 = 3 rotated"),
    (lambda: AttentionConfig(num_heads=4, num_kv_heads=2, partial_rotary_factor=1.5),
     r"partial_rotary_factor=1.5 must be in \(0, 1\]"),
    (lambda: dataclasses.replace(get_preset("tiny"), attention=None, layers="hybrid"),
     "layers='hybrid' needs the attention geometry"),
    (lambda: get_preset("tiny", layers="both"), "layers='both' is not one of: gdn_only, hybrid"),
    (lambda: dataclasses.replace(get_preset("tiny"), layer_types=(LIN,)),
     "must list num_layers=2 entries"),
], ids=["gqa", "odd-rotary", "factor", "hybrid-without-attention", "layers", "pattern-length"])
def test_bad_attention_settings_are_refused(build, match):
    with pytest.raises(ValueError, match=match):
        build()
