"""GDNConfig / ModelConfig validation, reading transformers configs, and the published presets."""

from __future__ import annotations

import pytest

from gdn_core.config import GDNConfig, ModelConfig, MoEConfig
from gdn_core.presets import PRESETS, get_preset

import transformers  # noqa: E402

QWEN35_VOCAB, QWEN3_NEXT_VOCAB = 248_320, 151_936
# name: (hidden, layers, k heads, v heads, FFN or MoE, vocab); Dk = Dv = 128, conv 4.
# MoE: (experts, routed per token, expert width, shared expert width) from the model cards.
PUBLISHED = {
    "qwen3.5-0.8b": (1024, 24, 16, 16, 3584, QWEN35_VOCAB),
    "qwen3.5-4b": (2560, 32, 16, 32, 9216, QWEN35_VOCAB),
    "qwen3.5-9b": (4096, 32, 16, 32, 12288, QWEN35_VOCAB),
    "qwen3.5-27b": (5120, 64, 16, 48, 17408, QWEN35_VOCAB),
    "qwen3.5-35b-a3b": (2048, 40, 16, 32, (256, 8, 512, 512), QWEN35_VOCAB),
    "qwen3.5-122b-a10b": (3072, 48, 16, 64, (256, 8, 1024, 1024), QWEN35_VOCAB),
    "qwen3.5-397b-a17b": (4096, 60, 16, 64, (512, 10, 1024, 1024), QWEN35_VOCAB),
    "qwen3-next-80b-a3b": (2048, 48, 16, 32, (512, 10, 512, 512), QWEN3_NEXT_VOCAB),
}
SMALL = dict(hidden_size=96, linear_num_key_heads=3, linear_num_value_heads=6,
             linear_key_head_dim=8, linear_value_head_dim=24, linear_conv_kernel_dim=3,
             rms_norm_eps=1e-5)
SMALL_GDN = GDNConfig(hidden_size=96, num_k_heads=3, num_v_heads=6, head_k_dim=8, head_v_dim=24,
                      conv_kernel_size=3, chunk_size=32, rms_norm_eps=1e-5)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["Qwen3_5TextConfig", "Qwen3_5Config", "Qwen3NextConfig"])
def test_from_hf_reads_linear_attention_fields(kind):
    if kind == "Qwen3_5Config":
        hf = transformers.Qwen3_5Config(text_config=SMALL)
    else:
        hf = getattr(transformers, kind)(**SMALL)
    assert GDNConfig.from_hf(hf, chunk_size=32) == SMALL_GDN


@pytest.mark.timeout(30)
def test_from_hf_defaults_match_the_presets():
    assert GDNConfig.from_hf(transformers.Qwen3_5TextConfig()) == PRESETS["qwen3.5-9b"].gdn
    assert GDNConfig.from_hf(transformers.Qwen3NextConfig()) == PRESETS["qwen3-next-80b-a3b"].gdn


def moe_numbers(moe: MoEConfig) -> tuple[int, int, int, int]:
    return (moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size,
            moe.shared_expert_intermediate_size)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind, name", [("Qwen3NextConfig", "qwen3-next-80b-a3b"),
                                        ("Qwen3_5MoeTextConfig", "qwen3.5-35b-a3b")])
def test_transformers_moe_defaults_match_the_presets(kind, name):
    # transformers documents these defaults as the 80B-A3B's and the 35B-A3B's config.
    hf = getattr(transformers, kind)()
    assert moe_numbers(PRESETS[name].moe) == (
        hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size,
        hf.shared_expert_intermediate_size)
    assert (PRESETS[name].hidden_size, PRESETS[name].num_layers) == (hf.hidden_size,
                                                                     hf.num_hidden_layers)
    assert not getattr(hf, "mlp_only_layers", [])  # every layer is a MoE layer


