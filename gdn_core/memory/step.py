"""predict_step_memory: a training step's memory per chip at its peak, part by part.

It counts what the CP training step of gdn_core.jax_gdn.cp (step.py) and gdn_core.torch_gdn.cp
(train.py) holds at its peak, term by term (MemoryPrediction's fields; `total` says how they
add up):

    weights            float32 master weights this chip stores (fsdp: its shards)
    compute_weights    weight copies in the compute dtype or gathered whole: bf16 casts kept
                       for backward, fsdp's gathered layers, the embedding and LM head
    grads              float32 gradients (before a zero1 reduce-scatter they are whole)
    optimizer_state    AdamW m and v, float32 (zero1 / fsdp: this chip's slice)
    activations        what backward keeps across all layers under train_cfg.remat
    backward_working   one layer's backward at a time: its cotangents and, under remat, its
                       rebuilt residuals (BACKWARD_WORKING_FRACTION of the layer's residuals)
    exchange_buffers   the CP mode's transient exchange buffers and saved pairs/states
    kernel_workspace   kernels="fused": what the fused GDN kernel holds beyond the reference
                       step's count (kernel_workspace.py: fla-core's chunked intermediates for
                       torch, the Pallas chunk rule's residuals for JAX; counted from their
                       source until measured on a chip; 0 otherwise)
    loss_logits        the chunked cross-entropy's float32 logits of one chunk, forward and
                       backward (never [tokens, vocab] whole)
    temporaries        the gradient sync's or the optimizer update's buffers (update phase)

A MoE preset's parameter parts (weights, their compute copies, gradients, AdamW state, the
sync buffers) are counted for the published MoE block (parameters.py), the per-token parts
(activations, backward working set, exchanges, logits) for the dense stand-in it runs, which
matches the real model per active token. Step time stays the stand-in's.
MemoryPrediction.mlp_params says which was counted.
"""

from __future__ import annotations

import dataclasses

from ..config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from ..cp_layout import check_layout
from ..cp_modes import check_attention_cp_shape, check_cp_shape, check_dp
from ..kernels import DEFAULT_KERNELS, check_kernels
from ..train_config import TrainConfig, check_framework
from .activations import (COMPUTE_BYTES, FLOAT32_BYTES, attention_exchange_bytes,
                          attention_saved_bytes_per_token, gdn_exchange_bytes,
                          saved_bytes_per_token)
from .kernel_workspace import fused_gdn_workspace_bytes, workspace_source
from .parameters import decoder_layer_kinds, param_counts

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


FSDP2_GATHERED_LAYERS = 4
"""The most layers torch's FSDP2 step holds gathered at once. Measured on gloo (torch 2.13,
CPU; test_torch_sharded_init): 2, 3 or 4 from run to run as the collectives overlap, whatever
the depth; not yet measured on NCCL."""

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
    kernels: str = DEFAULT_KERNELS
    kernel_workspace: int = 0
    """A fused kernel's own buffers beyond the reference count, held in backward beside the
    activations (kernel_workspace_source says how it was counted)."""

    @property
    def kernel_workspace_source(self) -> str:
        return workspace_source(self.framework) if self.kernel_workspace else "none"

    @property
    def total(self) -> int:
        """The peak: weights and optimizer state throughout, plus the larger of the backward
        phase and the update phase (gradients and temporaries; the activations are gone).

        Backward: compute weights, exchanges, a fused kernel's workspace, activations and
        the larger of one layer's working set and the loss's logits (they come and go before
        the layers' backward). JAX holds the whole gradients beside the activations (the
        layer scan's stacked outputs); torch sets gradients to None before each forward and
        frees each residual as the gradients grow, so its backward peaks at the larger of the
        activations and the gradients.
        """
        transient = self.compute_weights + self.exchange_buffers + self.kernel_workspace
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


