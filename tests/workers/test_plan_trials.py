"""Plan trials (kind "plan") through the driver on a local Ray: compiled, never run, beside
measured trials of the same points."""

from __future__ import annotations

import pytest

from workers.driver import run_sweep
from workers.events import TrialStarted
from workers.grid import expand_trials
from workers.sweep_spec import SweepSpec

from .conftest import MemorySink, assert_no_leaks, tiny_spec

POINT = "jax/p2p/chips=2/seq_len=128/dtype=float32/param_sharding=replicated/remat=none"


def test_a_sweep_mixes_kinds_and_plans_are_jax_only_and_never_repeated():
    spec = tiny_spec(kinds=["measure", "plan"], frameworks=["jax", "torch"], modes=["p2p"],
                     chips=[1, 2], seq_lens=[128], repeats=2)
    trials = expand_trials(spec)
    plans = [t for t in trials if t.kind == "plan"]
    assert len(trials) == spec.grid_size == 2 * 2 * 2 + 2
    assert sorted(t.key for t in plans) == sorted([f"plan/{POINT}", "plan/jax/none/chips=1/"
                                                   "seq_len=128/dtype=float32/param_sharding="
                                                   "replicated/remat=none"])
    assert all(t.framework == "jax" and t.baseline_key is None and not t.verify for t in plans)
    with pytest.raises(ValueError, match="a plan compiles the JAX step; add 'jax'"):
        tiny_spec(kinds=["plan"], frameworks=["torch"])


def test_plans_are_not_refused_for_memory_a_measured_point_would_not_fit():
    spec = tiny_spec(kinds=["measure", "plan"], frameworks=["jax"], modes=["p2p"], chips=[2],
                     seq_lens=[2 ** 24], model={"preset": "qwen3.5-9b"},
                     accelerator={"kind": "gpu", "type": "h100"})
    measured, plan = expand_trials(spec)
    assert "exceeds" in measured.skip_reason and plan.skip_reason is None


SPEC = dict(kinds=["measure", "plan"], frameworks=["jax"], modes=["p2p"], chips=[2],
            seq_lens=[128])


@pytest.mark.slow  # 16 s: a measured JAX trial and its plan
@pytest.mark.timeout(400)
def test_a_plan_trial_beside_the_measured_one_compiles_the_same_program(local_ray):
    """A plan compiles the same program the measured trial runs: XLA's estimate and the
    collective bytes agree exactly; it records no measurement."""
    sink, events = MemorySink(), []
    run_sweep(tiny_spec(**SPEC), sink, on_event=events.append)
    by_key = sink.by_key()
    measured, plan = by_key[POINT], by_key[f"plan/{POINT}"]
    assert measured.status == plan.status == "succeeded", (measured.error, plan.error)
    m, p = measured.metrics, plan.metrics
    assert p.estimated_memory_bytes_per_chip == m.estimated_memory_bytes_per_chip > 0
    assert "XLA:CPU compile for 2 virtual chips" in p.estimated_memory_source
    assert (p.cp_comm_bytes_per_step_per_chip, p.grad_sync_bytes_per_step_per_chip) == (
        m.cp_comm_bytes_per_step_per_chip, m.grad_sync_bytes_per_step_per_chip)
    assert p.predicted_memory_bytes_per_chip == m.predicted_memory_bytes_per_chip
    assert p.model_flops_per_step == m.model_flops_per_step
    assert 0.8 < p.compiled_flops_per_step_per_chip * 2 / p.hardware_flops_per_step < 1.25
    for unmeasured in ("step_time_s", "tokens_per_s_per_chip", "mfu", "hfu",
                       "peak_memory_bytes_per_chip", "memory_source", "loss_first"):
        assert getattr(p, unmeasured) is None, unmeasured
    assert plan.hosts and plan.versions.get("jax")
    plan_starts = [e for e in events if isinstance(e, TrialStarted) and e.trial.kind == "plan"]
    assert len(plan_starts) == 1 and all(e.workers == () for e in plan_starts)
    assert_no_leaks()