@pytest.mark.timeout(30)
def test_from_hf_rejects_a_config_without_linear_attention():
    with pytest.raises(ValueError, match="LlamaConfig is not a Qwen3.5.*'linear_num_key_heads'"):
        GDNConfig.from_hf(transformers.LlamaConfig())


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_has_published_geometry(name):
    hidden, layers, k_heads, v_heads, ffn, vocab = PUBLISHED[name]
    cfg = get_preset(name)
    assert cfg.name == name
    assert (cfg.hidden_size, cfg.num_layers, cfg.vocab_size) == (hidden, layers, vocab)
    gdn = cfg.gdn
    assert (gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim,
            gdn.conv_kernel_size) == (k_heads, v_heads, 128, 128, 4)
    if isinstance(ffn, int):
        assert cfg.intermediate_size == ffn and cfg.moe is None
    else:  # MoE: the dense stand-in is as wide as the experts one token passes through
        assert moe_numbers(cfg.moe) == ffn
        _, per_token, width, shared = ffn
        assert cfg.intermediate_size == per_token * width + shared
        assert "MoE" in cfg.note and cfg.moe.source


@pytest.mark.timeout(30)
def test_every_preset_is_covered():
    assert set(PRESETS) == set(PUBLISHED) | {"tiny"}


@pytest.mark.timeout(30)
def test_get_preset_overrides_and_rejects_unknown_names():
    cfg = get_preset("qwen3.5-27b", num_layers=2, vocab_size=1000, chunk_size=128)
    assert (cfg.num_layers, cfg.vocab_size, cfg.gdn.chunk_size) == (2, 1000, 128)
    assert cfg.hidden_size == 5120 and cfg.intermediate_size == 17408
    assert get_preset("qwen3.5-27b").num_layers == 64  # the table itself is untouched
    with pytest.raises(ValueError, match="preset='qwen9' is not one of: .*qwen3.5-0.8b.*tiny"):
        get_preset("qwen9")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("changes,match", [
    (dict(num_v_heads=3), "num_v_heads=3 must be a multiple of num_k_heads=2"),
    (dict(chunk_size=48), r"chunk_size=48 is not one of \(16, 32, 64, 128\)"),
    (dict(head_k_dim=0), "head_k_dim=0 must be a positive integer"),
    (dict(hidden_size=64.0), "hidden_size=64.0 must be a positive integer"),
], ids=["Hv3-Hk2", "C48", "Dk0", "D-float"])
def test_gdn_config_rejects_bad_values(changes, match):
    base = dict(hidden_size=64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16)
    with pytest.raises(ValueError, match=match):
        GDNConfig(**(base | changes))


@pytest.mark.timeout(30)
def test_derived_widths_and_model_config_validation():
    gdn = GDNConfig(hidden_size=64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=32)
    assert (gdn.key_dim, gdn.value_dim, gdn.conv_dim) == (32, 128, 192)
    with pytest.raises(ValueError, match="ModelConfig.vocab_size=0 must be a positive integer"):
        ModelConfig(name="custom", gdn=gdn, num_layers=1, intermediate_size=8, vocab_size=0)
    with pytest.raises(ValueError, match="ModelConfig.moe=8 must be a MoEConfig or None"):
        ModelConfig(name="custom", gdn=gdn, num_layers=1, intermediate_size=8, vocab_size=8,
                    moe=8)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("changes,match", [
    (dict(num_experts=0), "MoEConfig.num_experts=0 must be a positive integer"),
    (dict(experts_per_token=9), "experts_per_token=9 exceeds num_experts=8"),
    (dict(shared_expert_intermediate_size=-1),
     "shared_expert_intermediate_size=-1 must be a non-negative integer"),
    (dict(expert_intermediate_size=True), "expert_intermediate_size=True must be a positive"),
    (dict(source=" "), "MoEConfig.source must name where the numbers come from"),
], ids=["no-experts", "top-k-over", "shared-negative", "width-bool", "no-source"])
def test_moe_config_rejects_bad_values(changes, match):
    base = dict(num_experts=8, experts_per_token=2, expert_intermediate_size=16,
                shared_expert_intermediate_size=0, source="test")
    with pytest.raises(ValueError, match=match):
        MoEConfig(**(base | changes))
    assert MoEConfig(**base).active_intermediate_size == 2 * 16
