"""Parameter shapes and counts of the model a chip trains, and their share per chip.

Shapes are torch layout, as gdn_core builds them. A MoE preset (ModelConfig.moe) runs a dense
SwiGLU stand-in as wide as the experts one token passes through, but a chip training the real
model holds all of its experts: real_layer_param_shapes puts the published MoE block in place
of the stand-in, and the counts here are of that real model. The hybrid decoder's gated
full-attention layers (attention_layer_param_shapes) count as what they are.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from ..config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig


def layer_param_shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of one decoder layer's parameters (torch layout, as gdn_core builds them: a MoE
    model's MLP is its dense stand-in)."""
    gdn, E, I = model_cfg.gdn, model_cfg.hidden_size, model_cfg.intermediate_size
    H, Cc = gdn.num_v_heads, gdn.conv_dim
    return {"gdn_norm": (E,), "in_proj_qkv": (Cc, E), "in_proj_z": (gdn.value_dim, E),
            "in_proj_b": (H, E), "in_proj_a": (H, E), "conv1d": (Cc, 1, gdn.conv_kernel_size),
            "dt_bias": (H,), "A_log": (H,), "norm": (gdn.head_v_dim,),
            "out_proj": (E, gdn.value_dim), "mlp_norm": (E,), "gate_proj": (I, E),
            "up_proj": (I, E), "down_proj": (E, I)}


_DENSE_MLP = ("gate_proj", "up_proj", "down_proj")
_GDN_MIXER = ("gdn_norm", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d",
              "dt_bias", "A_log", "norm", "out_proj")
"""The GDN layer's own parameters (the rest of a layer is its MLP and the MLP's norm)."""


def real_layer_param_shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of one decoder layer of the model a chip would train: layer_param_shapes, with
    a MoE model's published MoE block (Qwen3NextSparseMoeBlock) in place of the stand-in MLP:
    router [N, E], the N experts' SwiGLU stacked [N, Ie, E] / [N, E, Ie], the shared expert
    and its sigmoid gate [1, E]."""
    shapes = layer_param_shapes(model_cfg)
    moe = model_cfg.moe
    if moe is None:
        return shapes
    for name in _DENSE_MLP:
        del shapes[name]
    E, N = model_cfg.hidden_size, moe.num_experts
    Ie, Is = moe.expert_intermediate_size, moe.shared_expert_intermediate_size
    shapes |= {"router": (N, E), "experts_gate_proj": (N, Ie, E),
               "experts_up_proj": (N, Ie, E), "experts_down_proj": (N, E, Ie)}
    if Is:
        shapes |= {"shared_gate_proj": (Is, E), "shared_up_proj": (Is, E),
                   "shared_down_proj": (E, Is), "shared_expert_gate": (1, E)}
    return shapes


def attention_layer_param_shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of one gated full-attention decoder layer of the model a chip would train (torch
    layout: q_proj yields queries and the output gate, 2·H·head_dim rows), with the same MLP
    as real_layer_param_shapes."""
    a, E = model_cfg.attention, model_cfg.hidden_size
    H, G, hd = a.num_heads, a.num_kv_heads, a.head_dim
    mlp = {name: shape for name, shape in real_layer_param_shapes(model_cfg).items()
           if name not in _GDN_MIXER}
    return {"attn_norm": (E,), "q_proj": (2 * H * hd, E), "k_proj": (G * hd, E),
            "v_proj": (G * hd, E), "o_proj": (E, H * hd), "q_norm": (hd,), "k_norm": (hd,),
            **mlp}


def decoder_layer_kinds(model_cfg: ModelConfig) -> dict[str, int]:
    """How many decoder layers of each kind (LINEAR_ATTENTION: GDN; FULL_ATTENTION) the
    config's decoder has: all GDN under gdn_only."""
    pattern = model_cfg.layer_pattern
    return {kind: pattern.count(kind) for kind in (LINEAR_ATTENTION, FULL_ATTENTION)
            if kind in pattern}


def _layer_shapes_by_kind(model_cfg: ModelConfig) -> dict[str, dict[str, tuple[int, ...]]]:
    return {kind: (real_layer_param_shapes(model_cfg) if kind == LINEAR_ATTENTION
                   else attention_layer_param_shapes(model_cfg))
            for kind in decoder_layer_kinds(model_cfg)}


