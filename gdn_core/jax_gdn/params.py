"""JAX parameter pytrees for the GDN layer and language model, in PyTorch state_dict layout.

A pytree mirrors the dotted state_dict names of gdn_core.torch_gdn (and of transformers'
Qwen3_5GatedDeltaNet): "conv1d.weight" lives at params["conv1d"]["weight"]. Arrays keep the
torch layout (Linear weights [out, in], conv1d.weight [conv_dim, 1, K]).

The decoder layers are stacked for lax.scan. A decoder repeats a block of P layer kinds
(all-GDN: P = 1; Qwen3.5's hybrid: three GDN layers then one attention layer, P = 4), so
params["block"] is a list of P layer trees, position p's leaves stacked on a leading axis over
the L/P repeats: layer i is params["block"][i % P] at index i // P. from_state_dict stacks
"layers.{i}.…" this way (P = the shortest period of the layers' tree structure) and
to_state_dict unstacks it back, so the torch/HF names round-trip unchanged.

Layer tree:  in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj  -> {"weight": [out, in]}
             conv1d -> {"weight": [conv_dim, 1, K]};  norm -> {"weight": [Dv]};  dt_bias, A_log [Hv]
Model tree:  embed_tokens {"weight": [V, D]},
             block [ {gdn_norm, gdn, mlp_norm, mlp {gate_proj, up_proj, down_proj}}, stacked [L/P, …] ],
             norm {"weight": [D]}, lm_head {"weight": [V, D]}

The hybrid decoder (torch_gdn.HybridLanguageModel, transformers' Qwen3_5ForCausalLM) has the
same tree in HF's names: its "model." prefix is dropped on the way in and restored on the way
out, and each layer is {input_layernorm, linear_attn (a GDN layer) | self_attn (attention.py),
post_attention_layernorm, mlp}; its norms are zero-centred (scale 1 + weight). With tied
embeddings the tree has no lm_head (the head is embed_tokens); to_state_dict writes
lm_head.weight back as the embedding, as torch's state_dict lists it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..config import FULL_ATTENTION, AttentionConfig, GDNConfig, ModelConfig

INIT_STD = 0.02  # transformers' initializer_range: Linear and Embedding weights
A_INIT_RANGE = (1.0, 16.0)  # A = exp(A_log) ~ U(1, 16)

Params = dict[str, Any]
HF_DECODER = "model"
"""transformers' prefix of the decoder's names (model.embed_tokens, model.layers.{i}, model.norm)."""


def _to_float32(value) -> jax.Array:
    if hasattr(value, "detach"):  # torch tensor; bf16 has no numpy dtype, so go through float32
        value = value.detach().cpu().float().numpy()
    return jnp.asarray(np.asarray(value, dtype=np.float32))


def _listify(node):
    """Turn dicts whose keys are all decimal strings into lists (checked contiguous from 0)."""
    if not isinstance(node, dict):
        return node
    node = {k: _listify(v) for k, v in node.items()}
    if node and all(k.isdigit() for k in node):
        indices = sorted(int(k) for k in node)
        if indices != list(range(len(indices))):
            raise ValueError(f"state_dict list indices {indices} must run 0..{len(indices) - 1}")
        return [node[str(i)] for i in indices]
    return node


def block_period(layers: list[Params]) -> int:
    """The shortest P dividing len(layers) such that layer i has layer i % P's tree structure."""
    structures = [jax.tree.structure(layer) for layer in layers]
    for P in range(1, len(layers) + 1):
        if len(layers) % P == 0 and all(s == structures[i % P] for i, s in enumerate(structures)):
            return P
    raise AssertionError("unreachable: P = len(layers) always qualifies")


def stack_layers(layers: list[Params]) -> list[Params]:
    """Per-layer trees -> params["block"]: P trees, leaves stacked [L/P, …] (module docstring)."""
    P = block_period(layers)
    return [jax.tree.map(lambda *xs: jnp.stack(xs), *layers[p::P]) for p in range(P)]


def unstack_layers(block: list[Params]) -> list[Params]:
    """params["block"] -> the per-layer trees in decoder order (inverse of stack_layers)."""
    repeats = jax.tree.leaves(block[0])[0].shape[0]
    return [jax.tree.map(lambda x, r=r: x[r], block[p])
            for r in range(repeats) for p in range(len(block))]


