"""Predict a training step's memory per chip from shapes and step settings alone (no compile).

`predict_step_memory` is the one answer to "will it fit?": the verify decision (which prefix
of the sequence one chip can check), the service's admission control and the capacity planner
all call it. It counts what the step of gdn_core.{jax_gdn,torch_gdn}.cp.train holds at its
peak, term by term (MemoryPrediction's fields; `total` says how they add up):

    weights            float32 master weights this chip stores (fsdp: its shards)
    compute_weights    weight copies in the compute dtype or gathered whole: bf16 casts kept
                       for backward, fsdp's gathered layers, the embedding and LM head
    grads              float32 gradients (before a zero1 reduce-scatter they are whole)
    optimizer_state    AdamW m and v, float32 (zero1 / fsdp: this chip's slice)
    activations        what backward keeps across all layers under train_cfg.remat
    backward_working   one layer's backward at a time: its cotangents and, under remat, its
                       rebuilt residuals (BACKWARD_WORKING_FRACTION of the layer's residuals)
    exchange_buffers   the CP mode's transient exchange buffers and saved pairs/states
    loss_logits        the chunked cross-entropy's float32 logits of one chunk, forward and
                       backward (never [tokens, vocab] whole)
    temporaries        the gradient sync's or the optimizer update's buffers (update phase)

Activation bytes per token and layer come from the tensors each framework's layer saves for
backward, counted per width class (E hidden, I MLP width, Kd = Hk·Dk, value head widths H·Dv,
H·Dk, chunk-local H·C, per-head scalars H, per-chunk states H·Dk²/C and H·Dk·Dv/C):
JAX from jax.ad_checkpoint.saved_residuals of jax_gdn's model, torch from the tensors autograd
packs (torch.autograd.graph.saved_tensors_hooks) for torch_gdn's model. The tests recount both
and compare the totals with XLA's memory analysis of the compiled step
(tests/gdn_core/test_memory_model.py), so a change to the layers that moves memory shows up.
All figures are bytes per chip.

A MoE preset (ModelConfig.moe) runs a dense SwiGLU stand-in as wide as the experts one token
passes through, but a chip training the real model holds all of its experts: the parameters
(weights, their compute copies, gradients, AdamW state, the sync buffers) are counted for the
published MoE block (real_layer_param_shapes), the per-token parts (activations, backward
working set, exchanges, logits) for the stand-in, which matches the real model per active
token. Step time stays the stand-in's. MemoryPrediction.mlp_params says which was counted.

The hybrid decoder (model_cfg.layers "hybrid") has gated full-attention layers in its
layer_pattern: their parameters (q_proj with its output gate, k/v/o_proj, q/k norms) and
activations are counted analytically from the tensors the layer keeps for backward
(attention_saved_bytes_per_token: q and gate, k, v as projected, q and k normed and rotated,
o and the gated o, a float32 log-sum-exp per head; the norms, residual and MLP as a GDN
layer's), checked against XLA's analysis of the compiled hybrid step (one chip and D = 4,
ring and all_gather_kv: predicted / XLA 0.96–1.0 at 1024 tokens, 1.11 at 2048 where XLA reuses
more) and torch's allocator. What the attention layers' CP mode (`attn_cp`) adds on a chip:
all_gather_kv keeps each attention layer's gathered K/V of the WHOLE sequence for backward
(it grows with the chip count at a fixed local shard, by design); ring holds two K/V blocks
of the local shard in flight (with their float32 dK/dV in backward) and ulysses its
all-to-all buffers: both flat in the chip count at a fixed local shard. Attention scores are
not counted: both frameworks' kernels are blockwise (tiles of at most 512 × 512 per head),
a constant the backward working fraction covers.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from .config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from .cp_layout import check_layout
from .cp_modes import UlyssesHeads, check_attention_cp_shape, check_attn_cp, check_cp_shape
from .train_config import TrainConfig, check_framework

FLOAT32_BYTES = 4
COMPUTE_BYTES = {"float32": 4, "bfloat16": 2}
JAX_LOSS_CHUNK_TOKENS = 1024
"""jax_gdn.model.LOSS_CHUNK_TOKENS (not imported: this module stays free of JAX and torch)."""
TORCH_LOSS_CHUNK_LOGITS = 2 ** 26
"""torch_gdn.loss.LOSS_CHUNK_LOGITS: logit elements per chunk."""
LOSS_LOGIT_COPIES = 2
"""A loss chunk's float32 [tokens, V] buffers alive at once in backward: the recomputed logits
and their gradient (the softmax fuses into it)."""
BACKWARD_WORKING_FRACTION = {
    "jax": {"none": 0.6, "gdn": 0.6, "full": 0.8},
    "torch": {"none": 0.1, "gdn": 0.25, "full": 0.9},
}
"""One layer's backward holds about this fraction of the layer's float32 remat-none residual
set beyond what is kept: its cotangents, and under remat its rebuilt residuals. JAX: XLA's
buffer reuse overlaps the two (its memory analysis of the tests' steps: none 0.56, gdn 0.54,
full 0.78). torch: autograd frees each residual as soon as its node has run, so little is
added beyond the rebuilt core (gdn) or layer (full) (the CPU allocator's peak under
torch.profiler: none ≤ 0.15, gdn 0.24, full 0.92)."""
TOP_LEVEL_SAVED_PER_TOKEN = 4
"""float32 hidden-width tensors kept outside the layers: embedding output, final norm's input
and output, the loss chunks' inputs."""

