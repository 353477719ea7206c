"""The GDN rule per kernel (gdn_core.flops.rule): model FLOPs do not depend on the kernel,
hardware FLOPs do; fla's block count by hand."""

import pytest

from gdn_core.config import GDNConfig, ModelConfig
from gdn_core.flops.executed import cp_overhead_flops, hardware_flops_per_step
from gdn_core.flops.model import gdn_rule_flops, model_flops_per_step
from gdn_core.flops.rule import (fla_block_macs, fused_block_macs, gdn_kernel,
                                 pallas_block_macs, reference_rule_flops, rule_block_macs,
                                 rule_flops)
from gdn_core.presets import get_preset


def tiny_model() -> ModelConfig:
    gdn = GDNConfig(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=4,
                    conv_kernel_size=4, chunk_size=64)
    return ModelConfig(name="custom", gdn=gdn, num_layers=3, intermediate_size=48, vocab_size=100)


def test_gdn_kernel_is_fla_on_torch_and_pallas_on_jax():
    assert gdn_kernel("fused", "torch") == "fused"
    assert gdn_kernel("fused", "jax") == "pallas"
    assert gdn_kernel("reference", "torch") == gdn_kernel("reference", "jax") == "reference"
    with pytest.raises(ValueError, match="kernels='triton' is not one of: reference, fused"):
        gdn_kernel("triton", "torch")
    with pytest.raises(ValueError, match="framework='tf'"):
        gdn_kernel("fused", "tf")


def test_pallas_block_hand_count():
    # C=64, Dk=8, Dv=4; the products chunk_math.chunk_forward runs, by name.
    C, K, V = 64, 8, 4
    got = pallas_block_macs(C, K, V)
    kkt, qk, w, u, attn_v = C * C * K, C * C * K, C * C * K, C * C * V, C * C * V
    w_s, q_s, k_v = C * K * V, C * K * V, C * K * V
    inverse = 12 * C ** 3                       # T_2s = T_s − T_s L_s T_s, s = 1 … 32: 6 × 2
    forward = kkt + qk + w + u + attn_v + w_s + q_s + k_v + inverse
    assert got.forward == forward
    # backward: the forward again, two cotangent products per product, dL = −Tᵀ dT Tᵀ
    assert got.total == forward + forward + 2 * (forward - inverse) + 2 * C ** 3
    assert fused_block_macs("pallas", C, K, V) == got
    assert fused_block_macs("fused", C, K, V) == fla_block_macs(C, K, V)
    with pytest.raises(ValueError, match="kernel='reference' is not a fused GDN kernel"):
        fused_block_macs("reference", C, K, V)


def test_jax_fused_counts_the_pallas_rule_and_its_summary_call_under_cp():
    model = tiny_model()
    shape = dict(chips=2, batch=1, seq_len=256)
    jax_fused = hardware_flops_per_step(model, mode="p2p", framework="jax", kernels="fused",
                                        **shape)
    jax_reference = hardware_flops_per_step(model, mode="p2p", framework="jax", **shape)
    assert jax_fused.rule.kernel == "pallas"
    assert jax_fused.model == jax_reference.model  # the model count ignores the kernel
    gdn = model.gdn
    summary = pallas_block_macs(gdn.chunk_size, gdn.head_k_dim, gdn.head_k_dim + gdn.head_v_dim)
    chips, local_chunks, flops_per_mac = 2, 256 // 2 // gdn.chunk_size, 2
    # one summary call per chip and GDN layer (a gdn_only model: every layer), its blocks
    assert jax_fused.cp_overhead.fold == (flops_per_mac * gdn.num_v_heads * model.num_layers
                                          * chips * local_chunks * summary.total)
    assert jax_fused.solve.ran_forward == 0  # its inverse is in its own count


def test_fla_block_hand_count():
    # C=64 (n=4 sub-blocks of 16), Dk=8, Dv=4; MACs per (row, head, chunk) block.
    C, K, V = 64, 8, 4
    got = fla_block_macs(C, K, V)
    assert got.kkt == 10 * 16 * 16 * K           # the 10 lower 16×16 sub-blocks of β k kᵀ
    # 4 diagonal 16×16 blocks by substitution; off-diagonal blocks Ai10, Ai21, Ai32 (2
    # products each), Ai20, Ai31 (3), Ai30 (4): 16 products of 16³
    assert got.inverse == 4 * 15 * 16 * 16 + 16 * 16 ** 3
    assert got.forward == (got.kkt + got.inverse + 2 * C * C * (K + V) + 3 * C * K * V)
    backward = 9 * C * C * K + 5 * C * C * V + 8 * C * K * V + 2 * C ** 3
    assert got.total == got.forward + backward
    assert rule_block_macs("fused", chunk_size=C, head_k_dim=K, head_v_dim=V) == (
        got.forward, got.total)
    assert fla_block_macs(32, K, V).inverse == 2 * 15 * 16 * 16 + 2 * 16 ** 3
    assert fla_block_macs(16, K, V).inverse == 15 * 16 * 16


