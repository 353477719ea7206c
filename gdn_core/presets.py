"""Published Qwen3.5 / Qwen3-Next GDN geometries as ModelConfig presets.

Every GDN layer of these models has Dk = Dv = 128 and a 4-tap conv. The models interleave
3 GDN layers with 1 gated-attention layer; our step models every layer as a GDN layer
(num_layers is the model's full depth), since the GDN layers are what CP changes. Each preset
also carries its gated-attention geometry (ModelConfig.attention, see the sources below) for
the hybrid decoder (torch_gdn.HybridLanguageModel, `get_preset(..., layers="hybrid")`); the
presets themselves stay layers="gdn_only".
"""

from __future__ import annotations

import dataclasses

from .config import AttentionConfig, GDNConfig, Layers, ModelConfig, MoEConfig

QWEN35_VOCAB = 248_320
QWEN3_NEXT_VOCAB = 151_936

# The published MoE blocks; every layer of all four models is a MoE layer (model cards:
# "3 × (Gated DeltaNet → MoE) → 1 × (Gated Attention → MoE)"; Qwen3-Next's config.json:
# decoder_sparse_step 1, mlp_only_layers []). transformers documents its Qwen3NextConfig and
# Qwen3_5MoeTextConfig defaults as the 80B-A3B's and the 35B-A3B's.
QWEN3_NEXT_80B_MOE = MoEConfig(
    num_experts=512, experts_per_token=10, expert_intermediate_size=512,
    shared_expert_intermediate_size=512,
    source="checked: Qwen3-Next-80B-A3B model card, transformers' Qwen3NextConfig defaults")
QWEN35_35B_MOE = MoEConfig(
    num_experts=256, experts_per_token=8, expert_intermediate_size=512,
    shared_expert_intermediate_size=512,
    source="checked: Qwen3.5-35B-A3B model card, transformers' Qwen3_5MoeTextConfig defaults")
QWEN35_122B_MOE = MoEConfig(
    num_experts=256, experts_per_token=8, expert_intermediate_size=1024,
    shared_expert_intermediate_size=1024,
    source="checked: experts, per token and width from the Qwen3.5-122B-A10B model card; "
           "shared expert width 1024 assumed (the card gives one expert width; third-party "
           "copies of config.json agree, the released file itself not read)")
QWEN35_397B_MOE = MoEConfig(
    num_experts=512, experts_per_token=10, expert_intermediate_size=1024,
    shared_expert_intermediate_size=1024,
    source="checked: experts, per token and width from the Qwen3.5-397B-A17B model card; "
           "shared expert width 1024 assumed (the card gives one expert width; third-party "
           "copies of config.json agree, the released file itself not read)")


# The gated-attention layers. Shared by every model here: head_dim 256, 64 rotated channels
# (partial_rotary_factor 0.25), one full-attention layer in four (full_attention_interval 4,
# layer_types 3 × linear_attention then full_attention), no attention biases. rope_theta is
# 10,000,000 in every released config: Qwen's own Qwen3.6 model cards (same architecture and
# model_type qwen3_5) quote text_config.rope_parameters as {rope_theta: 10000000,
# partial_rotary_factor: 0.25, mrope_section: [11, 11, 10], mrope_interleaved: true}; for text
# the three mrope sections share one position, so it is plain 1-D rotary. transformers'
# Qwen3_5TextConfig / Qwen3NextConfig defaults (documented as the 9B's and the 80B-A3B's)
# agree on heads, KV heads, head_dim, factor and interval but default rope_theta to 10,000.
# Heads (Q / KV) per model, and where they were read — Qwen's released config.json files could
# not be read from this environment, so each is marked checked (Qwen's own model card, or
# transformers' documented defaults) or third-party (copies of config.json / spec sheets):
QWEN35_ROPE_THETA = 10_000_000.0
ATTENTION_HEADS: dict[str, tuple[int, int, str]] = {
    "qwen3.5-0.8b": (8, 2, "third-party: fitmygpu.com/models/qwen-3.5-0.8b (8 heads, 2 KV)"),
    "qwen3.5-4b": (16, 4, "third-party: apxml.com/models/qwen35-4b (16 / 4, head dim 256, "
                   "rope theta 10,000,000); a derived model's README copying Qwen3.5-4B's "
                   "attention (GQA 16Q / 4KV, head_dim 256)"),
    "qwen3.5-9b": (16, 4, "checked: transformers' Qwen3_5TextConfig defaults (the 9B's: 16 / 4, "
                   "head_dim 256, factor 0.25); apxml.com/models/qwen35-9b (rope theta "
                   "10,000,000)"),
    "qwen3.5-27b": (24, 4, "checked against Qwen's Qwen3.6-27B model card as mirrored "
                    "(ai.gitcode.com, shilu.ai): 'Attention Heads: 24 for Q, 4 for KV; Head "
                    "Dimension 256; Rotary Position Embedding Dimension 64'; Qwen3.6-27B is "
                    "Qwen3.5-27B's architecture (model_type qwen3_5); the Qwen3.5-27B card "
                    "itself not read"),
    "qwen3.5-35b-a3b": (16, 2, "checked: transformers' Qwen3_5MoeTextConfig defaults (the "
                        "35B-A3B's); Qwen3.6-35B-A3B model card as quoted by mera.a-ai.ru ('16 "
                        "for Q and 2 for KV, Head Dimension: 256, Rotary Position Embedding "
                        "Dimension: 64')"),
    "qwen3.5-122b-a10b": (32, 2, "assumed: no source for the heads found here (the model card "
                          "excerpts read give layers and experts only)"),
    "qwen3.5-397b-a17b": (32, 2, "third-party: pcpartguide.com spec sheet (32 heads, 2 KV, "
                          "head dim 256)"),
    "qwen3-next-80b-a3b": (16, 2, "checked: transformers' Qwen3NextConfig defaults (the "
                           "80B-A3B's: 16 / 2, head_dim 256, factor 0.25); apxml.com/models/"
                           "qwen3-next-80b-a3b (16 / 2, head dim 256, rope theta 10,000,000)"),
}


