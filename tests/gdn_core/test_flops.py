"""FLOP accounting: hand counts, the torch rule's own matmuls, MaxText's formula, CP overhead."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gdn_core.config import GDNConfig, ModelConfig
from gdn_core.cp_modes import CP_MODES
from gdn_core.flops.executed import (cp_overhead_flops, hardware_flops_per_step, solve_flops,
                                     unit_lower_inverse_flops)
from gdn_core.flops.maxtext import maxtext_gdn_flops, maxtext_model_flops_per_step
from gdn_core.flops.model import gdn_rule_flops, model_flops_per_step, model_forward_flops
from gdn_core.flops.rule import reference_rule_flops
from gdn_core.flops.utilisation import mfu, tokens_per_s_per_chip
from gdn_core.presets import get_preset
from gdn_core.torch_gdn.chunk import chunk_gated_delta_rule

REL = 1e-9
TINY_RULE = dict(batch=2, seq_len=40, num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=4,
                 chunk_size=16)


def close(a, b, rel=REL):
    return math.isclose(a, b, rel_tol=rel, abs_tol=0)


def tiny_model() -> ModelConfig:
    gdn = GDNConfig(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=4,
                    conv_kernel_size=4, chunk_size=16)
    return ModelConfig(name="custom", gdn=gdn, num_layers=3, intermediate_size=48, vocab_size=100)


def test_model_rule_hand_count():
    # The standard chunked WY form, per token: B·T = 80 tokens, Hv=2 heads, C=16, Dk=8, Dv=4.
    token_heads = 2 * 40 * 2
    macs_per_token = {
        "gram": 16 * 8,                  # (βk) kᵀ: C²·Dk per chunk
        "intra_chunk_attn": 16 * 8,      # q kᵀ
        "triangular_solve": 16 * (8 + 4),  # (I+L)⁻¹ [βk e^G | βv]
        "state_read": 8 * 4,             # u − w S
        "state_update": 8 * 4,           # e^G S + k̃ᵀ v_new
        "outputs": 8 * 4 + 16 * 4,       # q̃ S, attn v_new
    }
    got = gdn_rule_flops(**TINY_RULE)
    for name, macs in macs_per_token.items():
        assert getattr(got, name) == 2 * token_heads * macs, name
    # per chunk C²·(3·Dk + 2·Dv) + 3·C·Dk·Dv = 8192 + 1536 MACs, ÷ C per token
    assert got.total == 2 * token_heads * (16 * 16 * 32 + 3 * 16 * 8 * 4) // 16 == 194560


def test_reference_rule_hand_count():
    # B=2, T=40 → padded to 48 = 3 chunks of C=16; Hv=2 heads (Hk=1 repeated); Dk=8, Dv=4.
    blocks = 2 * 2 * 3
    macs_per_block = {
        "gram": 16 * 16 * 8,                    # (βk) kᵀ
        "intra_chunk_attn": 16 * 16 * 8,        # q kᵀ
        "triangular_solve": 16 * 16 * (4 + 8),  # (I+L)⁻¹ [βv | βk e^G]
        "chunk_a": 8 * 16 * 8,                  # k̃ᵀ w
        "chunk_b": 8 * 16 * 4,                  # k̃ᵀ u
        "state_scan": 8 * 8 * 4,                # A_n S_n
        "outputs": 2 * 16 * 8 * 4 + 16 * 16 * 4,  # w S, q̃ S, attn v_new
    }
    got = reference_rule_flops(**TINY_RULE)
    for name, macs in macs_per_block.items():
        assert close(getattr(got, name), 2 * blocks * macs), name
    assert close(got.total, 2 * 12 * 11008)  # 11008 MACs per block, written out: 264192 FLOPs
    assert got.total == 264192


def test_rule_count_matches_torch_rule_matmuls():
    # FlopCounterMode counts bmm/baddbmm (2 FLOPs per MAC) but not linalg.solve_triangular:
    # everything else of our count must be exactly what the torch rule runs.
    B, T, Hk, Hv, Dk, Dv, C = (TINY_RULE[n] for n in (
        "batch", "seq_len", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim",
        "chunk_size"))
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, T, Hk, Dk, generator=gen) for _ in range(2))
    v = torch.randn(B, T, Hv, Dv, generator=gen)
    g, beta = -torch.rand(B, T, Hv, generator=gen), torch.rand(B, T, Hv, generator=gen)
    with FlopCounterMode(display=False) as counter:
        chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_size=C)
    counted = reference_rule_flops(**TINY_RULE)
    assert counter.get_total_flops() == counted.total - counted.triangular_solve


def test_reference_rule_linear_in_chunks_and_padded_like_the_code():
    base = dict(TINY_RULE, seq_len=16)
    one = reference_rule_flops(**base).total
    for chunks in (2, 5, 64):
        assert reference_rule_flops(**dict(base, seq_len=16 * chunks)).total == chunks * one
    assert reference_rule_flops(**dict(base, seq_len=17)).total == 2 * one
    assert reference_rule_flops(**dict(base, seq_len=1)).total == one
    assert reference_rule_flops(**dict(base, num_k_heads=2)).total == one  # q, k repeated


def test_model_rule_linear_in_tokens_unpadded():
    one = gdn_rule_flops(**dict(TINY_RULE, seq_len=1)).total
    for tokens in (16, 17, 40, 1000):
        assert gdn_rule_flops(**dict(TINY_RULE, seq_len=tokens)).total == tokens * one
    assert gdn_rule_flops(**dict(TINY_RULE, num_k_heads=2)).total == \
        gdn_rule_flops(**TINY_RULE).total  # q, k repeated to Hv
    # Below the reference rule by its Dk×Dk transition and state scan (and padding).
    C, K, V = 16, 8, 4
    per_chunk_extra = C * K * K + K * K * V
    full = dict(TINY_RULE, seq_len=48)
    assert reference_rule_flops(**full).total - gdn_rule_flops(**full).total == \
        2 * (2 * 2 * 3) * per_chunk_extra


def test_rule_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"chunk_size=48 is not one of \(16, 32, 64, 128\)"):
        gdn_rule_flops(**dict(TINY_RULE, chunk_size=48))
    with pytest.raises(ValueError, match="seq_len=0 must be a positive integer"):
        gdn_rule_flops(**dict(TINY_RULE, seq_len=0))
    with pytest.raises(ValueError, match="num_v_heads=3 must be a multiple of num_k_heads=2"):
        gdn_rule_flops(**dict(TINY_RULE, num_k_heads=2, num_v_heads=3))


def test_jax_inverse_extra():
    # C=16: one diagonal block, 15 row steps of 16×16 MACs; 12 (batch, head, chunk) blocks.
    got = unit_lower_inverse_flops(batch=2, seq_len=40, num_v_heads=2, chunk_size=16)
    assert got == 2 * 12 * 15 * 16 * 16
    # C=64: four diagonal blocks, then merges 16→32 (two, 2·16³ each) and 32→64 (one, 2·32³).
    got = unit_lower_inverse_flops(batch=1, seq_len=64, num_v_heads=1, chunk_size=64)
    assert got == 2 * (4 * 15 * 16 * 16 + 2 * 2 * 16 ** 3 + 2 * 32 ** 3)


def test_model_forward_hand_count():
    cfg = tiny_model()  # E=32, Hk=2, Hv=4, Dk=8, Dv=4, K=4, C=16, L=3, I=48, vocab=100
    B, T = 2, 40
    tokens = B * T
    key_dim, value_dim = 2 * 8, 4 * 4
    proj = (2 * tokens * 32 * (2 * key_dim + value_dim)  # in_proj_qkv
            + 2 * tokens * 32 * value_dim                # in_proj_z
            + 2 * 2 * tokens * 32 * 4                    # in_proj_b, in_proj_a
            + 2 * tokens * value_dim * 32)               # out_proj
    conv = 2 * tokens * (2 * key_dim + value_dim) * 4
    mlp = 3 * 2 * tokens * 32 * 48
    per_token = 16 * (3 * 8 + 2 * 4) + 3 * 8 * 4  # the standard form, per token and head
    rule = 2 * tokens * 4 * per_token  # B·T tokens · Hv, unpadded
    lm_head = 2 * tokens * 32 * 100
    fwd = model_forward_flops(cfg, batch=B, seq_len=T)
    assert fwd.gdn_projections == 3 * proj
    assert fwd.conv == 3 * conv
    assert fwd.mlp == 3 * mlp
    assert fwd.gdn_rule == 3 * rule
    assert fwd.lm_head == lm_head
    assert fwd.embedding == 0
    assert close(fwd.total, 3 * (proj + conv + mlp + rule) + lm_head)


@pytest.mark.parametrize("name", ["tiny", "qwen3.5-0.8b", "qwen3.5-27b"])
def test_step_is_three_forwards(name):
    cfg = get_preset(name)
    fwd = model_forward_flops(cfg, batch=2, seq_len=4096)
    step = model_flops_per_step(cfg, batch=2, seq_len=4096)
    for field in ("gdn_rule", "gdn_projections", "conv", "mlp", "lm_head", "embedding"):
        assert getattr(step, field) == 3 * getattr(fwd, field), field
    assert step.total == 3 * fwd.total
    assert model_flops_per_step(cfg, batch=4, seq_len=4096).total == 2 * step.total


def test_mfu_and_tokens_formulas():
    assert close(mfu(1e15, 2.0, 4, 1e14), 1e15 / (2.0 * 4 * 1e14))  # 1.25
    assert close(mfu(3 * 10 ** 12, 0.5, 8, 459e12), 3e12 / (0.5 * 8 * 459e12))
    assert close(tokens_per_s_per_chip(2, 1024, 0.5, 4), 1024.0)
    assert close(tokens_per_s_per_chip(1, 1_048_576, 31.94, 64), 1_048_576 / 31.94 / 64)
    with pytest.raises(ValueError, match="step_time_s=0"):
        mfu(1e15, 0, 4, 1e14)
    with pytest.raises(ValueError, match="chips=0 must be a positive integer"):
        tokens_per_s_per_chip(1, 1024, 1.0, 0)


def test_maxtext_gdn_reproduces_their_formula():
    # qwen3.5-0.8b shapes, B=1, S=4096: E=1024, Hk=Hv=16, Dk=Dv=128, K_conv=4,
    # K_dim = V_dim = 2048. MaxText: in_proj_qkvz+ba, out_proj, conv; core 8·Hv·Dk·Dv per token.
    qkvz_ba = 2 * 1 * 4096 * 1024 * (2 * 2048 + 2 * 2048 + 2 * 16)
    out = 2 * 1 * 4096 * 1024 * 2048
    conv = 2 * 1 * 4096 * 4 * (2 * 2048 + 2048)
    core = 1 * 4096 * 16 * (128 * 128) * 8
    got = maxtext_gdn_flops(batch=1, seq_len=4096, hidden_size=1024, num_k_heads=16,
                            num_v_heads=16, head_k_dim=128, head_v_dim=128, conv_kernel_size=4)
    assert got.weight == qkvz_ba + out + conv
    assert got.attention == core
    assert got.total == qkvz_ba + out + conv + core


def test_maxtext_model_hand_count():
    cfg = tiny_model()
    B, S = 2, 40
    gdn_weight = (2 * B * S * 32 * (2 * 16 + 2 * 16 + 2 * 4) + 2 * B * S * 32 * 16
                  + 2 * B * S * 4 * (2 * 16 + 16))
    gdn_attn = 8 * B * S * 4 * 8 * 4
    ffn = 2 * B * S * 48 * 32 * 2 + 2 * B * S * 48 * 32  # mlp_activations = (silu, linear)
    embedding = 2 * B * S * 32 * 100
    got = maxtext_model_flops_per_step(cfg, batch=B, seq_len=S)
    assert got.learnable_weight == 3 * ((ffn + gdn_weight) * 3 + embedding)
    assert got.attention == 3 * gdn_attn * 3
    # Same projections, conv, MLP and LM head as ours: only the rule is counted differently.
    ours = model_flops_per_step(cfg, batch=B, seq_len=S)
    assert got.learnable_weight == ours.gdn_projections + ours.conv + ours.mlp + ours.lm_head


CP_SHAPE = dict(batch=1, num_v_heads=16, head_k_dim=128, head_v_dim=128, chunk_size=64,
                num_layers=24)


@pytest.mark.parametrize("mode", CP_MODES)
def test_cp_overhead_zero_on_one_chip(mode):
    assert cp_overhead_flops(mode, chips=1, seq_len=8192, **CP_SHAPE).total == 0


def test_cp_overhead_per_mode():
    for chips in (2, 4, 8, 16):
        assert cp_overhead_flops("ulysses", chips=chips, seq_len=4096 * chips,
                                 **CP_SHAPE).total == 0
        assert cp_overhead_flops("p2p", chips=chips, seq_len=4096 * chips, **CP_SHAPE).total > 0
    for mode in ("all_gather", "log_scan"):
        fixed_global = [cp_overhead_flops(mode, chips=d, seq_len=65536, **CP_SHAPE).total
                        for d in (2, 4, 8, 16, 32)]
        fixed_local = [cp_overhead_flops(mode, chips=d, seq_len=4096 * d, **CP_SHAPE).total
                       for d in (2, 4, 8, 16, 32)]
        assert 0 < fixed_global[0]
        assert all(a < b for a, b in zip(fixed_global, fixed_global[1:])), (mode, fixed_global)
        assert all(a < b for a, b in zip(fixed_local, fixed_local[1:])), (mode, fixed_local)


def test_cp_overhead_hand_count():
    # all_gather, D=4, T=800, C=64: local shard 200 tokens → n=4 chunks; 13 chunks unsharded.
    B, Hv, K, V, L = 2, 3, 16, 8, 5
    got = cp_overhead_flops("all_gather", chips=4, batch=B, seq_len=800, num_v_heads=Hv,
                            head_k_dim=K, head_v_dim=V, chunk_size=64, num_layers=L)
    scale = 3 * 2 * B * Hv * L  # fwd+bwd × FLOPs per MAC × rows × heads × layers
    compose = K ** 3 + K * K * V
    per_block = 64 * 64 * (3 * K + 2 * V) + 64 * K * K + 3 * 64 * K * V + K * K * V
    assert got.fold == scale * 4 * (4 - 1) * compose
    assert got.prefix == scale * 4 * 3 * K * K * V  # each chip runs 3 more pairs over h
    assert got.state_apply == scale * 4 * K * K * V
    assert got.shard_padding == scale * (16 - 13) * per_block
    rest = dict(batch=B, seq_len=800, num_v_heads=Hv, head_k_dim=K, head_v_dim=V,
                chunk_size=64, num_layers=L)
    log_scan = cp_overhead_flops("log_scan", chips=4, **rest)
    assert log_scan.prefix == scale * 4 * 2 * compose  # rounds d=1, 2: one round after the first
    assert log_scan.fold == got.fold and log_scan.state_apply == got.state_apply
    assert cp_overhead_flops("log_scan", chips=2, **rest).prefix == 0  # one round: no compose
    p2p = cp_overhead_flops("p2p", chips=4, **rest)
    assert p2p.prefix == 0 and p2p.total == got.total - got.prefix


def test_cp_overhead_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode='ring' is not one of: ulysses, p2p, all_gather"):
        cp_overhead_flops("ring", chips=2, seq_len=1024, **CP_SHAPE)
    with pytest.raises(ValueError, match="seq_len=1000 is not divisible by chips=3"):
        cp_overhead_flops("p2p", chips=3, seq_len=1000, **CP_SHAPE)
    with pytest.raises(ValueError, match="ulysses"):
        hardware_flops_per_step(get_preset("qwen3.5-0.8b"), mode="ulysses", chips=32,
                                batch=1, seq_len=32 * 1024, framework="jax")


@pytest.mark.parametrize("mode", CP_MODES)
def test_cp_overhead_design_target(mode):
    # Design target: at qwen3.5-0.8b, a 4096-token local shard and D=8, the CP summary work is
    # below 10% of the model FLOPs.
    cfg = get_preset("qwen3.5-0.8b")
    hardware = hardware_flops_per_step(cfg, mode=mode, chips=8, batch=1, seq_len=8 * 4096,
                                       framework="jax")
    model = model_flops_per_step(cfg, batch=1, seq_len=8 * 4096)
    assert hardware.model == model
    assert hardware.total == (model.total + hardware.rule.total + hardware.cp_overhead.total
                              + hardware.recompute.total + hardware.solve.total)
    assert hardware.cp_overhead.total < 0.10 * model.total


def test_recompute_hand_count():
    # remat recomputes one forward of what it drops; the chunked loss one LM-head forward.
    cfg = get_preset("tiny")
    B, T, D = 2, 512, 4
    fwd = model_forward_flops(cfg, batch=B, seq_len=T)
    runs = {remat: hardware_flops_per_step(cfg, mode="p2p", chips=D, batch=B, seq_len=T,
                                           framework="torch", remat=remat)
            for remat in ("none", "gdn", "full")}
    cp_forward = runs["none"].cp_overhead.total // 3
    gdn = cfg.gdn
    rule_forward = cfg.num_layers * reference_rule_flops(
        batch=B, seq_len=T, num_k_heads=gdn.num_k_heads, num_v_heads=gdn.num_v_heads,
        head_k_dim=gdn.head_k_dim, head_v_dim=gdn.head_v_dim, chunk_size=gdn.chunk_size).total
    assert runs["none"].recompute.layers == 0
    assert runs["none"].recompute.lm_head == fwd.lm_head
    # the rule is recomputed as the (reference) kernel runs it, not as the model counts it
    assert runs["gdn"].recompute.layers == rule_forward + fwd.conv + cp_forward
    assert runs["full"].recompute.layers == (fwd.total - fwd.lm_head - fwd.embedding
                                             - fwd.gdn_rule + rule_forward + cp_forward)
    # HFU rises with remat; the model FLOPs (MFU's numerator) do not move.
    assert runs["none"].total < runs["gdn"].total < runs["full"].total
    assert len({run.model.total for run in runs.values()}) == 1
    with pytest.raises(ValueError, match="remat='some' is not one of: none, full, gdn"):
        hardware_flops_per_step(cfg, mode="p2p", chips=D, batch=B, seq_len=T,
                                framework="torch", remat="some")


ONE_BLOCK = dict(mode="p2p", chips=1, batch=1, seq_len=16, num_v_heads=1, head_k_dim=8,
                 head_v_dim=4, chunk_size=16, num_layers=1)


def test_solve_hand_count_per_framework():
    # One block, C=16, R = Dk + Dv = 12 right-hand sides; MACs, 2 FLOPs each.
    C, R = 16, 12
    dense_apply = C * C * R  # 3072: the model count's convention, per forward
    torch_run = solve_flops("torch", remat="none", **ONE_BLOCK)
    # Forward substitution of a unit lower triangle: row i takes i MACs per column.
    assert torch_run.ran_forward == 2 * sum(range(C)) * R == 2 * 1440
    # Backward: the transposed solve for d(rhs), and dL = −d(rhs)·Xᵀ as a dense product.
    assert torch_run.ran_backward == 2 * (1440 + dense_apply)
    assert torch_run.counted == 2 * 3 * dense_apply
    assert torch_run.total == 2 * (1440 + 1440 + 3072 - 9216) == -6528
    jax_run = solve_flops("jax", remat="none", **ONE_BLOCK)
    # Forward: the inverse by substitution (15 rows × 16·16 at C=16) and T·rhs, dense.
    inverse = unit_lower_inverse_flops(batch=1, seq_len=16, num_v_heads=1, chunk_size=16)
    assert inverse == 2 * 15 * 16 * 16
    assert jax_run.ran_forward == inverse + 2 * dense_apply
    # Backward: dT and d(rhs) of the apply, and the inverse's VJP −Tᵀ dT Tᵀ (two C³).
    assert jax_run.ran_backward == 2 * (2 * dense_apply + 2 * C ** 3)
    assert jax_run.total == 2 * (3840 + 3072 + 6144 + 8192 - 9216) == 24064
    # A recomputed rule (remat gdn or full) runs its forward once more, counted once more.
    again = solve_flops("jax", remat="gdn", **ONE_BLOCK)
    assert again.ran_recompute == jax_run.ran_forward
    assert again.counted == jax_run.counted + 2 * dense_apply
    assert solve_flops("torch", remat="full", **ONE_BLOCK).ran_recompute == 2 * 1440


def test_torch_solve_backward_is_a_dense_product():
    # FlopCounterMode counts no FLOPs for linalg.solve_triangular itself, but counts the
    # matmul its backward runs for dL: exactly C·C·R MACs per block, as solve_flops says.
    C, R, blocks = 16, 12, 3
    L_NCC = torch.randn(blocks, C, C, requires_grad=True)
    rhs_NCR = torch.randn(blocks, C, R, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        x = torch.linalg.solve_triangular(L_NCC, rhs_NCR, upper=False, unitriangular=True)
        assert counter.get_total_flops() == 0
        x.sum().backward()
    assert counter.get_total_flops() == 2 * blocks * C * C * R


@pytest.mark.parametrize("remat", ["none", "gdn", "full"])
@pytest.mark.parametrize("mode,chips", [("p2p", 1), ("log_scan", 4), ("ulysses", 2)])
def test_frameworks_differ_by_exactly_the_solve_term(mode, chips, remat):
    cfg = tiny_model()
    # 4 × 24 tokens: under log_scan each shard pads 24 → 32 (8 chunks run, 6 in the model).
    shape = dict(mode=mode, chips=chips, batch=2, seq_len=96, remat=remat)
    jax_run = hardware_flops_per_step(cfg, framework="jax", **shape)
    torch_run = hardware_flops_per_step(cfg, framework="torch", **shape)
    assert (jax_run.model, jax_run.rule, jax_run.cp_overhead, jax_run.recompute) == (
        torch_run.model, torch_run.rule, torch_run.cp_overhead, torch_run.recompute)
    assert jax_run.total - torch_run.total == jax_run.solve.total - torch_run.solve.total > 0
    gdn = cfg.gdn
    chunks = {1: 6, 2: 6, 4: 8}[chips]  # ceil(96/16); ulysses splits heads; shards padded
    blocks = 2 * gdn.num_v_heads * chunks * cfg.num_layers
    per_block = solve_flops("torch", mode="p2p", chips=1, batch=1, seq_len=16,
                            num_v_heads=1, head_k_dim=gdn.head_k_dim,
                            head_v_dim=gdn.head_v_dim, chunk_size=16, num_layers=1,
                            remat=remat)
    assert torch_run.solve.total == blocks * per_block.total
    with pytest.raises(ValueError, match="framework='tf' is not one of: jax, torch"):
        hardware_flops_per_step(cfg, framework="tf", **shape)


# ---------------------------------------------------------------- hybrid attention (issue 13)

import dataclasses  # noqa: E402

from gdn_core.flops.attention import (  # noqa: E402
    attention_cp_extra_flops,
    attention_imbalance,
    attention_layer_flops,
    causal_pairs,
    computed_pairs,
    rank_causal_pairs,
)
from gdn_core.config import AttentionConfig  # noqa: E402
from gdn_core.cp_layout import local_positions  # noqa: E402


def tiny_hybrid() -> ModelConfig:
    # 4 layers, every 2nd full attention: GDN, attn, GDN, attn; attention H=4, G=2, hd=8
    gdn = GDNConfig(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=4,
                    conv_kernel_size=4, chunk_size=16)
    attention = AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=8,
                                partial_rotary_factor=0.5, full_attention_interval=2)
    return ModelConfig(name="custom", gdn=gdn, num_layers=4, intermediate_size=48,
                       vocab_size=100, attention=attention, layers="hybrid")


def test_attention_layer_hand_count():
    # B=2, T=10, E=32, H=4, G=2, hd=8: 20 tokens; causal pairs 10·11/2 = 55 per row and head
    got = attention_layer_flops(batch=2, seq_len=10, hidden_size=32, num_heads=4,
                                num_kv_heads=2, head_dim=8)
    assert got.q_proj == 2 * 20 * 32 * 64          # queries and gate: 2·H·hd = 64 outputs
    assert got.kv_proj == 2 * 20 * 32 * 32         # k and v: 2·G·hd = 32 outputs
    assert got.o_proj == 2 * 20 * 32 * 32          # H·hd = 32 inputs
    assert got.scores == got.weighted_values == 2 * 2 * 4 * 8 * 55
    # the causal pairs, counted one by one
    assert causal_pairs(10) == sum(1 for q in range(10) for k in range(10) if k <= q) == 55


def test_hybrid_model_counts_attention_in_its_attention_layers_only():
    cfg, B, T = tiny_hybrid(), 2, 40
    gdn_only = model_forward_flops(dataclasses.replace(cfg, layers="gdn_only"), batch=B,
                                   seq_len=T)
    hybrid = model_forward_flops(cfg, batch=B, seq_len=T)
    pairs = T * (T + 1) // 2
    attention_layer = (2 * B * T * 32 * (64 + 32) + 2 * B * T * 32 * 32    # q, k, v, o_proj
                       + 2 * 2 * B * 4 * 8 * pairs)                          # QKᵀ, AV
    assert hybrid.attention_projections == 2 * (2 * B * T * 32 * (64 + 32) + 2 * B * T * 32 * 32)
    assert hybrid.attention_core == 2 * 2 * 2 * B * 4 * 8 * pairs
    assert hybrid.mlp == gdn_only.mlp and hybrid.lm_head == gdn_only.lm_head
    gdn_layer = (gdn_only.gdn_rule + gdn_only.gdn_projections + gdn_only.conv) // 4
    assert hybrid.total == gdn_only.total - 2 * gdn_layer + 2 * attention_layer
    assert model_flops_per_step(cfg, batch=B, seq_len=T).total == 3 * hybrid.total


def test_maxtext_hybrid_reproduces_their_qwen3_next_branch():
    # calculate_tflops_training_per_device, QWEN3_NEXT: num_full = L // interval, qkv without
    # the gate, causal attention = 4·B·T²·H·hd / 2, GDN parts in the other layers, all × 3
    cfg, B, T = tiny_hybrid(), 2, 40
    E, I, V, H, G, hd = 32, 48, 100, 4, 2, 8
    gdn = maxtext_gdn_flops(batch=B, seq_len=T, hidden_size=E, num_k_heads=2, num_v_heads=4,
                            head_k_dim=8, head_v_dim=4, conv_kernel_size=4)
    full, linear = 4 // 2, 4 - 4 // 2
    qkv = 2 * B * T * E * (H + 2 * G) * hd
    projection = 2 * B * T * E * H * hd
    causal = 4 * B * T ** 2 * H * hd / 2
    ffn = 2 * B * T * I * E * 2 + 2 * B * T * I * E
    weights = ffn * 4 + 2 * B * T * E * V + (qkv + projection) * full + gdn.weight * linear
    attention = causal * full + gdn.attention * linear
    got = maxtext_model_flops_per_step(cfg, batch=B, seq_len=T)
    assert got.learnable_weight == 3 * weights and got.attention == 3 * attention
    # ours counts the gate's half of q_proj, and T(T+1)/2 pairs where MaxText counts T²/2
    ours = model_flops_per_step(cfg, batch=B, seq_len=T)
    assert ours.attention_projections - 3 * (qkv + projection) * full == \
        3 * full * 2 * B * T * E * H * hd
    assert ours.attention_core - 3 * causal * full == 3 * full * 2 * B * H * hd * T


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("chips", [2, 4])
def test_rank_causal_pairs_sum_positions_and_balance_under_zigzag(layout, chips):
    T = 64
    per_rank = [rank_causal_pairs(chip=r, chips=chips, seq_len=T, layout=layout)
                for r in range(chips)]
    brute = [int((local_positions(chip=r, chips=chips, seq_len=T, layout=layout) + 1).sum())
             for r in range(chips)]
    assert per_rank == brute and sum(per_rank) == causal_pairs(T)
    imbalance = attention_imbalance(chips=chips, seq_len=T, layout=layout)
    if layout == "zigzag":
        assert imbalance == 1.0
    else:  # t = T/D: last rank t·(D−1)·t + t(t+1)/2 over the first's t(t+1)/2
        t = T // chips
        assert imbalance == pytest.approx(((chips - 1) * t * t + t * (t + 1) / 2)
                                          / (t * (t + 1) / 2))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_attention_cp_extra_work_hand_count(layout):
    B, T, H, hd, D, L = 1, 64, 4, 8, 4, 2
    n = D * (2 if layout == "zigzag" else 1)
    s = T // n
    # ring computes every segment pair whose keys do not all follow its queries, whole
    ring_pairs = sum(s * s for i in range(n) for j in range(n) if j <= i)
    assert computed_pairs("ring", chips=D, seq_len=T, layout=layout) == ring_pairs
    assert computed_pairs("all_gather_kv", chips=D, seq_len=T, layout=layout) == T * T
    assert computed_pairs("ulysses", chips=D, seq_len=T, layout=layout) == T * (T + 1) // 2
    per_pair = 3 * 2 * 2 * B * H * hd  # fwd + bwd, QKᵀ and AV, 2 FLOPs per MAC
    for attn_cp, pairs in (("ring", ring_pairs), ("all_gather_kv", T * T)):
        assert attention_cp_extra_flops(attn_cp, chips=D, batch=B, seq_len=T, num_heads=H,
                                        head_dim=hd, num_layers=L, layout=layout) == \
            per_pair * L * (pairs - T * (T + 1) // 2)
    cfg = tiny_hybrid()
    hw = hardware_flops_per_step(cfg, mode="p2p", chips=D, batch=B, seq_len=T,
                                 framework="torch", attn_cp="ring", layout=layout)
    assert hw.attention_cp == per_pair * 2 * (ring_pairs - T * (T + 1) // 2)
    one_chip = hardware_flops_per_step(cfg, mode="p2p", chips=1, batch=B, seq_len=T,
                                       framework="torch")
    assert one_chip.attention_cp == 0


def test_hybrid_hardware_flops_refuse_what_attention_cp_cannot_split():
    with pytest.raises(ValueError, match="query heads \\(4\\) divisible by chips=8"):
        hardware_flops_per_step(tiny_hybrid(), mode="p2p", chips=8, batch=1, seq_len=256,
                                framework="jax", attn_cp="ulysses")
    with pytest.raises(ValueError, match="not divisible by 8"):
        hardware_flops_per_step(tiny_hybrid(), mode="p2p", chips=4, batch=1, seq_len=36,
                                framework="jax", layout="zigzag")
