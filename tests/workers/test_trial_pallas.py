"""JAX's fused GDN (the Pallas chunk rule) through a local Ray (workers.driver.run_sweep): on a
CPU without GDN_SWEEP_INTERPRET_KERNELS=1 a fused JAX trial is `skipped` with the reason,
never run as the reference; with the switch, issue 39's acceptance sweep — tiny GDN-only and
hybrid, p2p and log_scan, chips 1 and 2 — succeeds with the interpreted rule recorded."""

from __future__ import annotations

import pytest

from gdn_core.interpreted_kernels import INTERPRET_ENV
from workers.driver import run_sweep

from .conftest import MemorySink, assert_consistent_metrics, assert_no_leaks, tiny_spec

NO_CHIP = ("the Pallas chunk rule needs a TPU or GPU; on a CPU set GDN_SWEEP_INTERPRET_KERNELS=1 "
           "to run it through Pallas's interpreter")
INTERPRETED = "gdn_core pallas chunk rule (interpreted)"


@pytest.mark.timeout(120)
def test_fused_jax_on_cpu_without_the_switch_is_skipped_with_the_reason(local_ray, monkeypatch):
    monkeypatch.delenv(INTERPRET_ENV, raising=False)
    (result,) = run_sweep(tiny_spec(frameworks=["jax"], kernels=["fused"]), MemorySink())
    assert result.status == "skipped"
    assert NO_CHIP in result.error
    m = result.metrics
    assert m.step_time_s is None and m.tokens_per_s_per_chip is None and m.gdn_kernel is None
    assert_no_leaks()


@pytest.mark.slow  # a dozen interpreted JAX compiles: minutes on this machine
@pytest.mark.timeout(2400)
def test_acceptance_sweep_with_the_interpreted_pallas_rule_succeeds(local_ray, monkeypatch):
    monkeypatch.setenv(INTERPRET_ENV, "1")
    spec = tiny_spec(frameworks=["jax"], kernels=["fused"], layers=["gdn_only", "hybrid"],
                     modes=["p2p", "log_scan"], attn_cps=["ring"], chips=[1, 2],
                     seq_lens=[256], model={"preset": "tiny", "num_layers": 2}, steps=1,
                     trial_timeout_s=900.0)
    results = run_sweep(spec, MemorySink())
    seen = {(r.trial.layers, r.trial.mode, r.trial.chips) for r in results}
    assert {(layers, chips) for layers, _, chips in seen} == {
        (layers, chips) for layers in ("gdn_only", "hybrid") for chips in (1, 2)}
    assert {mode for _, mode, chips in seen if chips == 2} == {"p2p", "log_scan"}
    for result in results:
        assert result.status == "succeeded", (result.trial.key, result.error)
        assert_consistent_metrics(result)
        assert result.metrics.gdn_kernel == INTERPRETED, result.trial.key
    assert_no_leaks()