def top_param_shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of the parameters outside the layers: embedding, final norm, LM head."""
    E, V = model_cfg.hidden_size, model_cfg.vocab_size
    return {"embed_tokens": (V, E), "norm": (E,), "lm_head": (V, E)}


_NOT_MATMUL_WEIGHTS = ("gdn_norm", "conv1d", "dt_bias", "A_log", "norm", "mlp_norm",
                       "attn_norm", "q_norm", "k_norm")
"""A layer's parameters no matmul reads (norms, the depthwise conv, the decay's scalars)."""


def _size(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def parameter_count(model_cfg: ModelConfig) -> int:
    """Parameters of the model a chip would train: a MoE model's all experts, not the dense
    stand-in's; each layer of the config's decoder as what it is (GDN, or gated attention in
    a hybrid)."""
    return (sum(n * sum(map(_size, _layer_shapes_by_kind(model_cfg)[kind].values()))
                for kind, n in decoder_layer_kinds(model_cfg).items())
            + sum(map(_size, top_param_shapes(model_cfg).values())))


def active_parameter_count(model_cfg: ModelConfig) -> int:
    """Parameters one token passes through (embedding and LM head included): a MoE model's
    routed experts per token, not all of them; a dense model's all."""
    moe = model_cfg.moe
    if moe is None:
        return parameter_count(model_cfg)
    idle_experts = moe.num_experts - moe.experts_per_token
    expert = 3 * model_cfg.hidden_size * moe.expert_intermediate_size
    return parameter_count(model_cfg) - model_cfg.num_layers * idle_experts * expert


def _shard_size(shape: tuple[int, ...], chips: int, framework: str) -> int:
    """Elements of one chip's slice of a leaf split over `chips`.

    JAX (jax_gdn.cp.param_sharding): 1/chips along a dim divisible by chips, else whole.
    torch (FSDP2): dim 0 padded up to a multiple of chips.
    """
    if chips == 1:
        return _size(shape)
    if framework == "torch":
        return math.ceil(shape[0] / chips) * _size(shape[1:])
    return _size(shape) // chips if any(d % chips == 0 for d in shape) else _size(shape)


@dataclasses.dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameter elements of the model a chip trains, whole and as one chip holds them."""

    total: int
    """Elements of the whole model."""
    layer: int
    """Elements of one decoder layer (the largest kind's, in a hybrid)."""
    top: int
    """Elements of the embedding and the LM head (the final norm is negligible)."""
    matmul: int
    """Elements of the weights the matmuls read (the layers' projections and the LM head)."""
    sharded: int
    """Elements this chip keeps when every leaf is split over the chips (zero1 / fsdp)."""
    zero_rank: int
    """torch ZeroRedundancyOptimizer: elements of the largest rank's parameter partition."""


@functools.lru_cache(maxsize=256)  # O(leaves × chips); admission asks once per grid point
def param_counts(model_cfg: ModelConfig, chips: int, framework: str) -> ParamCounts:
    """The counts predict_step_memory needs for `chips` chips (_shard_size: how each framework
    splits a leaf)."""
    kinds, top = decoder_layer_kinds(model_cfg), top_param_shapes(model_cfg)
    shapes = _layer_shapes_by_kind(model_cfg)
    sharded = (sum(n * sum(_shard_size(s, chips, framework) for s in shapes[kind].values())
                   for kind, n in kinds.items())
               + sum(_shard_size(s, chips, framework) for s in top.values()))
    # ZeroRedundancyOptimizer assigns parameters, largest first, to the least-loaded rank.
    loads = [0] * chips
    for size in sorted([_size(s) for kind, n in kinds.items() for s in shapes[kind].values()
                        for _ in range(n)] + [_size(s) for s in top.values()], reverse=True):
        loads[loads.index(min(loads))] += size
    return ParamCounts(
        total=parameter_count(model_cfg),
        layer=max(sum(map(_size, shapes[kind].values())) for kind in kinds),
        top=_size(top["embed_tokens"]) + _size(top["lm_head"]),
        matmul=sum(n * sum(_size(shape) for name, shape in shapes[kind].items()
                           if name not in _NOT_MATMUL_WEIGHTS) for kind, n in kinds.items())
        + _size(top["lm_head"]),
        sharded=sharded, zero_rank=max(loads))


__all__ = ["ParamCounts", "active_parameter_count", "attention_layer_param_shapes",
           "decoder_layer_kinds", "layer_param_shapes", "param_counts", "parameter_count",
           "real_layer_param_shapes", "top_param_shapes"]