# Bytes per token and layer that backward keeps, by (framework, dtype, remat), per width class.
_SAVED_BYTES_PER_TOKEN: dict[tuple[str, str, str], dict[str, float]] = {
    # JAX: the remat policy's residuals (model.remat_policy); none keeps the rule's chunk terms,
    # gdn the projections, norms and MLP gate/up, full only the layer input (scan carry).
    ("jax", "float32", "none"): {"E": 24, "I": 24, "Kd": 56, "HDv": 76, "HDk": 60, "HC": 32,
                                 "H": 72, "HKK/C": 4, "HKV/C": 12, "H/C": 4, "1": 16},
    ("jax", "bfloat16", "none"): {"E": 20, "I": 12, "Kd": 44, "HDv": 64, "HDk": 54, "HC": 30,
                                  "H": 70, "HKK/C": 4, "HKV/C": 10, "H/C": 4, "1": 16},
    ("jax", "float32", "gdn"): {"E": 16, "I": 8, "Kd": 8, "HDv": 8, "H": 8},
    ("jax", "bfloat16", "gdn"): {"E": 8, "I": 4, "Kd": 4, "HDv": 4, "H": 4},
    ("jax", "float32", "full"): {"E": 4},
    ("jax", "bfloat16", "full"): {"E": 2},
    # torch: autograd's saved tensors; autocast casts each matmul's input separately (bf16
    # copies of the normed input per projection), the residual stream stays float32.
    ("torch", "float32", "none"): {"E": 24, "I": 16, "Kd": 16, "HDv": 44, "HDk": 52, "HC": 20,
                                   "H": 40, "HKK/C": 4, "HKV/C": 8, "H/C": 4, "1": 8},
    ("torch", "bfloat16", "none"): {"E": 28, "I": 8, "Kd": 8, "HDv": 34, "HDk": 46, "HC": 18,
                                    "H": 38, "HKK/C": 4, "HKV/C": 10, "H/C": 4, "1": 8},
    ("torch", "float32", "gdn"): {"E": 24, "I": 16, "Kd": 8, "HDv": 28, "H": 12, "1": 8},
    ("torch", "bfloat16", "gdn"): {"E": 28, "I": 8, "Kd": 4, "HDv": 22, "H": 8, "1": 8},
    ("torch", "float32", "full"): {"E": 4},
    ("torch", "bfloat16", "full"): {"E": 4},
}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MemoryPrediction:
    """Predicted bytes per chip of one training step at its peak, by part (module docstring)."""

    framework: str
    """jax or torch: how the parts overlap in time differs (total)."""
    mlp_params: str
    """Whose MLP parameters the parameter parts count: 'dense' (the model's SwiGLU MLP) or
    'experts' (a MoE model's router, experts and shared expert; the step runs the dense
    stand-in, so its time is the stand-in's)."""
    weights: int
    compute_weights: int
    grads: int
    optimizer_state: int
    activations: int
    backward_working: int
    exchange_buffers: int
    loss_logits: int
    temporaries: int

    @property
    def total(self) -> int:
        """The peak: weights and optimizer state throughout, plus the larger of the backward
        phase and the update phase (gradients and temporaries; the activations are gone).

        Backward: compute weights, exchanges, activations and the larger of one layer's working
        set and the loss's logits (they come and go before the layers' backward). JAX holds
        the whole gradients beside the activations (the layer scan's stacked outputs); torch
        sets gradients to None before each forward and frees each residual as the gradients
        grow, so its backward peaks at the larger of the activations and the gradients.
        """
        transient = self.compute_weights + self.exchange_buffers
        if self.framework == "torch":
            backward = transient + max(
                self.activations + max(self.backward_working, self.loss_logits),
                self.grads + self.backward_working)
        else:
            backward = transient + self.grads + self.activations + max(
                self.backward_working, self.loss_logits)
        update = self.grads + self.temporaries
        return self.weights + self.optimizer_state + max(backward, update)

    @property
    def resident_state(self) -> int:
        """What the step keeps between steps and while a verify reference runs beside it:
        weights, gradients and optimizer state."""
        return self.weights + self.grads + self.optimizer_state