def predict_step_memory(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mode: str,
                        chips: int, framework: str, optimizer: bool = True,
                        attn_cp: str = "all_gather_kv",
                        layout: str = "contiguous", dp: int = 1,
                        kernels: str = DEFAULT_KERNELS,
                        device_kind: str | None = None) -> MemoryPrediction:
    """Predict the per-chip bytes of one CP training step (forward, backward, sync, AdamW).

    train_cfg: batch (per replica), global seq_len, dtype, param_sharding, remat as the step
    runs them; mode / chips: the CP layout of one replica (chips == 1: the single-chip step,
    any mode); dp: data-parallel replicas (cp_modes.CPSettings.dp): weights, gradients and
    optimizer state are laid out over all dp × chips chips, activations and exchanges are a
    replica's (a chip holds batch × seq_len / chips tokens whatever dp is); attn_cp: the
    attention layers' CP mode (hybrid decoder only); layout: contiguous or zigzag (the same
    bytes per chip: each chip holds T/D tokens either way). optimizer=False leaves out
    AdamW's state and update: a gradient-only run, as a verify reference is. kernels:
    reference or fused (fused adds the fused GDN kernel's workspace, kernel_workspace.py);
    device_kind ("cpu" | "gpu" | "tpu", None: unknown) picks the parameterisation whose
    workspace JAX's Pallas rule holds (None counts the GPU's, the larger).
    Raises ValueError naming the numbers for a shape `mode` / `attn_cp` cannot split over
    `chips`.
    """
    check_framework(framework)
    check_kernels(kernels)
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
    check_dp(dp, chips=chips * dp)
    weight_chips = chips * dp  # the chips param_sharding lays the weights over
    sharding = train_cfg.param_sharding if weight_chips > 1 else "replicated"
    params = param_counts(model_cfg, weight_chips, framework)
    B, t = train_cfg.batch_size, train_cfg.seq_len // chips
    compute_bytes = COMPUTE_BYTES[train_cfg.dtype]
    bf16 = train_cfg.dtype == "bfloat16"

    stored = params.sharded if sharding == "fsdp" else params.total
    opt_elements = {"replicated": params.total, "zero1": params.zero_rank if not is_jax
                    else params.sharded, "fsdp": params.sharded}[sharding]
    # Gradients: whole under replicated and zero1 (reduced after backward); fsdp keeps its
    # shards, and the embedding's and LM head's whole (they are used whole).
    grads = params.total if sharding != "fsdp" else params.sharded + params.top
    if sharding == "fsdp" and is_jax:
        # The running layer gathered, the embedding and the LM head gathered whole (float32
        # where the model reads them so).
        compute = params.layer * compute_bytes + params.top * FLOAT32_BYTES
    elif sharding == "fsdp":
        # FSDP2 in backward: up to FSDP2_GATHERED_LAYERS layers gathered (the running one,
        # the next prefetched with its all-gather's copy-in of this rank's shard, and, as the
        # collectives overlap, the ones before not yet freed), the running layer's whole
        # float32 gradient and its reduce-scatter input.
        compute = params.layer * (FSDP2_GATHERED_LAYERS * compute_bytes + 2 * FLOAT32_BYTES) \
            + params.layer * compute_bytes // weight_chips + params.top * FLOAT32_BYTES
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
    if weight_chips == 1:
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
        exchange_buffers=gdn_exchange_bytes(model_cfg, mode=mode, chips=chips, batch=B,
                                            local_tokens=t, compute_bytes=compute_bytes)
        + attention_exchange_bytes(model_cfg, attn_cp=attn_cp, chips=chips, batch=B,
                                   local_tokens=t, compute_bytes=compute_bytes,
                                   remat=train_cfg.remat),
        loss_logits=LOSS_LOGIT_COPIES * loss_tokens * model_cfg.vocab_size * FLOAT32_BYTES,
        temporaries=max(synced, update) * FLOAT32_BYTES,
        kernels=kernels,
        kernel_workspace=fused_gdn_workspace_bytes(
            model_cfg, framework=framework, kernels=kernels, mode=mode, chips=chips,
            tokens=tokens, compute_bytes=compute_bytes, remat=train_cfg.remat,
            device_kind=device_kind),
    )


__all__ = ["BACKWARD_WORKING_FRACTION", "JAX_LOSS_CHUNK_TOKENS", "LOSS_LOGIT_COPIES",
           "MemoryPrediction", "TOP_LEVEL_SAVED_PER_TOKEN", "TORCH_LOSS_CHUNK_LOGITS",
           "predict_step_memory"]
