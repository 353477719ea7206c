"""The trial grid's CP settings (workers.grid): what gdn_core runs for each trial, decided in
one function, trial_cp_settings."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gdn_core.cp_modes import CPSettings
from workers.grid import ONE_CHIP_ATTN_CP, ONE_CHIP_CP_MODE, expand_trials, trial_cp_settings
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
        assert trial.attn_cp == (None if trial.layers == "gdn_only" or trial.chips == 1
                                 else cp.attn_cp)
    for layers in MIXED.layers:
        points = {(t.mode, t.attn_cp, t.layout, t.chips) for t in trials
                  if t.layers == layers and t.chips > 1}
        assert len({trial_cp_settings(mode=m, attn_cp=a, layout=lay, chips=d)
                    for m, a, lay, d in points}) == len(points) > 1
    assert trial_cp_settings(mode="none", attn_cp=None, layout="contiguous", chips=1) == \
        CPSettings(mode=ONE_CHIP_CP_MODE, chips=1, attn_cp=ONE_CHIP_ATTN_CP)


def test_the_trial_names_become_gdn_cores_in_one_function():
    """ONE_CHIP_CP_MODE / ONE_CHIP_ATTN_CP (the "none" → p2p and None → all_gather_kv renames)
    are read nowhere in workers/ but in grid.trial_cp_settings, and no module there names
    gdn_core's one-chip modes itself."""
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
    assert readers and set(readers) == {("grid.py", ("trial_cp_settings",))}
    # the two definitions in grid.py, and all_gather_kv as SweepSpec.attn_cps' default
    assert [name for name, _ in literals] == ["grid.py", "grid.py", "sweep_spec.py"]
