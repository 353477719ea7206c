"""What a fused GDN kernel holds beyond the reference step's count (kernels="fused"):
fla-core's chunked intermediates for torch, the Pallas chunk rule's residuals for JAX.

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
activations, so the total errs high for fused rather than low. Both frameworks' fused
attention is blockwise as the reference's is: no workspace is added for it.

JAX's fused GDN is the Pallas chunk rule (jax_gdn/pallas, PALLAS_WORKSPACE_SOURCE), counted
the same way from its source. Per call on B·t tokens at value width W (b the call's dtype
bytes):

  saved for backward   its custom_vjp residuals that it makes: q, k, v laid out heads-major
                       and padded (2·Hk·K·b + Hv·W·b), G and β as float32 rows (2·Hv·4), the
                       state entering each chunk (NT·Hv·K·W·4); on a GPU also w (Hv·K·4 per
                       token, the states pass's)
  backward transient   its backward's outputs, float32: dq, dk per value head (2·Hv·K), dv
                       (Hv·W), dG, dβ (2·Hv); on a GPU also the per-chunk state terms c and
                       dS (2·NT·Hv·K·W·4)

with the same calls per layer as fla's (the summary call at width K+V in float32 for p2p,
all_gather and log_scan on several chips: jax_gdn/cp/kernel_rule.py). On a CPU the kernel
runs through Pallas's interpreter in its TPU parameterisation (no w).
"""

from __future__ import annotations

from ..config import LINEAR_ATTENTION, ModelConfig
from .activations import FLOAT32_BYTES
from .parameters import decoder_layer_kinds

FLA_WORKSPACE_SOURCE = (
    "estimate from fla-core 0.6.0's chunk_gated_delta_rule source (what its forward saves for "
    "backward, what its backward allocates), until measured on a chip")
PALLAS_WORKSPACE_SOURCE = (
    "count from the Pallas chunk rule's source (jax_gdn/pallas: its custom_vjp residuals and "
    "backward outputs), until measured on a chip")
SEQUENCE_SHARDED_MODES = ("p2p", "all_gather", "log_scan")
"""GDN CP modes in which the fused rule makes the extra summary call (torch_gdn/cp and
jax_gdn/cp kernel_rule.py)."""


def workspace_source(framework: str) -> str:
    """How the fused GDN workspace of `framework` is counted."""
    return FLA_WORKSPACE_SOURCE if framework == "torch" else PALLAS_WORKSPACE_SOURCE


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


def pallas_saved_bytes_per_token(model_cfg: ModelConfig, *, width: int, dtype_bytes: int,
                                 gpu: bool) -> float:
    """Bytes per token one Pallas call keeps for backward beyond its inputs (module
    docstring); the per-chunk states spread over the chunk's tokens."""
    gdn = model_cfg.gdn
    Hk, Hv, K, C = gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.chunk_size
    layout_copies = (2 * Hk * K + Hv * width) * dtype_bytes
    rows = 2 * Hv * FLOAT32_BYTES
    w = Hv * K * FLOAT32_BYTES if gpu else 0
    return layout_copies + rows + w + Hv * K * width * FLOAT32_BYTES / C


def pallas_backward_transient_bytes(model_cfg: ModelConfig, *, tokens: int, width: int,
                                    gpu: bool) -> int:
    """Bytes one Pallas call's backward allocates on `tokens` tokens at value width `width`."""
    gdn = model_cfg.gdn
    Hv, K, C = gdn.num_v_heads, gdn.head_k_dim, gdn.chunk_size
    chunks = -(-tokens // C)
    per_token = (2 * Hv * K + Hv * width + 2 * Hv) * FLOAT32_BYTES
    states = 2 * chunks * Hv * K * width * FLOAT32_BYTES if gpu else 0
    return states + tokens * per_token


def fused_gdn_workspace_bytes(model_cfg: ModelConfig, *, framework: str, kernels: str,
                              mode: str, chips: int, tokens: int, compute_bytes: int,
                              remat: str, device_kind: str | None = None) -> int:
    """The fused GDN rule's workspace on one chip for `tokens` (batch × local) tokens per GDN
    layer call: fla's (torch) or the Pallas chunk rule's (JAX; device_kind "gpu" or None,
    unknown, counts its GPU parameterisation, the larger); 0 for the reference kernels or a
    decoder without GDN layers (module docstring)."""
    layers = decoder_layer_kinds(model_cfg).get(LINEAR_ATTENTION, 0)
    if kernels != "fused" or layers == 0:
        return 0
    gdn = model_cfg.gdn
    K, V, Hv = gdn.head_k_dim, gdn.head_v_dim, gdn.num_v_heads
    calls = [(V, compute_bytes)]  # (value width, dtype bytes): the rule's own call
    if chips > 1 and mode in SEQUENCE_SHARDED_MODES:
        calls.append((K + V, FLOAT32_BYTES))  # the summary call, float32 from [I | 0]
    if framework == "torch":
        saved = tokens * fla_saved_bytes_per_token(model_cfg, dtype_bytes=compute_bytes)
        if len(calls) > 1:
            saved += tokens * (fla_saved_bytes_per_token(model_cfg, dtype_bytes=FLOAT32_BYTES)
                               + Hv * (K + V) * FLOAT32_BYTES + Hv * FLOAT32_BYTES)
        transient = max(fla_backward_transient_bytes(model_cfg, tokens=tokens, width=width,
                                                     dtype_bytes=b) for width, b in calls)
    else:
        gpu = device_kind in (None, "gpu")
        saved = int(sum(tokens * pallas_saved_bytes_per_token(
            model_cfg, width=width, dtype_bytes=b, gpu=gpu) for width, b in calls))
        transient = max(pallas_backward_transient_bytes(model_cfg, tokens=tokens, width=width,
                                                        gpu=gpu) for width, _ in calls)
    kept_layers = layers if remat == "none" else 1
    return kept_layers * saved + transient


__all__ = ["FLA_WORKSPACE_SOURCE", "PALLAS_WORKSPACE_SOURCE", "SEQUENCE_SHARDED_MODES",
           "fla_backward_transient_bytes", "fla_saved_bytes_per_token",
           "fused_gdn_workspace_bytes", "pallas_backward_transient_bytes",
           "pallas_saved_bytes_per_token", "workspace_source"]