# --------------------------------------------------------------------------- parameters

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
class _Params:
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
def _param_counts(model_cfg: ModelConfig, chips: int, framework: str) -> _Params:
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
    return _Params(
        total=parameter_count(model_cfg),
        layer=max(sum(map(_size, shapes[kind].values())) for kind in kinds),
        top=_size(top["embed_tokens"]) + _size(top["lm_head"]),
        matmul=sum(n * sum(_size(shape) for name, shape in shapes[kind].items()
                           if name not in _NOT_MATMUL_WEIGHTS) for kind, n in kinds.items())
        + _size(top["lm_head"]),
        sharded=sharded, zero_rank=max(loads))


# --------------------------------------------------------------------------- activations

def _widths(model_cfg: ModelConfig, heads: float) -> dict[str, float]:
    """Per-token element counts of each width class; `heads` value heads on this chip."""
    gdn = model_cfg.gdn
    C, Dk, Dv = gdn.chunk_size, gdn.head_k_dim, gdn.head_v_dim
    head_share = heads / gdn.num_v_heads
    return {"E": model_cfg.hidden_size, "I": model_cfg.intermediate_size,
            "Kd": gdn.key_dim * head_share, "HDv": heads * Dv, "HDk": heads * Dk,
            "HC": heads * C, "H": heads, "HKK/C": heads * Dk * Dk / C,
            "HKV/C": heads * Dk * Dv / C, "H/C": heads / C, "1": 1}


def saved_bytes_per_token(model_cfg: ModelConfig, *, framework: str, dtype: str, remat: str,
                          heads: float | None = None) -> float:
    """Bytes one layer keeps for backward per token (this chip's `heads`; default all)."""
    table = _SAVED_BYTES_PER_TOKEN[(framework, dtype, remat)]
    widths = _widths(model_cfg, model_cfg.gdn.num_v_heads if heads is None else heads)
    return sum(per_width * widths[name] for name, per_width in table.items())


def attention_saved_bytes_per_token(model_cfg: ModelConfig, *, framework: str, dtype: str,
                                    remat: str) -> float:
    """Bytes one gated full-attention layer keeps for backward per local token (analytic):
    its norms, residual and MLP as a GDN layer's (the E and I classes of the table), and,
    unless the whole layer is recomputed (remat full), in the compute dtype q with its gate
    (2·H·hd), k and v (2·G·hd) as projected, q and k normed and rotated (H·hd + G·hd), the
    attention output and the gated output (2·H·hd), plus a float32 log-sum-exp per head.
    Per chip the same under every attn_cp at a fixed local shard (ulysses holds H/D heads of
    the whole sequence: as many elements); all_gather_kv's gathered K/V is counted apart."""
    table = _SAVED_BYTES_PER_TOKEN[(framework, dtype, remat)]
    shared = table.get("E", 0) * model_cfg.hidden_size + table.get("I", 0) * \
        model_cfg.intermediate_size
    if remat == "full":
        return shared
    a = model_cfg.attention
    H, G, hd = a.num_heads, a.num_kv_heads, a.head_dim
    return shared + COMPUTE_BYTES[dtype] * (5 * H * hd + 3 * G * hd) + FLOAT32_BYTES * H


