"""Published Qwen3.5 / Qwen3-Next GDN geometries as ModelConfig presets.

Every GDN layer of these models has Dk = Dv = 128 and a 4-tap conv. The models interleave
3 GDN layers with 1 gated-attention layer; our step models every layer as a GDN layer
(num_layers is the model's full depth), since the GDN layers are what CP changes.
"""

from __future__ import annotations

import dataclasses

from .config import GDNConfig, ModelConfig

QWEN35_VOCAB = 248_320
QWEN3_NEXT_VOCAB = 151_936
_MOE_NOTE = ("MoE model: the dense SwiGLU MLP stands in for the experts active per token, "
             "width = (routed experts per token + 1 shared) x expert width = {width}; ")


def _preset(name, hidden, layers, k_heads, v_heads, ffn, vocab, note=""):
    gdn = GDNConfig(hidden_size=hidden, num_k_heads=k_heads, num_v_heads=v_heads,
                    head_k_dim=128, head_v_dim=128, conv_kernel_size=4)
    return ModelConfig(name=name, gdn=gdn, num_layers=layers, intermediate_size=ffn,
                       vocab_size=vocab, note=note)


PRESETS: dict[str, ModelConfig] = {
    p.name: p for p in (
        _preset("qwen3.5-0.8b", 1024, 24, 16, 16, 3584, QWEN35_VOCAB),
        _preset("qwen3.5-4b", 2560, 32, 16, 32, 9216, QWEN35_VOCAB),
        _preset("qwen3.5-9b", 4096, 32, 16, 32, 12288, QWEN35_VOCAB),
        _preset("qwen3.5-27b", 5120, 64, 16, 48, 17408, QWEN35_VOCAB),
        _preset("qwen3.5-35b-a3b", 2048, 40, 16, 32, 8 * 512 + 512, QWEN35_VOCAB,
                _MOE_NOTE.format(width="(8+1)x512") + "numbers from transformers' Qwen3_5MoeConfig"),
        _preset("qwen3.5-122b-a10b", 3072, 48, 16, 64, 8 * 1024 + 1024, QWEN35_VOCAB,
                _MOE_NOTE.format(width="(8+1)x1024") + "expert width 1024 assumed, not checked "
                "against the released config"),
        _preset("qwen3.5-397b-a17b", 4096, 60, 16, 64, 10 * 1024 + 1024, QWEN35_VOCAB,
                _MOE_NOTE.format(width="(10+1)x1024") + "expert width and count assumed, not "
                "checked against the released config"),
        _preset("qwen3-next-80b-a3b", 2048, 48, 16, 32, 10 * 512 + 512, QWEN3_NEXT_VOCAB,
                _MOE_NOTE.format(width="(10+1)x512") + "numbers from transformers' Qwen3NextConfig"),
    )
}
PRESETS["tiny"] = ModelConfig(
    name="tiny",
    gdn=GDNConfig(hidden_size=64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16,
                  conv_kernel_size=4, chunk_size=16),
    num_layers=2, intermediate_size=128, vocab_size=256,
    note="test-sized model: seconds per step on a CPU")


def get_preset(name: str, *, num_layers: int | None = None, vocab_size: int | None = None,
               chunk_size: int | None = None) -> ModelConfig:
    """Return preset `name`, optionally with fewer/more layers, another vocabulary or chunk."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not one of: {', '.join(PRESETS)}")
    cfg = PRESETS[name]
    changes = {k: v for k, v in (("num_layers", num_layers), ("vocab_size", vocab_size))
               if v is not None}
    if chunk_size is not None:
        changes["gdn"] = dataclasses.replace(cfg.gdn, chunk_size=chunk_size)
    return dataclasses.replace(cfg, **changes) if changes else cfg