def test_reference_and_fused_trials_of_one_point_share_model_flops():
    cfg = get_preset("qwen3.5-0.8b")
    point = dict(mode="p2p", chips=8, batch=1, seq_len=8 * 4096, framework="torch",
                 remat="gdn")
    reference = hardware_flops_per_step(cfg, kernels="reference", **point)
    fused = hardware_flops_per_step(cfg, kernels="fused", **point)
    model = model_flops_per_step(cfg, batch=1, seq_len=8 * 4096)  # takes no kernel
    assert reference.model == fused.model == model
    assert reference.total != fused.total
    assert (reference.rule.kernel, fused.rule.kernel) == ("reference", "fused")
    assert fused.solve.total == 0  # fla's inverse is in its own count
    # both run more than the model counts; MFU ≤ HFU for either kernel
    assert model.total < fused.total and model.total < reference.total
    # a fused JAX point counts the Pallas rule, not fla's and not the reference
    jax_point = dict(point, framework="jax")
    jax_fused = hardware_flops_per_step(cfg, kernels="fused", **jax_point)
    assert jax_fused.rule.kernel == "pallas" and jax_fused.model == model
    assert model.total < jax_fused.total != fused.total


@pytest.mark.parametrize("mode,chips", [("p2p", 1), ("ulysses", 2), ("all_gather", 4)])
def test_reference_hardware_counts_the_reference_rule(mode, chips):
    # model's standard rule + rule.total = the reference rule as it runs (3 × forward)
    cfg, B, T = tiny_model(), 2, 320
    gdn = cfg.gdn
    shape = dict(batch=B, seq_len=T, num_k_heads=gdn.num_k_heads, num_v_heads=gdn.num_v_heads,
                 head_k_dim=gdn.head_k_dim, head_v_dim=gdn.head_v_dim,
                 chunk_size=gdn.chunk_size)
    hw = hardware_flops_per_step(cfg, mode=mode, chips=chips, batch=B, seq_len=T,
                                 framework="torch")
    assert hw.model.gdn_rule == 3 * cfg.num_layers * gdn_rule_flops(**shape).total
    assert hw.model.gdn_rule + hw.rule.total == \
        3 * cfg.num_layers * reference_rule_flops(**shape).total
    fla = rule_flops("fused", num_layers=cfg.num_layers, **shape)
    blocks = B * gdn.num_v_heads * 5 * cfg.num_layers  # ceil(320 / 64) chunks
    assert fla.ran == 2 * blocks * fla_block_macs(64, 8, 4).total
    assert fla.ran_forward == 2 * blocks * fla_block_macs(64, 8, 4).forward


def test_fused_shard_padding_runs_fla_blocks():
    # all_gather, D=4, T=800: shards of 200 tokens → 4 chunks each, 16 run, 13 unsharded
    shape = dict(chips=4, batch=2, seq_len=800, num_v_heads=3, head_k_dim=16, head_v_dim=8,
                 chunk_size=64, num_layers=5)
    reference = cp_overhead_flops("all_gather", **shape)
    fused = cp_overhead_flops("all_gather", kernel="fused", **shape)
    fla = fla_block_macs(64, 16, 8)
    per_row = 2 * 2 * 3 * 5  # FLOPs per MAC × rows × heads × layers
    assert fused.shard_padding == per_row * 3 * fla.total
    assert fused.shard_padding_forward == per_row * 3 * fla.forward
    assert (fused.prefix, fused.state_apply) == (reference.prefix, reference.state_apply)
    # the fold is fla's summary call: values [0 | v] of width K+V, one per chunk of each chip
    summary = fla_block_macs(64, 16, 16 + 8)
    assert fused.fold == per_row * 16 * summary.total
    assert fused.forward == ((fused.prefix + fused.state_apply) // 3
                             + per_row * 16 * summary.forward
                             + fused.shard_padding_forward)
    assert reference.forward * 3 == reference.total
    with pytest.raises(ValueError, match="gdn_kernel='flash' is not one of: reference, fused"):
        cp_overhead_flops("all_gather", kernel="flash", **shape)
