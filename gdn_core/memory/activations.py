"""What a step holds per token beyond its weights: activations kept for backward, and the CP
modes' exchange buffers.

Activation bytes per token and layer come from the tensors each framework's layer saves for
backward, counted per width class (E hidden, I MLP width, Kd = Hk·Dk, value head widths H·Dv,
H·Dk, chunk-local H·C, per-head scalars H, per-chunk states H·Dk²/C and H·Dk·Dv/C):
JAX from jax.ad_checkpoint.saved_residuals of jax_gdn's model, torch from the tensors autograd
packs (torch.autograd.graph.saved_tensors_hooks) for torch_gdn's model. The tests recount both
and compare the totals with XLA's memory analysis of the compiled step
(tests/gdn_core/test_memory.py), so a change to the layers that moves memory shows up.

The hybrid decoder's gated full-attention layers keep, analytically
(attention_saved_bytes_per_token): q and gate, k, v as projected, q and k normed and rotated,
o and the gated o, a float32 log-sum-exp per head; the norms, residual and MLP as a GDN layer's.
Checked against XLA's analysis of the compiled hybrid step (one chip and D = 4, ring and
all_gather_kv: predicted / XLA 0.96–1.0 at 1024 tokens, 1.11 at 2048 where XLA reuses more) and
torch's allocator. What the attention layers' CP mode (`attn_cp`) adds on a chip:
all_gather_kv keeps each attention layer's gathered K/V of the WHOLE sequence for backward (it
grows with the chip count at a fixed local shard, by design); ring holds two K/V blocks of the
local shard in flight (with their float32 dK/dV in backward) and ulysses its all-to-all
buffers: both flat in the chip count at a fixed local shard. Attention scores are not counted:
both frameworks' kernels are blockwise (tiles of at most 512 × 512 per head), a constant the
backward working fraction (step.py) covers.
"""

from __future__ import annotations

import math

from ..config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from ..cp_modes import UlyssesHeads, check_attn_cp
from .parameters import decoder_layer_kinds

FLOAT32_BYTES = 4
COMPUTE_BYTES = {"float32": 4, "bfloat16": 2}

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
                       block being added, B·t·2·G·hd·4, and a float32 query-sized buffer,
                       B·t·H·hd·4 (the segment pair's dq beside the accumulator: measured
                       since attention runs by segment pairs, not derived)
    Calibrated against XLA (tests/gdn_core/test_memory.py, t = 256, float32): what
    all_gather_kv holds beyond ring predicted 786 432 / 1 310 720 B at D = 4 / 8, XLA 850 112 /
    1 369 024; with two attention layers 1 310 720 vs 1 960 584 (XLA keeps more blocks live
    across the two layers' backward than this counts: the model errs low there).
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
        return kept * chips * block * b + ring + (block + B * t * H * hd) * FLOAT32_BYTES
    sent_kv_heads = chips * UlyssesHeads(num_k_heads=G, num_v_heads=H,
                                         chips=chips).key_heads_per_chip
    return 2 * B * t * hd * (2 * H + 2 * sent_kv_heads) * b


def gdn_exchange_bytes(model_cfg: ModelConfig, *, mode: str, chips: int, batch: int,
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


__all__ = ["COMPUTE_BYTES", "FLOAT32_BYTES", "attention_exchange_bytes",
           "attention_saved_bytes_per_token", "gdn_exchange_bytes", "saved_bytes_per_token"]
