"""The kernels dimension through a local Ray (workers.trial_runner): each trial's workers
resolve its kernels where the device and packages are known; a fused point they cannot serve
is `skipped` with the reason (no metrics, never run as the reference), and a succeeded trial
records what ran."""

from __future__ import annotations

import pytest

from gdn_core.kernels import PALLAS_NEEDS_A_CHIP, REFERENCE_GDN
from workers.driver import run_sweep

from .conftest import MemorySink, assert_consistent_metrics, assert_no_leaks, tiny_spec

FLA_ON_CPU = ("fla-core's chunk_gated_delta_rule needs a CUDA device (Triton); this trial runs "
              "on cpu (GDN_SWEEP_INTERPRET_KERNELS=1 runs it through Triton's interpreter on a "
              "CPU: a correctness check, not a speed)")


@pytest.mark.timeout(300)
@pytest.mark.slow  # a JAX compile on one chip (~15 s here, less with a warm cache)
def test_reference_and_fused_on_cpu_fused_skipped_in_both(local_ray, monkeypatch):
    monkeypatch.delenv("GDN_SWEEP_INTERPRET_KERNELS", raising=False)
    spec = tiny_spec(frameworks=["torch", "jax"], kernels=["reference", "fused"])
    results = {(r.trial.framework, r.trial.kernels): r for r in run_sweep(spec, MemorySink())}
    assert len(results) == 4

    torch_fused = results["torch", "fused"]
    assert (torch_fused.status, torch_fused.error) == ("skipped", FLA_ON_CPU)
    assert torch_fused.trial.key.endswith("/kernels=fused")
    assert [a.status for a in torch_fused.attempt_history] == ["skipped"]
    m = torch_fused.metrics
    assert m.step_time_s is None and m.tokens_per_s_per_chip is None and m.mfu is None
    assert m.gdn_kernel is None and m.attention_kernel is None

    jax_fused = results["jax", "fused"]  # the Pallas rule: a TPU or GPU, or interpreted
    assert (jax_fused.status, jax_fused.error) == ("skipped", PALLAS_NEEDS_A_CHIP)
    assert jax_fused.metrics.step_time_s is None and jax_fused.metrics.gdn_kernel is None
    for framework in ("torch", "jax"):
        reference = results[framework, "reference"]
        assert_consistent_metrics(reference)
        assert not reference.trial.key.endswith("/kernels=reference")
        assert (reference.metrics.gdn_kernel, reference.metrics.attention_kernel) == (
            REFERENCE_GDN[framework], None)
    assert_no_leaks()


@pytest.mark.timeout(120)
def test_torch_fused_on_cpu_is_skipped_with_the_fla_reason(local_ray):
    """The default tier's share: one torch point, reference runs, fused is skipped."""
    results = {r.trial.kernels: r for r in run_sweep(tiny_spec(kernels=["reference", "fused"]),
                                                     MemorySink())}
    assert (results["fused"].status, results["fused"].error) == ("skipped", FLA_ON_CPU)
    assert results["fused"].metrics.tokens_per_s_per_chip is None
    assert_consistent_metrics(results["reference"])
    assert results["reference"].metrics.gdn_kernel == "reference torch chunk rule"
    assert_no_leaks()


INTERPRETED = " (interpreted)"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("framework, seq_len, gdn_interpreted, attention_interpreted", [
    ("torch", 128, True, False),  # fla under Triton's interpreter; SDPA runs natively on a CPU
    # the Pallas GDN rule and splash (128-token segments) under Pallas's interpreter
    pytest.param("jax", 256, True, True, marks=pytest.mark.slow),
])
def test_fused_hybrid_trial_with_interpreted_kernels_succeeds_and_says_so(
        local_ray, monkeypatch, framework, seq_len, gdn_interpreted, attention_interpreted):
    """GDN_SWEEP_INTERPRET_KERNELS=1 in the driver reaches the trial's processes: a fused
    hybrid trial (p2p GDN, ring attention, 2 chips) succeeds on a CPU and stores which of its
    kernels ran interpreted. (Its numbers against one chip: the interpreted step tests,
    test_torch_fused_interpreted.py and test_jax_splash_interpreted.py; here only what crosses
    Ray, to keep the trial inside the default tier's budget.)"""
    monkeypatch.setenv("GDN_SWEEP_INTERPRET_KERNELS", "1")
    spec = tiny_spec(frameworks=[framework], kernels=["fused"], layers=["hybrid"],
                     modes=["p2p"], attn_cps=["ring"], chips=[2], seq_lens=[seq_len],
                     model={"preset": "tiny", "num_layers": 2}, steps=1,
                     trial_timeout_s=240.0)
    (result,) = run_sweep(spec, MemorySink())
    assert result.status == "succeeded", result.error
    assert_consistent_metrics(result)
    m = result.metrics
    assert m.gdn_kernel.endswith(INTERPRETED) == gdn_interpreted, m.gdn_kernel
    assert m.attention_kernel.endswith(INTERPRETED) == attention_interpreted, m.attention_kernel
    assert_no_leaks()