def _attention(name):
    heads, kv_heads, _source = ATTENTION_HEADS[name]
    return AttentionConfig(num_heads=heads, num_kv_heads=kv_heads, head_dim=256,
                           rope_theta=QWEN35_ROPE_THETA, partial_rotary_factor=0.25,
                           full_attention_interval=4)


def _gdn(hidden, k_heads, v_heads):
    return GDNConfig(hidden_size=hidden, num_k_heads=k_heads, num_v_heads=v_heads,
                     head_k_dim=128, head_v_dim=128, conv_kernel_size=4)


def _preset(name, hidden, layers, k_heads, v_heads, ffn, vocab):
    return ModelConfig(name=name, gdn=_gdn(hidden, k_heads, v_heads), num_layers=layers,
                       intermediate_size=ffn, vocab_size=vocab, attention=_attention(name))


def _moe_preset(name, hidden, layers, k_heads, v_heads, moe, vocab):
    """A MoE model: the step runs a dense SwiGLU MLP as wide as the experts one token passes
    through; memory counts the published experts (ModelConfig.moe)."""
    note = (f"MoE model: the step runs a dense SwiGLU stand-in for the experts active per "
            f"token, width {moe.experts_per_token} routed x {moe.expert_intermediate_size} + "
            f"shared {moe.shared_expert_intermediate_size} = {moe.active_intermediate_size}, "
            f"so step time and FLOPs are the stand-in's; memory counts all "
            f"{moe.num_experts} experts' parameters and optimizer state; numbers {moe.source}")
    return ModelConfig(name=name, gdn=_gdn(hidden, k_heads, v_heads), num_layers=layers,
                       intermediate_size=moe.active_intermediate_size, vocab_size=vocab,
                       note=note, moe=moe, attention=_attention(name))


PRESETS: dict[str, ModelConfig] = {
    p.name: p for p in (
        _preset("qwen3.5-0.8b", 1024, 24, 16, 16, 3584, QWEN35_VOCAB),
        _preset("qwen3.5-4b", 2560, 32, 16, 32, 9216, QWEN35_VOCAB),
        _preset("qwen3.5-9b", 4096, 32, 16, 32, 12288, QWEN35_VOCAB),
        _preset("qwen3.5-27b", 5120, 64, 16, 48, 17408, QWEN35_VOCAB),
        _moe_preset("qwen3.5-35b-a3b", 2048, 40, 16, 32, QWEN35_35B_MOE, QWEN35_VOCAB),
        _moe_preset("qwen3.5-122b-a10b", 3072, 48, 16, 64, QWEN35_122B_MOE, QWEN35_VOCAB),
        _moe_preset("qwen3.5-397b-a17b", 4096, 60, 16, 64, QWEN35_397B_MOE, QWEN35_VOCAB),
        _moe_preset("qwen3-next-80b-a3b", 2048, 48, 16, 32, QWEN3_NEXT_80B_MOE,
                    QWEN3_NEXT_VOCAB),
    )
}
PRESETS["tiny"] = ModelConfig(
    name="tiny",
    gdn=GDNConfig(hidden_size=64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16,
                  conv_kernel_size=4, chunk_size=16),
    num_layers=2, intermediate_size=128, vocab_size=256,
    note="test-sized model: seconds per step on a CPU",
    # Hybrid: layer 0 GDN, layer 1 gated attention (4 query / 2 KV heads 16 wide, 8
    # channels of each rotated).
    attention=AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10_000.0,
                              partial_rotary_factor=0.5, full_attention_interval=2))


def get_preset(name: str, *, num_layers: int | None = None, vocab_size: int | None = None,
               chunk_size: int | None = None, layers: Layers | None = None) -> ModelConfig:
    """Return preset `name`, optionally with fewer/more layers, another vocabulary or chunk,
    or as the hybrid decoder (layers="hybrid"; the presets are "gdn_only")."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not one of: {', '.join(PRESETS)}")
    cfg = PRESETS[name]
    changes = {k: v for k, v in (("num_layers", num_layers), ("vocab_size", vocab_size),
                                 ("layers", layers)) if v is not None}
    if chunk_size is not None:
        changes["gdn"] = dataclasses.replace(cfg.gdn, chunk_size=chunk_size)
    return dataclasses.replace(cfg, **changes) if changes else cfg
