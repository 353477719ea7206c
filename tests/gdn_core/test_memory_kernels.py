"""The memory predictor's `kernels`: fused torch GDN adds fla-core's workspace, fused JAX GDN the
Pallas chunk rule's (each counted from its source, gdn_core/memory/kernel_workspace.py), and
nothing else moves.

Counted here by hand from fla-core 0.6.0's chunk.py, independently of the module's helpers:
per call, what its forward saves (q, k normed; their float32 rstd; g's float32 cumsum; A) and
what its backward allocates (h and dh per chunk; w, dq, dk, dw, dk2 at Hv·K; u, v_new, dv, dv2
and the WY dv at Hv·W; db; dg ×3 in float32).
"""

from __future__ import annotations

import pytest

from gdn_core.config import GDNConfig, ModelConfig
from gdn_core.memory.kernel_workspace import FLA_WORKSPACE_SOURCE, PALLAS_WORKSPACE_SOURCE
from gdn_core.memory.step import predict_step_memory
from gdn_core.presets import get_preset
from gdn_core.train_config import TrainConfig

# Distinct dims, so a width counted at the wrong size shows.
HK, HV, K, V, C, LAYERS = 2, 4, 16, 24, 16, 3
MODEL = ModelConfig(name="kernels-memory-test",
                    gdn=GDNConfig(hidden_size=64, num_k_heads=HK, num_v_heads=HV, head_k_dim=K,
                                  head_v_dim=V, conv_kernel_size=4, chunk_size=C),
                    num_layers=LAYERS, intermediate_size=128, vocab_size=256)


def by_hand(tokens: int, *, b: int, remat: str, summary: bool) -> int:
    """fla's workspace for `tokens` tokens on a chip, counted from fla's source."""
    def saved(width, nbytes, extra_inputs):
        per_token = 2 * HK * K * nbytes + 2 * HK * 4 + HV * 4 + HV * C * nbytes
        if extra_inputs:  # the summary call's own [0 | v] values and float32 beta
            per_token += HV * width * 4 + HV * 4
        return tokens * per_token

    def transient(width, nbytes):
        chunks = tokens // C
        return (2 * chunks * HV * K * width * nbytes
                + tokens * ((5 * HV * K + 5 * HV * width + HV) * nbytes + 3 * HV * 4))

    kept = saved(V, b, False) + (saved(K + V, 4, True) if summary else 0)
    biggest = max([transient(V, b)] + ([transient(K + V, 4)] if summary else []))
    return (LAYERS if remat == "none" else 1) * kept + biggest


def both(train, **kw):
    return (predict_step_memory(MODEL, train, framework="torch", kernels="reference", **kw),
            predict_step_memory(MODEL, train, framework="torch", kernels="fused", **kw))


@pytest.mark.parametrize("dtype, remat", [("bfloat16", "none"), ("bfloat16", "full"),
                                          ("float32", "gdn")])
def test_fused_torch_adds_the_stated_workspace_on_one_chip(dtype, remat):
    train = TrainConfig(seq_len=1024, dtype=dtype, remat=remat)
    reference, fused = both(train, mode="p2p", chips=1)
    workspace = by_hand(1024, b=2 if dtype == "bfloat16" else 4, remat=remat, summary=False)
    assert fused.kernel_workspace == workspace > 0
    assert fused.total - reference.total == workspace  # held in backward, beside the rest
    assert reference.kernel_workspace == 0 and reference.kernel_workspace_source == "none"
    assert fused.kernel_workspace_source == FLA_WORKSPACE_SOURCE
    assert "estimate" in FLA_WORKSPACE_SOURCE and "until measured on a chip" in \
        FLA_WORKSPACE_SOURCE
    # Only the workspace moves: every other part is the reference step's.
    for part in ("weights", "compute_weights", "grads", "optimizer_state", "activations",
                 "backward_working", "exchange_buffers", "loss_logits", "temporaries"):
        assert getattr(fused, part) == getattr(reference, part), part


@pytest.mark.parametrize("mode, summary", [("p2p", True), ("all_gather", True),
                                           ("log_scan", True), ("ulysses", False)])