@pytest.mark.timeout(400)
def test_a_plan_trial_beyond_the_cluster_holds_no_chips(local_ray):
    """16 chips, more than this Ray cluster has: planned all the same, on no chip."""
    sink, events = MemorySink(), []
    wide = SweepSpec(**{**tiny_spec(**SPEC).model_dump(), "name": "wide", "kinds": ["plan"],
                        "chips": [16], "seq_lens": [16 * 64]})
    run_sweep(wide, sink, on_event=events.append)
    far = sink.by_key()["plan/jax/p2p/chips=16/seq_len=1024/dtype=float32/param_sharding=replicated/"
                 "remat=none"]
    assert far.status == "succeeded", far.error
    assert "16 virtual chips" in far.metrics.estimated_memory_source
    # a plan compiles the reference step, and says so
    assert (far.metrics.gdn_kernel, far.metrics.attention_kernel) == (
        "reference jax chunk rule", None)
    (start,) = [e for e in events if isinstance(e, TrialStarted)]
    assert start.workers == ()
    assert_no_leaks()


MESH = "jax/p2p/chips=4/dp=2/seq_len=128/dtype=float32/param_sharding=zero1/remat=none"


@pytest.mark.timeout(120)
def test_a_plan_of_a_dp_x_cp_mesh_compiles_on_dp_times_cp_virtual_chips(local_ray):
    """dp 2 × cp 2: one process of 4 virtual chips compiles the (dp, cp) mesh's step; the
    weights' figures are a 4-chip layout's, the activations and exchanges a 2-chip replica's."""
    from gdn_core.memory.step import predict_step_memory

    sink = MemorySink()
    spec = tiny_spec(kinds=["plan"], frameworks=["jax"], modes=["p2p"], chips=[4], dp=[2],
                     seq_lens=[128], param_shardings=["zero1"])
    run_sweep(spec, sink)
    (result,) = sink.results
    assert result.trial.key == f"plan/{MESH}" and result.status == "succeeded", result.error
    m, trial = result.metrics, result.trial
    assert "compile for 4 virtual chips (dp 2 × cp 2)" in m.estimated_memory_source
    assert m.predicted_memory_bytes_per_chip == predict_step_memory(
        trial.to_model_config(), trial.to_train_config(), mode="p2p", chips=2, dp=2,
        framework="jax").total
    assert m.estimated_memory_bytes_per_chip > 0 and m.cp_comm_bytes_per_step_per_chip > 0
    assert m.grad_sync_bytes_per_step_per_chip > 0  # zero1 over all 4 chips
    assert m.step_time_s is None and m.peak_memory_bytes_per_chip is None
    assert_no_leaks()


@pytest.mark.slow  # a measured 2-chip JAX trial beside its plan
@pytest.mark.timeout(400)
def test_a_plan_of_a_pure_data_parallel_mesh_compiles_what_the_trial_runs(local_ray):
    """dp 2 on 2 chips (no CP): the plan's XLA estimate and bytes are the measured trial's."""
    sink = MemorySink()
    run_sweep(tiny_spec(**{**SPEC, "dp": [2]}), sink)
    point = "jax/none/chips=2/dp=2/seq_len=128/dtype=float32/param_sharding=replicated/remat=none"
    measured, plan = sink.by_key()[point], sink.by_key()[f"plan/{point}"]
    assert measured.status == plan.status == "succeeded", (measured.error, plan.error)
    m, p = measured.metrics, plan.metrics
    assert p.estimated_memory_bytes_per_chip == m.estimated_memory_bytes_per_chip > 0
    assert (p.cp_comm_bytes_per_step_per_chip, p.grad_sync_bytes_per_step_per_chip) == (
        m.cp_comm_bytes_per_step_per_chip, m.grad_sync_bytes_per_step_per_chip)
    assert p.predicted_memory_bytes_per_chip == m.predicted_memory_bytes_per_chip
    assert (p.model_flops_per_step, p.hardware_flops_per_step) == (
        m.model_flops_per_step, m.hardware_flops_per_step)
    assert_no_leaks()