def is_hf_tree(params: Params) -> bool:
    """Whether a model tree uses transformers' hybrid-decoder names (zero-centred norms)."""
    layers = params["block"] if "block" in params else params.get("layers", [])
    return any("input_layernorm" in layer for layer in layers)


def num_decoder_layers(params: Params) -> int:
    """L of a model tree: block positions × repeats."""
    return len(params["block"]) * jax.tree.leaves(params["block"][0])[0].shape[0]


def from_state_dict(state_dict: Mapping[str, Any]) -> Params:
    """Nest a flat {dotted name: array (numpy or torch)} mapping into a float32 pytree.

    Numeric name parts become list indices; a top-level "layers" list is stacked into
    params["block"] (module docstring).
    """
    root: dict = {}
    for name, value in state_dict.items():
        *parents, leaf = name.split(".")
        node = root
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"state_dict name {name!r} nests under an array")
        if leaf in node:
            raise ValueError(f"state_dict name {name!r} collides with another entry")
        node[leaf] = _to_float32(value)
    root = _listify(root)
    if isinstance(root.get(HF_DECODER), dict):  # HF naming: model.{embed_tokens,layers,norm}
        decoder = root.pop(HF_DECODER)
        if set(decoder) & set(root):
            raise ValueError(f"state_dict names {sorted(set(decoder) & set(root))} appear both "
                             f"with and without the {HF_DECODER!r} prefix")
        root |= decoder
    if isinstance(root.get("layers"), list):
        root["block"] = stack_layers(root.pop("layers"))
    return root


def to_state_dict(params: Params) -> dict[str, np.ndarray]:
    """Flatten a pytree back to {dotted name: numpy array} (the inverse of from_state_dict)."""
    if "block" in params:
        params = {k: v for k, v in params.items() if k != "block"} | {
            "layers": unstack_layers(params["block"])}
    if is_hf_tree(params):
        if "lm_head" not in params:  # tied: torch's state_dict lists the shared weight twice
            params = params | {"lm_head": params["embed_tokens"]}
        params = {HF_DECODER: {k: params[k] for k in ("embed_tokens", "layers", "norm")},
                  "lm_head": params["lm_head"]}
    flat: dict[str, np.ndarray] = {}

    def walk(node, prefix):
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            name = f"{prefix}{key}"
            if isinstance(child, (dict, list, tuple)):
                walk(child, name + ".")
            else:
                flat[name] = np.asarray(child)

    walk(params, "")
    return flat