def test_sequence_sharded_modes_add_the_summary_call_at_width_k_plus_v(mode, summary):
    chips = 4
    train = TrainConfig(seq_len=chips * 256, dtype="bfloat16", remat="none")
    reference, fused = both(train, mode=mode, chips=chips)
    # A chip's 256 tokens: ulysses' whole sequence of Hv/D heads is as many elements.
    assert fused.kernel_workspace == by_hand(256, b=2, remat="none", summary=summary)
    assert fused.total - reference.total == fused.kernel_workspace
    one_call = by_hand(256, b=2, remat="none", summary=False)
    assert (fused.kernel_workspace > one_call) == summary


def pallas_by_hand(tokens: int, *, b: int, remat: str, summary: bool, gpu: bool) -> int:
    """The Pallas chunk rule's workspace, counted from jax_gdn/pallas's custom_vjp: residuals
    q, k, v heads-major, G and β float32 rows, the state entering each chunk (GPU: and w);
    backward outputs dq, dk per value head, dv, dG, dβ in float32 (GPU: and c, dS per chunk)."""
    chunks = tokens // C

    def saved(width, nbytes):
        return (tokens * ((2 * HK * K + HV * width) * nbytes + 2 * HV * 4 + (HV * K * 4 if gpu
                                                                             else 0))
                + chunks * HV * K * width * 4)

    def transient(width):
        return (tokens * (2 * HV * K + HV * width + 2 * HV) * 4
                + (2 * chunks * HV * K * width * 4 if gpu else 0))

    kept = saved(V, b) + (saved(K + V, 4) if summary else 0)
    biggest = max([transient(V)] + ([transient(K + V)] if summary else []))
    return (LAYERS if remat == "none" else 1) * kept + biggest


@pytest.mark.parametrize("mode, chips, summary", [("p2p", 1, False), ("log_scan", 4, True),
                                                  ("ulysses", 4, False)])
@pytest.mark.parametrize("device_kind, gpu", [(None, True), ("gpu", True), ("tpu", False),
                                              ("cpu", False)])
def test_fused_jax_adds_the_pallas_rules_residuals(mode, chips, summary, device_kind, gpu):
    train = TrainConfig(seq_len=chips * 256, dtype="bfloat16", remat="none")
    reference, fused = (predict_step_memory(MODEL, train, mode=mode, chips=chips,
                                            framework="jax", kernels=kernels,
                                            device_kind=device_kind)
                        for kernels in ("reference", "fused"))
    assert fused.kernel_workspace == pallas_by_hand(256, b=2, remat="none", summary=summary,
                                                    gpu=gpu) > 0
    assert fused.total - reference.total == fused.kernel_workspace
    assert fused.kernel_workspace_source == PALLAS_WORKSPACE_SOURCE
    assert "Pallas" in PALLAS_WORKSPACE_SOURCE and "until measured on a chip" in \
        PALLAS_WORKSPACE_SOURCE


def test_the_reference_kernels_add_nothing_and_unknown_kernels_are_refused():
    train = TrainConfig(seq_len=512, dtype="bfloat16")
    for framework in ("jax", "torch"):
        default = predict_step_memory(MODEL, train, mode="p2p", chips=1, framework=framework)
        assert default.kernels == "reference" and default.kernel_workspace == 0
    with pytest.raises(ValueError, match="fast"):
        predict_step_memory(MODEL, train, mode="p2p", chips=1, framework="torch",
                            kernels="fast")


def test_the_device_checks_step_rows_fit_an_h100_with_remat_full_and_not_without():
    """The figures the device check's plan rests on: qwen3.5-0.8b hybrid, 24 layers, 32K."""
    model = get_preset("qwen3.5-0.8b", layers="hybrid")
    gib = 2 ** 30
    for framework in ("torch", "jax"):
        for kernels in ("reference", "fused"):
            full, none = (predict_step_memory(
                model, TrainConfig(seq_len=32768, dtype="bfloat16", remat=remat),
                mode="p2p", chips=1, framework=framework, kernels=kernels).total
                for remat in ("full", "none"))
            assert full < 40 * gib, (framework, kernels, full / gib)
            assert none > 150 * gib, (framework, kernels, none / gib)