def attention_exchange_bytes(model_cfg: ModelConfig, *, attn_cp: str, chips: int, batch: int,
                             local_tokens: int, compute_bytes: int, remat: str) -> int:
    """What the attention layers' CP mode holds on one chip beyond the layers' activations:
        ring           two K/V blocks of t tokens in flight with their float32 dK/dV
                       accumulators (backward): 2·B·t·2·G·hd·(b + 4)
        all_gather_kv  every attention layer's gathered K/V, B·T·2·G·hd in the compute dtype,
                       kept for backward (remat full: recomputed, one layer's): grows with
                       T = D·t; its backward reduce-scatters dK/dV as a ring (never the whole
                       sequence's), holding what ring holds plus the float32 share of the
                       block being added, B·t·2·G·hd·4
    Calibrated against XLA (tests/gdn_core/test_memory_model.py, t = 256, float32): what
    all_gather_kv holds beyond ring predicted 655 360 / 1 179 648 B at D = 4 / 8, XLA 651 264 /
    1 168 896; with two attention layers 1 179 648 vs 1 438 712 (XLA keeps a few blocks more).
        ulysses        send and receive buffers of q, the KV heads sent (replicated when
                       G < D) and o: 2·B·t·hd·(2·H + 2·D·Gl)·b
    0 on one chip or without attention layers."""
    check_attn_cp(attn_cp)
    n_attn = decoder_layer_kinds(model_cfg).get(FULL_ATTENTION, 0)
    if chips == 1 or n_attn == 0:
        return 0
    a, B, t, b = model_cfg.attention, batch, local_tokens, compute_bytes
    H, G, hd = a.num_heads, a.num_kv_heads, a.head_dim
    block = B * t * 2 * G * hd  # K and V of one chip's shard, elements
    ring = 2 * block * (b + FLOAT32_BYTES)
    if attn_cp == "ring":
        return ring
    if attn_cp == "all_gather_kv":
        kept = 1 if remat == "full" else n_attn
        return kept * chips * block * b + ring + block * FLOAT32_BYTES
    sent_kv_heads = chips * UlyssesHeads(num_k_heads=G, num_v_heads=H,
                                         chips=chips).key_heads_per_chip
    return 2 * B * t * hd * (2 * H + 2 * sent_kv_heads) * b


def _exchange_bytes(model_cfg: ModelConfig, *, mode: str, chips: int, batch: int,
                    local_tokens: int, compute_bytes: int) -> int:
    """The GDN CP mode's buffers on one chip: per GDN layer the saved incoming pair/state
    (custom VJPs keep A and h_in), and one layer's transient exchange buffers, forward or
    backward."""
    if chips == 1:
        return 0
    gdn, L = model_cfg.gdn, decoder_layer_kinds(model_cfg).get(LINEAR_ATTENTION, 0)
    H, Dk, Dv = gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
    state = batch * H * Dk * Dv * FLOAT32_BYTES
    pair = batch * H * Dk * (Dk + Dv) * FLOAT32_BYTES
    halo = batch * (gdn.conv_kernel_size - 1) * gdn.conv_dim * compute_bytes
    if mode == "ulysses":
        # q, k, v, g, beta out to head shards and o back: send and receive buffers.
        per_token = gdn.conv_dim + 2 * H + gdn.value_dim
        return 2 * batch * local_tokens * per_token * FLOAT32_BYTES
    saved = L * pair
    transient = {"p2p": 2 * state, "all_gather": 2 * chips * pair,
                 "log_scan": 2 * max(1, math.ceil(math.log2(chips))) * pair}[mode]
    return saved + transient + 2 * halo


# --------------------------------------------------------------------------- the prediction

