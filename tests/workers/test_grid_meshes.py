"""Data parallel × context parallel meshes in the grid (issue 24 item 1): SweepSpec.dp splits
each chip count into dp replicas of chips / dp CP chips; keys, expansion, the runs-once rule
for meshes without CP, shape checks on the CP chips, memory over the whole mesh."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gdn_core.cp_modes import CPSettings
from gdn_core.memory.step import predict_step_memory
from gdn_core.presets import get_preset
from gdn_core.train_config import TrainConfig
from workers.grid import TrialSpec, expand_trials
from workers.plan_runner import plan_request
from workers.sweep_spec import SweepSpec

KEY_TAIL = "/seq_len=64/dtype=float32/param_sharding=replicated/remat=none"


def _spec(**changes) -> SweepSpec:
    return SweepSpec.model_validate(dict(name="mesh", frameworks=["torch"], modes=["p2p"],
                                         chips=[1, 2, 4], seq_lens=[64]) | changes)


def test_dp_1_keeps_every_key_and_trial_of_a_sweep_stored_before_it():
    assert [t.key for t in expand_trials(_spec())] == \
        [t.key for t in expand_trials(_spec(dp=[1]))]
    assert {t.dp for t in expand_trials(_spec())} == {1}


def test_each_chip_count_splits_into_the_dp_values_dividing_it():
    spec = _spec(dp=[1, 2, 4], modes=["p2p", "all_gather"])
    assert spec.meshes == [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)]
    trials = expand_trials(spec)
    assert len(trials) == spec.grid_size == len({t.key for t in trials})
    by_key = {t.key: t for t in trials}
    # One chip per replica has no CP: the baseline and pure data parallel run once, as "none".
    assert [k for k, t in by_key.items() if t.mode == "none"] == [
        f"torch/none/chips=1{KEY_TAIL}", f"torch/none/chips=2/dp=2{KEY_TAIL}",
        f"torch/none/chips=4/dp=4{KEY_TAIL}"]
    mesh = by_key[f"torch/all_gather/chips=4/dp=2{KEY_TAIL}"]
    assert (mesh.chips, mesh.dp, mesh.global_batch_size) == (4, 2, 2)
    assert mesh.cp_settings() == CPSettings(mode="all_gather", chips=4, dp=2)
    assert mesh.cp_settings().cp_chips == 2
    assert mesh.baseline_key == f"torch/none/chips=1{KEY_TAIL}"
    pure = by_key[f"torch/none/chips=4/dp=4{KEY_TAIL}"]
    assert pure.cp_settings() == CPSettings(mode="p2p", chips=4, dp=4)


def test_shape_rules_apply_to_a_replicas_cp_chips():
    """ulysses needs value heads divisible by the CP chips, not by all chips: the tiny preset
    has 4 value heads, so 8 chips as dp 2 × cp 4 serve ulysses while cp 8 cannot."""
    spec = _spec(modes=["ulysses"], chips=[8], dp=[1, 2], model={"preset": "tiny"})
    reasons = {t.dp: t.skip_reason for t in expand_trials(spec)}
    assert get_preset("tiny").gdn.num_v_heads == 4
    assert "chips=8" in reasons[1] and reasons[2] is None


def test_a_dp_value_dividing_no_chip_count_is_refused_naming_it():
    with pytest.raises(ValidationError, match=r"dp=\[3\] divides none of chips=\[1, 2, 4\]"):
        _spec(dp=[1, 3])
    with pytest.raises(ValidationError, match=r"dp has values outside 1…"):
        _spec(dp=[0])
    with pytest.raises(ValidationError, match="mode='none'.*chips = dp"):
        TrialSpec.model_validate(expand_trials(_spec())[0].model_dump() | {"chips": 2})
    with pytest.raises(ValidationError, match="dp=3 does not divide chips=4"):
        TrialSpec.model_validate(expand_trials(_spec())[-1].model_dump() | {"dp": 3})


def test_plans_of_a_dp_mesh_are_planned():
    trials = expand_trials(_spec(frameworks=["jax"], kinds=["plan"], dp=[1, 2], chips=[4]))
    assert {t.dp: t.skip_reason for t in trials} == {1: None, 2: None}
    plan = next(t for t in trials if t.dp == 2)
    assert plan.key.startswith("plan/jax/") and "/chips=4/dp=2/" in plan.key
    assert plan_request(plan)["chips"] == 4 and plan_request(plan)["dp"] == 2


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("sharding", ["replicated", "zero1", "fsdp"])
def test_memory_of_a_mesh_is_a_replicas_activations_beside_weights_over_all_chips(
        framework, sharding):
    """dp 2 × cp 2 holds what cp 2 holds of activations and exchanges, and the weights,
    gradients and optimizer state of a 4-chip layout."""
    model = get_preset("tiny", num_layers=2, vocab_size=512)
    train = TrainConfig(seq_len=256, param_sharding=sharding)
    mesh = predict_step_memory(model, train, mode="p2p", chips=2, dp=2, framework=framework)
    cp2 = predict_step_memory(model, train, mode="p2p", chips=2, framework=framework)
    cp4 = predict_step_memory(model, train, mode="p2p", chips=4, framework=framework)
    assert (mesh.activations, mesh.exchange_buffers) == (cp2.activations, cp2.exchange_buffers)
    assert (mesh.weights, mesh.grads, mesh.optimizer_state) == (
        cp4.weights, cp4.grads, cp4.optimizer_state)
    if sharding != "replicated":
        assert mesh.optimizer_state < cp2.optimizer_state
    # Pure data parallel still shards: 2 replicas of one chip are a 2-chip layout.
    pure = predict_step_memory(model, train, mode="p2p", chips=1, dp=2, framework=framework)
    one = predict_step_memory(model, train, mode="p2p", chips=1, framework=framework)
    assert (pure.optimizer_state < one.optimizer_state) == (sharding != "replicated")


def test_without_a_one_chip_mesh_no_trial_names_a_baseline():
    """dp [2] with chips [1, 2, 4]: 2 divides no 1, so there is no one-chip trial to refer to."""
    spec = _spec(dp=[2])
    trials = expand_trials(spec)
    assert (1, 1) not in spec.meshes and not spec.has_baseline
    assert {t.chips for t in trials} == {2, 4} and len(trials) == spec.grid_size
    assert all(t.baseline_key is None for t in trials)