def cast_floating(tree, dtype):
    """Cast every floating-point leaf of a pytree to dtype (other leaves untouched)."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _normal(key, shape, std: float = INIT_STD):
    # The barrier keeps XLA from folding `std` into normal's own √2 when the init is jitted
    # (jax_gdn.cp.step.sharded_init): the jitted, sharded init then draws these eager values
    # bit for bit (off by one ulp in half the elements without it).
    return std * lax.optimization_barrier(jax.random.normal(key, shape, jnp.float32))


def init_layer_params(cfg: GDNConfig, key: jax.Array) -> Params:
    """Fresh float32 GDN layer parameters (transformers' Qwen3.5 init)."""
    k_qkv, k_z, k_b, k_a, k_conv, k_out, k_A = jax.random.split(key, 7)
    D, Hv = cfg.hidden_size, cfg.num_v_heads
    A_H = jax.random.uniform(k_A, (Hv,), jnp.float32, *A_INIT_RANGE)
    bound = cfg.conv_kernel_size ** -0.5
    return {
        "in_proj_qkv": {"weight": _normal(k_qkv, (cfg.conv_dim, D))},
        "in_proj_z": {"weight": _normal(k_z, (cfg.value_dim, D))},
        "in_proj_b": {"weight": _normal(k_b, (Hv, D))},
        "in_proj_a": {"weight": _normal(k_a, (Hv, D))},
        # torch's Conv1d default U(±1/√K), as torch_gdn: N(0, 0.02) would shrink v fifty-fold.
        "conv1d": {"weight": jax.random.uniform(
            k_conv, (cfg.conv_dim, 1, cfg.conv_kernel_size), jnp.float32, -bound, bound)},
        "dt_bias": jnp.ones((Hv,), jnp.float32),
        "A_log": jnp.log(A_H),
        "norm": {"weight": jnp.ones((cfg.head_v_dim,), jnp.float32)},
        "out_proj": {"weight": _normal(k_out, (D, cfg.value_dim))},
    }


def init_attention_params(cfg: AttentionConfig, hidden_size: int, key: jax.Array,
                          std: float = INIT_STD) -> Params:
    """Fresh float32 gated-attention parameters (attention.py's tree): linears N(0, std),
    biases and zero-centred norms 0."""
    H, G, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    shapes = {"q_proj": (2 * H * E, hidden_size), "k_proj": (G * E, hidden_size),
              "v_proj": (G * E, hidden_size), "o_proj": (hidden_size, H * E)}
    params: Params = {}
    for k, (name, shape) in zip(jax.random.split(key, 4), shapes.items()):
        params[name] = {"weight": _normal(k, shape, std)}
        if cfg.attention_bias:
            params[name]["bias"] = jnp.zeros((shape[0],), jnp.float32)
    params["q_norm"] = {"weight": jnp.zeros((E,), jnp.float32)}
    params["k_norm"] = {"weight": jnp.zeros((E,), jnp.float32)}
    return params


def _init_mlp(k_layer, D, F):
    k_gate, k_up, k_down = jax.random.split(k_layer, 3)
    return {"gate_proj": {"weight": _normal(k_gate, (F, D))},
            "up_proj": {"weight": _normal(k_up, (F, D))},
            "down_proj": {"weight": _normal(k_down, (D, F))}}


def init_hybrid_params(model_cfg: ModelConfig, key: jax.Array) -> Params:
    """Fresh float32 parameters of the hybrid decoder (HF names, model_cfg.layer_pattern):
    zero-centred norms 0, linears and embedding N(0, 0.02), GDN layers as init_layer_params."""
    D, F, V = model_cfg.hidden_size, model_cfg.intermediate_size, model_cfg.vocab_size
    k_embed, k_head, *k_layers = jax.random.split(key, 2 + model_cfg.num_layers)
    zeros = {"weight": jnp.zeros((D,), jnp.float32)}
    layers = []
    for kind, k_layer in zip(model_cfg.layer_pattern, k_layers):
        k_mixer, k_mlp = jax.random.split(k_layer)
        mixer = {"self_attn": init_attention_params(model_cfg.attention, D, k_mixer)} \
            if kind == FULL_ATTENTION else {"linear_attn": init_layer_params(model_cfg.gdn, k_mixer)}
        layers.append({"input_layernorm": zeros, **mixer, "post_attention_layernorm": zeros,
                       "mlp": _init_mlp(k_mlp, D, F)})
    params = {"embed_tokens": {"weight": _normal(k_embed, (V, D))}, "block": stack_layers(layers),
              "norm": zeros}
    if not model_cfg.tie_word_embeddings:
        params["lm_head"] = {"weight": _normal(k_head, (V, D))}
    return params


def init_model_params(model_cfg: ModelConfig, key: jax.Array) -> Params:
    """Fresh float32 language-model parameters, the layers stacked in params["block"]
    (model_cfg.layers "hybrid": the hybrid decoder's tree, init_hybrid_params)."""
    if model_cfg.layers == "hybrid":
        return init_hybrid_params(model_cfg, key)
    D, F, V = model_cfg.hidden_size, model_cfg.intermediate_size, model_cfg.vocab_size
    k_embed, k_head, *k_layers = jax.random.split(key, 2 + model_cfg.num_layers)
    layers = []
    for k_layer in k_layers:
        k_gdn, k_gate, k_up, k_down = jax.random.split(k_layer, 4)
        layers.append({
            "gdn_norm": {"weight": jnp.ones((D,), jnp.float32)},
            "gdn": init_layer_params(model_cfg.gdn, k_gdn),
            "mlp_norm": {"weight": jnp.ones((D,), jnp.float32)},
            "mlp": {
                "gate_proj": {"weight": _normal(k_gate, (F, D))},
                "up_proj": {"weight": _normal(k_up, (F, D))},
                "down_proj": {"weight": _normal(k_down, (D, F))},
            },
        })
    return {
        "embed_tokens": {"weight": _normal(k_embed, (V, D))},
        "block": stack_layers(layers),
        "norm": {"weight": jnp.ones((D,), jnp.float32)},
        "lm_head": {"weight": _normal(k_head, (V, D))},
    }