def predict_step_memory(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mode: str,
                        chips: int, framework: str, optimizer: bool = True,
                        attn_cp: str = "all_gather_kv",
                        layout: str = "contiguous") -> MemoryPrediction:
    """Predict the per-chip bytes of one CP training step (forward, backward, sync, AdamW).

    train_cfg: batch, global seq_len, dtype, param_sharding, remat as the step runs them;
    mode / chips: the CP layout (chips == 1: the single-chip step, any mode); attn_cp: the
    attention layers' CP mode (hybrid decoder only); layout: contiguous or zigzag (the same
    bytes per chip: each chip holds T/D tokens either way). optimizer=False leaves out
    AdamW's state and update: a gradient-only run, as a verify reference is.
    Raises ValueError naming the numbers for a shape `mode` / `attn_cp` cannot split over
    `chips`.
    """
    check_framework(framework)
    gdn = model_cfg.gdn
    check_cp_shape(mode=mode, chips=chips, seq_len=train_cfg.seq_len,
                   num_k_heads=gdn.num_k_heads, num_v_heads=gdn.num_v_heads,
                   conv_kernel_size=gdn.conv_kernel_size)
    check_layout(layout, chips=chips, seq_len=train_cfg.seq_len)
    kinds = decoder_layer_kinds(model_cfg)
    n_attn = kinds.get(FULL_ATTENTION, 0)
    if n_attn:
        check_attention_cp_shape(attn_cp=attn_cp, chips=chips,
                                 num_heads=model_cfg.attention.num_heads)
    is_jax = framework == "jax"
    sharding = train_cfg.param_sharding if chips > 1 else "replicated"
    params = _param_counts(model_cfg, chips, framework)
    B, t = train_cfg.batch_size, train_cfg.seq_len // chips
    compute_bytes = COMPUTE_BYTES[train_cfg.dtype]
    bf16 = train_cfg.dtype == "bfloat16"

    stored = params.sharded if sharding == "fsdp" else params.total
    opt_elements = {"replicated": params.total, "zero1": params.zero_rank if not is_jax
                    else params.sharded, "fsdp": params.sharded}[sharding]
    # Gradients: whole under replicated and zero1 (reduced after backward); fsdp keeps its
    # shards, and the embedding's and LM head's whole (they are used whole).
    grads = params.total if sharding != "fsdp" else params.sharded + params.top
    if sharding == "fsdp":
        # The running layer gathered, the embedding and the LM head gathered whole (float32
        # where the model reads them so).
        compute = params.layer * compute_bytes + params.top * FLOAT32_BYTES
    elif bf16 and (not is_jax or train_cfg.remat == "none"):
        # torch autocast caches a bf16 copy of every matmul weight for the whole forward;
        # JAX keeps each layer's bf16 casts as residuals unless the layer is recomputed.
        compute = params.matmul * compute_bytes
    else:
        compute = 2 * params.layer * compute_bytes if bf16 else 0

    # Ulysses runs the rule over the whole sequence on Hv/D heads: per chip the same per-head
    # work as t tokens of all heads, so the token count t stands for both.
    kept = saved_bytes_per_token(model_cfg, framework=framework, dtype=train_cfg.dtype,
                                 remat=train_cfg.remat)
    working = BACKWARD_WORKING_FRACTION[framework][train_cfg.remat] * saved_bytes_per_token(
        model_cfg, framework=framework, dtype="float32", remat="none")
    per_token_kept = kinds.get(LINEAR_ATTENTION, 0) * kept
    if n_attn:
        per_token_kept += n_attn * attention_saved_bytes_per_token(
            model_cfg, framework=framework, dtype=train_cfg.dtype, remat=train_cfg.remat)
        working = max(working, BACKWARD_WORKING_FRACTION[framework][train_cfg.remat]
                      * attention_saved_bytes_per_token(model_cfg, framework=framework,
                                                        dtype="float32", remat="none"))
    top_level = TOP_LEVEL_SAVED_PER_TOKEN * model_cfg.hidden_size * FLOAT32_BYTES
    tokens = B * t
    loss_tokens = min(tokens, JAX_LOSS_CHUNK_TOKENS if is_jax else
                      max(1, TORCH_LOSS_CHUNK_LOGITS // model_cfg.vocab_size))
    # The update phase's temporaries, one after the other: the gradient sync (JAX: the
    # replicated psum writes a second whole gradient, zero1's reduce-scatter a shard; torch:
    # sum_gradients concatenates the gradients into one flat buffer, replicated and zero1),
    # then the update (optax fuses AdamW into the donated buffers; torch's foreach AdamW, its
    # CUDA default, builds one list of the state's slice for the denominator).
    if chips == 1:
        synced = 0
    elif is_jax:
        synced = {"replicated": params.total, "zero1": opt_elements, "fsdp": 0}[sharding]
    else:
        synced = 0 if sharding == "fsdp" else params.total
    update = 0 if is_jax or not optimizer else opt_elements
    return MemoryPrediction(
        framework=framework,
        mlp_params="dense" if model_cfg.moe is None else "experts",
        weights=stored * FLOAT32_BYTES,
        compute_weights=int(compute),
        grads=grads * FLOAT32_BYTES,
        optimizer_state=2 * opt_elements * FLOAT32_BYTES if optimizer else 0,
        activations=int(tokens * (per_token_kept + top_level)),
        backward_working=int(tokens * working),
        exchange_buffers=_exchange_bytes(model_cfg, mode=mode, chips=chips, batch=B,
                                         local_tokens=t, compute_bytes=compute_bytes)
        + attention_exchange_bytes(model_cfg, attn_cp=attn_cp, chips=chips, batch=B,
                                   local_tokens=t, compute_bytes=compute_bytes,
                                   remat=train_cfg.remat),
        loss_logits=LOSS_LOGIT_COPIES * loss_tokens * model_cfg.vocab_size * FLOAT32_BYTES,
        temporaries=max(synced, update) * FLOAT32_BYTES,
    )


# --------------------------------------------------------------------------- verify

def verify_reference_memory(model_cfg: ModelConfig, train_cfg: TrainConfig, *, seq_len: int,
                            framework: str) -> MemoryPrediction:
    """One chip's forward + backward of the verify reference on the first seq_len tokens:
    replicated weights, no remat, no optimizer (as both frameworks' verify runs it)."""
    reference = dataclasses.replace(train_cfg, seq_len=seq_len, param_sharding="replicated",
                                    remat="none")
    return predict_step_memory(model_cfg.stand_in, reference, mode="p2p", chips=1,
                               framework=framework, optimizer=False)


def verify_seq_len(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mode: str, chips: int,
                   framework: str, budget_bytes: int, attn_cp: str = "all_gather_kv",
                   layout: str = "contiguous") -> int | None:
    """The tokens per sequence a verify can compare against one chip within budget_bytes.

    The chip that runs the reference also holds the CP step's weights, gradients and AdamW
    state (resident_state of the step's prediction); the reference must fit beside them.
    Returns train_cfg.seq_len when the whole sequence fits, else the longest prefix that fits
    and is a valid CP length — a multiple of chips × chunk_size that `mode` can split — or
    None when not even the shortest such prefix fits.
    """
    if not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(f"budget_bytes={budget_bytes!r} must be a non-negative integer")
    # What the run holds: a MoE preset's dense stand-in, not its experts.
    resident = predict_step_memory(model_cfg.stand_in, train_cfg, mode=mode, chips=chips,
                                   framework=framework, attn_cp=attn_cp,
                                   layout=layout).resident_state

    def fits(seq_len: int) -> bool:
        reference = verify_reference_memory(model_cfg, train_cfg, seq_len=seq_len,
                                            framework=framework)
        return resident + reference.total <= budget_bytes

    if fits(train_cfg.seq_len):
        return train_cfg.seq_len
    step = chips * model_cfg.gdn.chunk_size
    gdn = model_cfg.gdn
    valid = []
    for k in range(1, (train_cfg.seq_len - 1) // step + 1):
        try:
            check_cp_shape(mode=mode, chips=chips, seq_len=k * step, num_k_heads=gdn.num_k_heads,
                           num_v_heads=gdn.num_v_heads, conv_kernel_size=gdn.conv_kernel_size)
        except ValueError:
            continue
        valid.append(k * step)
    # Memory grows with the prefix: binary search for the longest one that fits.
    low, high = 0, len(valid)
    while low < high:
        mid = (low + high) // 2
        if fits(valid[mid]):
            low = mid + 1
        else:
            high = mid
    return valid[low - 1] if low else None
