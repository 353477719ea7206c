"""What a fused GDN kernel holds beyond the reference step's count: fla-core's chunked
intermediates, for torch's fused GDN (kernels="fused").

An ESTIMATE, counted from fla-core 0.6.0's source (fla/ops/gated_delta_rule/chunk.py and the
kernels it calls), until measured on a chip (FLA_WORKSPACE_SOURCE). Per call of fla's
chunk_gated_delta_rule on B·t tokens of Hv value heads (Hk key heads, K = head_k_dim, W the
value width of the call, C = chunk_size, NT = t / C chunks, b the call's dtype bytes):

  saved for backward   ChunkGatedDeltaRuleFunction.forward's save_for_backward, the tensors
                       it makes (its inputs are the caller's, counted by the reference step):
                       q and k l2-normed (2·Hk·K·b) with their float32 rstd (2·Hk·4), g's
                       chunk-local cumsum in float32 (Hv·4), the WY block inverse A (Hv·C·b)
  backward transient   chunk_gated_delta_rule_bwd's buffers, as if alive at once (an upper
                       estimate): the per-chunk states h (recomputed) and dh,
                       2·B·NT·Hv·K·W·b; per token w, dq, dk, dw, dk2 at Hv·K, u, v_new, dv,
                       dv2 and the WY dv at Hv·W, dg and dg2 in float32, db

Calls per GDN layer: one on a single chip and under ulysses (after its all-to-all a chip holds
whole sequences of Hv/D heads: as many elements as t tokens of all heads); the
sequence-sharded modes (p2p, all_gather, log_scan; torch_gdn.cp.kernel_rule) add a summary
call in float32 at width K+V, whose inputs it builds itself (the [0 | v] values, B·t·Hv·(K+V)·4,
and a float32 beta, both kept by fla for backward). The saved part is kept by every GDN layer
under remat none and by the recomputed layer alone under gdn or full; the transient part is one
call's at a time. It is counted on top of the reference step (MemoryPrediction.kernel_workspace):
the reference rule's own residuals, which fla's single autograd node replaces, stay in the
activations, so the total errs high for fused rather than low. JAX's fused step runs the
reference GDN rule (kernels.JAX_GDN_NOT_FUSED) and both frameworks' fused attention is
blockwise as the reference's is: no workspace is added for them.
"""

from __future__ import annotations

from ..config import LINEAR_ATTENTION, ModelConfig
from .activations import FLOAT32_BYTES
from .parameters import decoder_layer_kinds

FLA_WORKSPACE_SOURCE = (
    "estimate from fla-core 0.6.0's chunk_gated_delta_rule source (what its forward saves for "
    "backward, what its backward allocates), until measured on a chip")
SEQUENCE_SHARDED_MODES = ("p2p", "all_gather", "log_scan")
"""GDN CP modes in which torch's fused rule makes the extra summary call (kernel_rule.py)."""


def fla_saved_bytes_per_token(model_cfg: ModelConfig, *, dtype_bytes: int) -> int:
    """Bytes per token one fla call keeps for backward beyond its inputs (module docstring)."""
    gdn = model_cfg.gdn
    Hk, Hv, K, C = gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.chunk_size
    return (2 * Hk * K * dtype_bytes + 2 * Hk * FLOAT32_BYTES + Hv * FLOAT32_BYTES
            + Hv * C * dtype_bytes)


def fla_backward_transient_bytes(model_cfg: ModelConfig, *, tokens: int, width: int,
                                 dtype_bytes: int) -> int:
    """Bytes one fla call's backward allocates on `tokens` (batch × local) tokens at value
    width `width` (module docstring: an upper estimate, every buffer alive at once)."""
    gdn = model_cfg.gdn
    Hv, K, C = gdn.num_v_heads, gdn.head_k_dim, gdn.chunk_size
    chunks = -(-tokens // C)
    states = 2 * chunks * Hv * K * width * dtype_bytes
    per_token = (5 * Hv * K + 5 * Hv * width + Hv) * dtype_bytes + 3 * Hv * FLOAT32_BYTES
    return states + tokens * per_token


def fused_gdn_workspace_bytes(model_cfg: ModelConfig, *, framework: str, kernels: str,
                              mode: str, chips: int, tokens: int, compute_bytes: int,
                              remat: str) -> int:
    """fla's workspace on one chip for `tokens` (batch × local) tokens per GDN layer call; 0
    for the reference kernels, JAX, or a decoder without GDN layers (module docstring)."""
    layers = decoder_layer_kinds(model_cfg).get(LINEAR_ATTENTION, 0)
    if framework != "torch" or kernels != "fused" or layers == 0:
        return 0
    gdn = model_cfg.gdn
    K, V, Hv = gdn.head_k_dim, gdn.head_v_dim, gdn.num_v_heads
    calls = [(V, compute_bytes)]  # (value width, dtype bytes): the rule's own call
    saved = tokens * fla_saved_bytes_per_token(model_cfg, dtype_bytes=compute_bytes)
    if chips > 1 and mode in SEQUENCE_SHARDED_MODES:
        calls.append((K + V, FLOAT32_BYTES))  # the summary call, float32 from [I | 0]
        saved += tokens * (fla_saved_bytes_per_token(model_cfg, dtype_bytes=FLOAT32_BYTES)
                           + Hv * (K + V) * FLOAT32_BYTES + Hv * FLOAT32_BYTES)
    kept_layers = layers if remat == "none" else 1
    transient = max(fla_backward_transient_bytes(model_cfg, tokens=tokens, width=width,
                                                 dtype_bytes=b) for width, b in calls)
    return kept_layers * saved + transient


__all__ = ["FLA_WORKSPACE_SOURCE", "SEQUENCE_SHARDED_MODES", "fla_backward_transient_bytes",
           "fla_saved_bytes_per_token", "fused_gdn_workspace_bytes"]
