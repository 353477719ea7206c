"""The documents sweep dimension (issue 24 item 2): SweepSpec.documents crosses the grid like
any step setting (the one-chip baseline and plans included), keys name `/documents=…` only
when packed, each trial's TrainConfig carries it, and bad values are refused naming them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gdn_core.packing import DOCUMENTS_HELP
from workers.grid import MAX_KEY_CHARS, TrialSpec, expand_trials, trial_key
from workers.plan_runner import plan_request
from workers.sweep_spec import SweepSpec

SINGLE_KEYS = [
    "torch/none/chips=1/seq_len=64/dtype=float32/param_sharding=replicated/remat=none",
    "torch/p2p/chips=2/seq_len=64/dtype=float32/param_sharding=replicated/remat=none"]
PACKED = "uniform:8-24"


def _spec(**changes) -> SweepSpec:
    return SweepSpec.model_validate(dict(name="docs", frameworks=["torch"], modes=["p2p"],
                                         chips=[1, 2], seq_lens=[64]) | changes)


@pytest.mark.parametrize("documents", [None, ["single"], "single"],
                         ids=["absent", "list", "one-value"])
def test_a_single_document_trials_key_is_unchanged(documents):
    """Sweeps stored before `documents` existed (and single-document sweeps now) keep their
    keys, so a resume finds every stored trial."""
    spec = _spec() if documents is None else _spec(documents=documents)
    trials = expand_trials(spec)
    assert [t.key for t in trials] == SINGLE_KEYS and spec.documents == ["single"]
    assert {t.to_train_config().documents for t in trials} == {"single"}


def test_packed_points_are_a_dimension_with_their_own_baseline():
    spec = _spec(documents=["single", PACKED, PACKED], kernels=["reference", "fused"])
    trials = expand_trials(spec)
    assert spec.documents == ["single", PACKED]
    assert len(trials) == spec.grid_size == 2 * 2 * 2  # kernels × documents × (baseline + p2p)
    assert len({t.key for t in trials}) == len(trials)
    packed = [t for t in trials if t.documents == PACKED and t.kernels == "reference"]
    assert [t.key for t in packed] == [key + f"/documents={PACKED}" for key in SINGLE_KEYS]
    assert packed[1].baseline_key == packed[0].key  # speed-up against the packed one chip
    assert packed[1].to_train_config().documents == PACKED
    (fused,) = [t for t in trials if t.documents == PACKED and t.kernels == "fused"
                and t.chips == 2]
    assert fused.key.endswith(f"/kernels=fused/documents={PACKED}")  # then /repeat=r
    assert trial_key(framework="torch", mode="p2p", chips=2, seq_len=64, dtype="float32",
                     param_sharding="replicated", remat="none", documents=PACKED,
                     repeat=1).endswith(f"/documents={PACKED}/repeat=1")


@pytest.mark.parametrize("bad", ["uniform:24-8", "uniform:0-8", "zipf", "uniform:8", ""])
def test_a_bad_documents_value_is_refused_naming_it_and_what_is_accepted(bad):
    with pytest.raises(ValidationError) as err:
        _spec(documents=["single", bad])
    (error,) = err.value.errors()
    assert error["loc"] == ("documents", 1) and error["input"] == bad
    assert repr(bad) in error["msg"]
    assert DOCUMENTS_HELP in error["msg"] or "1 <= LO <= HI" in error["msg"]
    with pytest.raises(ValidationError, match="at least 1 item"):
        _spec(documents=[])
    with pytest.raises(ValidationError, match="at most 40 characters"):
        _spec(documents=["uniform:" + "1" * 20 + "-" + "2" * 20])


def test_a_key_too_long_for_its_column_is_refused_naming_its_length():
    """Every other dimension at its longest fits 181 characters; a long documents value on top
    could exceed the stored key's width, so the point is refused, never cut."""
    longest = dict(name="long", frameworks=["torch"], modes=["all_gather"], chips=[16384],
                   dp=[8192], seq_lens=[2 ** 30], dtypes=["bfloat16"], layers=["hybrid"],
                   attn_cps=["all_gather_kv"], layouts=["zigzag"], kernels=["fused"],
                   repeats=20, admit_over_memory=True)
    (trial, *_) = [t for t in expand_trials(SweepSpec.model_validate(longest))
                   if t.repeat == 19]
    assert len(trial.key) == 181 < MAX_KEY_CHARS
    long_documents = "uniform:1000000000-1000000000"
    with pytest.raises(ValidationError, match=r"has 221 characters, over the 200 a stored key "
                                              r"holds; use a shorter documents value"):
        TrialSpec.model_validate(trial.model_dump() | {"documents": long_documents})
    with pytest.raises(ValueError, match="over the 200 a stored key holds"):
        expand_trials(SweepSpec.model_validate(longest | {"documents": [long_documents]}))


def test_plans_compile_the_packed_step_too():
    spec = _spec(frameworks=["jax"], kinds=["measure", "plan"], documents=["single", PACKED])
    trials = expand_trials(spec)
    assert len(trials) == spec.grid_size == 2 * (2 + 2)  # documents × (measure 2 + plan 2)
    plans = [t for t in trials if t.kind == "plan" and t.chips == 2]
    assert [t.documents for t in plans] == ["single", PACKED]
    assert all(t.skip_reason is None for t in plans)
    assert [plan_request(t)["documents"] for t in plans] == ["single", PACKED]
    assert plans[1].key == f"plan/jax/p2p/chips=2/seq_len=64/dtype=float32/param_sharding=" \
                          f"replicated/remat=none/documents={PACKED}"
