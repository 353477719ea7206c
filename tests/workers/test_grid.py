"""The trial grid's CP settings (workers.grid): what gdn_core runs for each trial, decided in
one function, gdn_core.cp_modes.cp_settings_for_trial; and the kernels dimension's keys,
expansion and checks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from gdn_core.cp_modes import (ONE_CHIP_ATTN_CP, ONE_CHIP_CP_MODE, CPSettings,
                               cp_settings_for_trial, trial_mode)
from workers.grid import TrialSpec, expand_trials
from workers.sweep_spec import SweepSpec

WORKERS = Path(__file__).parents[2] / "workers"
MIXED = SweepSpec(name="mixed", frameworks=["torch"], modes=["p2p", "ulysses", "all_gather"],
                  layers=["gdn_only", "hybrid"], attn_cps=["ring", "ulysses"],
                  layouts=["contiguous", "zigzag"], chips=[1, 2, 4], seq_lens=[256])


@pytest.mark.parametrize("layers", ["gdn_only", "hybrid"])
def test_the_one_chip_baseline_runs_as_p2p_with_all_gather_kv(layers):
    spec = MIXED.model_copy(update={"layers": [layers]})
    (baseline,) = [t for t in expand_trials(spec) if t.chips == 1]
    assert (baseline.mode, baseline.attn_cp, baseline.layout) == ("none", None, "contiguous")
    assert baseline.cp_settings() == CPSettings(mode="p2p", chips=1, attn_cp="all_gather_kv",
                                                layout="contiguous")


def test_cp_settings_round_trip_to_the_trial_names():
    """Only the trial-level names change: mode "none" ↔ ONE_CHIP_CP_MODE and attn_cp None ↔
    ONE_CHIP_ATTN_CP; every other value reaches gdn_core as the trial has it, and distinct
    multi-chip points stay distinct."""
    trials = expand_trials(MIXED)
    for trial in trials:
        cp = trial.cp_settings()
        assert cp.chips == trial.chips and cp.layout == trial.layout
        assert trial.mode == ("none" if trial.chips == 1 else cp.mode)
        assert trial.mode == trial_mode(cp.mode, cp_chips=cp.cp_chips)  # the inverse
        assert trial.attn_cp == (None if trial.layers == "gdn_only" or trial.chips == 1
                                 else cp.attn_cp)
    for layers in MIXED.layers:
        points = {(t.mode, t.attn_cp, t.layout, t.chips) for t in trials
                  if t.layers == layers and t.chips > 1}
        assert len({cp_settings_for_trial(mode=m, attn_cp=a, layout=lay, chips=d)
                    for m, a, lay, d in points}) == len(points) > 1
    assert cp_settings_for_trial(mode="none", attn_cp=None, layout="contiguous", chips=1) == \
        CPSettings(mode=ONE_CHIP_CP_MODE, chips=1, attn_cp=ONE_CHIP_ATTN_CP) == \
        CPSettings.one_chip()


def test_the_trial_names_become_gdn_cores_in_one_function():
    """ONE_CHIP_CP_MODE / ONE_CHIP_ATTN_CP (the "none" → p2p and None → all_gather_kv renames)
    are read nowhere in workers/ (gdn_core.cp_modes.cp_settings_for_trial and trial_mode
    translate both ways), and no module there names gdn_core's one-chip modes itself."""
    readers, literals = [], []
    for path in sorted(WORKERS.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in ("ONE_CHIP_CP_MODE", "ONE_CHIP_ATTN_CP") \
                    and isinstance(node.ctx, ast.Load):
                inside = [f.name for f in functions
                          if f.lineno <= node.lineno <= f.end_lineno]
                readers.append((path.name, tuple(inside)))
            if isinstance(node, ast.Constant) and node.value in ("p2p", "all_gather_kv"):
                literals.append((path.name, node.lineno))
    assert readers == []
    # all_gather_kv as SweepSpec.attn_cps' default (the one-chip names are gdn_core.cp_modes')
    assert [name for name, _ in literals] == ["sweep_spec.py"]


def test_no_module_rederives_the_one_chip_trial_mode():
    """The trial mode "none" ↔ gdn_core's one-chip mode is translated by cp_modes alone
    (cp_settings_for_trial, gdn_mode, trial_mode): no module compares a mode with "none" or
    picks "none" by a chip count itself (issue 38: it was re-derived in four places)."""
    root = WORKERS.parent
    copies = []
    for package in ("gdn_core", "workers", "service"):
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Compare):
                    sides = [node.left, *node.comparators]
                    if any(isinstance(x, ast.Constant) and x.value == "none" for x in sides) \
                            and any("mode" in ast.unparse(x) for x in sides):
                        copies.append(f"{path.relative_to(root)}:{node.lineno}")
                if isinstance(node, ast.IfExp) and any(
                        isinstance(x, ast.Constant) and x.value == "none"
                        for x in (node.body, node.orelse)) and "chips" in ast.unparse(node.test):
                    copies.append(f"{path.relative_to(root)}:{node.lineno}")
    assert copies == []


