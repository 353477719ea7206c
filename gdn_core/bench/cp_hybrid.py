"""`bench cp --layers hybrid`: the hybrid decoder per (GDN mode, attention CP mode) pair —
what one chip holds, receives and computes, how the step splits between GDN and attention
layers, and how evenly causal attention spreads over the chips under each layout.

Every figure here is ANALYTIC (labelled so in the output): the hybrid's CP step is compared
against measurement by the sweep (`gdn-sweep run` with layers: hybrid, attn_cps, layouts) and
the issue-13 tests, not compiled here. Per (mode, attn_cp, D), whole model, one training step:
  memory/chip    gdn_core.memory_model.predict_step_memory at the fixed local shard
  recv/chip      bytes a chip receives: the GDN layers by ARCHITECTURE.md's table (forward and
                 backward, conv halo included) + the attention layers'
                 (torch_gdn.cp.attention.attention_comm_bytes)
  flops ratio    hardware FLOPs of the CP step ÷ those of one chip over the whole sequence
                 (gdn_core.flops: GDN CP work + attention CP's extra pairs)
  attn share     attention layers' share of the model FLOPs: the time split between GDN and
                 attention layers if both ran at the same FLOP rate
  imbalance      max / min over chips of per-chip causal attention FLOPs
                 (attention_flops.attention_imbalance), contiguous and zigzag
"""

from __future__ import annotations

import math

from ..attention_flops import attention_imbalance
from ..config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from ..flops import hardware_flops_per_step, model_flops_per_step
from ..memory_model import COMPUTE_BYTES, predict_step_memory
from ..train_config import TrainConfig

MIB = 2 ** 20


def gdn_received_bytes(model_cfg: ModelConfig, *, mode: str, chips: int, batch: int,
                       local_tokens: int, itemsize: int) -> int:
    """Bytes the busiest chip receives for the GDN layers in one step (forward + backward),
    by ARCHITECTURE.md's table: p2p one fp32 state, all_gather (D−1) (A, B) pairs, log_scan
    at most log2 D pairs, ulysses q, k, v, g, β to head shards and o back; plus the conv halo
    (K−1 tokens × conv channels) in the sequence-sharded modes."""
    if chips == 1:
        return 0
    gdn = model_cfg.gdn
    B, H, Dk, Dv = batch, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
    state, pair = B * H * Dk * Dv * 4, B * H * Dk * (Dk + Dv) * 4
    if mode == "ulysses":
        per_token = (gdn.conv_dim + 2 * H) * itemsize + gdn.value_dim * itemsize
        # each chip keeps 1/D of every other chip's t tokens' channels (its head shard)
        per_direction = (chips - 1) * B * local_tokens * per_token // chips
    else:
        per_direction = {"p2p": state, "all_gather": (chips - 1) * pair,
                         "log_scan": math.ceil(math.log2(chips)) * pair}[mode]
        per_direction += B * (gdn.conv_kernel_size - 1) * gdn.conv_dim * itemsize
    return 2 * per_direction * model_cfg.layer_pattern.count(LINEAR_ATTENTION)


def attention_received_bytes(model_cfg: ModelConfig, *, attn_cp: str, chips: int, batch: int,
                             local_tokens: int, itemsize: int) -> int:
    """Bytes a chip receives for the attention layers in one step (forward + backward)."""
    if chips == 1:
        return 0
    from ..torch_gdn.cp.attention import attention_comm_bytes

    a = model_cfg.attention
    forward, backward = attention_comm_bytes(
        attn_cp, chips=chips, batch=batch, local_tokens=local_tokens, num_heads=a.num_heads,
        num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, itemsize=itemsize)
    return (forward + backward) * model_cfg.layer_pattern.count(FULL_ATTENTION)


def report(model_cfg: ModelConfig, *, modes, attn_cps, chips_list, local_tokens: int,
           batch: int, dtype: str, framework: str = "jax", out=print) -> None:
    """Print the table of the module docstring for every (mode, attn_cp, D)."""
    itemsize = COMPUTE_BYTES[dtype]
    pattern = model_cfg.layer_pattern
    out(f"preset={model_cfg.name} hybrid decoder: {pattern.count(LINEAR_ATTENTION)} GDN + "
        f"{pattern.count(FULL_ATTENTION)} gated-attention layers "
        f"({model_cfg.attention.num_heads}/{model_cfg.attention.num_kv_heads} heads, head_dim "
        f"{model_cfg.attention.head_dim}); local shard {local_tokens} tokens x batch {batch}; "
        f"{dtype}; whole-model training step per chip; ALL FIGURES ANALYTIC (memory_model, "
        "flops, ARCHITECTURE.md's comm table), not measured")
    if model_cfg.moe is not None:
        out(f"note: {model_cfg.note}")
    out(f"{'mode':<11}{'attn_cp':<14}{'D':>3}{'memory/chip MiB':>17}{'recv/chip MiB':>15}"
        f"{'flops ratio':>13}{'attn share':>12}{'imbal contig':>14}{'imbal zigzag':>14}")
    for chips in sorted(chips_list):
        seq_len = local_tokens * chips
        train_cfg = TrainConfig(batch_size=batch, seq_len=seq_len, dtype=dtype)
        model = model_flops_per_step(model_cfg, batch=batch, seq_len=seq_len)
        share = (model.attention_projections + model.attention_core) / model.total
        imbalance = {layout: attention_imbalance(chips=chips, seq_len=seq_len, layout=layout)
                     if seq_len % (2 * chips) == 0 or layout == "contiguous" else math.nan
                     for layout in ("contiguous", "zigzag")}
        one_chip = hardware_flops_per_step(model_cfg, mode="p2p", chips=1, batch=batch,
                                           seq_len=seq_len, framework=framework).total
        # one chip: no CP, the same step whatever the modes (one row, mode "none")
        pairs = [(m, a) for m in modes for a in attn_cps] if chips > 1 else [
            (modes[0], attn_cps[0])]
        for mode, attn_cp in pairs:
            try:
                memory = predict_step_memory(model_cfg.stand_in, train_cfg, mode=mode,
                                             chips=chips, framework=framework,
                                             attn_cp=attn_cp).total
                hardware = hardware_flops_per_step(
                    model_cfg, mode=mode, chips=chips, batch=batch, seq_len=seq_len,
                    framework=framework, attn_cp=attn_cp).total
            except ValueError as err:
                out(f"{mode:<11}{attn_cp:<14}{chips:>3}  skipped: {err}")
                continue
            recv = (gdn_received_bytes(model_cfg, mode=mode, chips=chips, batch=batch,
                                       local_tokens=local_tokens, itemsize=itemsize)
                    + attention_received_bytes(model_cfg, attn_cp=attn_cp, chips=chips,
                                               batch=batch, local_tokens=local_tokens,
                                               itemsize=itemsize))
            shown = (mode, attn_cp) if chips > 1 else ("none", "-")
            out(f"{shown[0]:<11}{shown[1]:<14}{chips:>3}{memory / MIB:17.1f}{recv / MIB:15.3f}"
                f"{hardware / one_chip:13.4f}{share:12.3f}{imbalance['contiguous']:14.3f}"
                f"{imbalance['zigzag']:14.3f}")


__all__ = ["attention_received_bytes", "gdn_received_bytes", "report"]