# ---------------------------------------------------------------- kernels (issue 23)

DEFAULT_KEYS = [
    "torch/none/chips=1/seq_len=64/dtype=float32/param_sharding=replicated/remat=none",
    "torch/p2p/chips=2/seq_len=64/dtype=float32/param_sharding=replicated/remat=none"]


def _spec(**changes) -> SweepSpec:
    return SweepSpec.model_validate(dict(name="k", frameworks=["torch"], modes=["p2p"],
                                         chips=[1, 2], seq_lens=[64]) | changes)


@pytest.mark.parametrize("kernels", [None, ["reference"], "reference"],
                         ids=["absent", "list", "one-value"])
def test_a_reference_trials_key_is_unchanged(kernels):
    """Sweeps stored before `kernels` existed (and reference sweeps now) keep their keys, so a
    resume finds every stored trial."""
    spec = _spec() if kernels is None else _spec(kernels=kernels)
    trials = expand_trials(spec)
    assert [t.key for t in trials] == DEFAULT_KEYS
    assert {t.kernels for t in trials} == {"reference"} and spec.kernels == ["reference"]
    assert trials[1].cp_settings().kernels == "reference"


def test_fused_points_are_a_dimension_with_their_own_baseline():
    spec = _spec(kernels=["reference", "fused", "fused"], frameworks=["torch", "jax"])
    trials = expand_trials(spec)
    assert spec.kernels == ["reference", "fused"]
    assert len(trials) == spec.grid_size == 2 * 2 * 2  # frameworks × kernels × (baseline + p2p)
    assert len({t.key for t in trials}) == len(trials)
    fused = [t for t in trials if t.kernels == "fused"]
    assert {t.key.removesuffix("/kernels=fused") for t in fused if t.framework == "torch"} \
        == set(DEFAULT_KEYS)
    (two,) = [t for t in fused if t.framework == "torch" and t.chips == 2]
    assert two.baseline_key == DEFAULT_KEYS[0] + "/kernels=fused"
    assert two.cp_settings() == CPSettings(mode="p2p", chips=2, kernels="fused")
    assert cp_settings_for_trial(mode="none", attn_cp=None, layout="contiguous", chips=1,
                                 kernels="fused").kernels == "fused"
    assert all(t.skip_reason is None for t in trials)  # resolved on the worker, not here


def test_kernels_values_are_validated_naming_the_bad_one():
    with pytest.raises(ValidationError) as err:
        _spec(kernels=["fused", "bogus"])
    (error,) = err.value.errors()
    assert error["loc"] == ("kernels", 1) and error["input"] == "bogus"
    assert "'reference' or 'fused'" in error["msg"]
    with pytest.raises(ValidationError, match="at least 1 item"):
        _spec(kernels=[])
    assert _spec(kernel="fused").kernels == ["fused"]  # the singular, as other dimensions


def test_plans_compile_the_reference_step_only():
    spec = _spec(frameworks=["jax"], kinds=["measure", "plan"], kernels=["reference", "fused"])
    trials = expand_trials(spec)
    assert len(trials) == spec.grid_size == 4 + 2
    assert {t.kernels for t in trials if t.kind == "plan"} == {"reference"}
    with pytest.raises(ValidationError, match=r"a plan compiles the reference step.*add "
                                              r"'reference' to kernels"):
        _spec(frameworks=["jax"], kinds=["plan"], kernels=["fused"])
    with pytest.raises(ValidationError, match="kind='plan' compiles the reference JAX step"):
        TrialSpec.model_validate(trials[-1].model_dump() | {"kernels": "fused"})
