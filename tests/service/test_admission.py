"""Admission answers from the spec alone what expanding its trials would say: the longest key
of the grid, a key too long for its column, and the grid's size broken down by the factors
SweepSpec.grid_size_of multiplies (issue 38: no expansion run only to be thrown away)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.runs.admission import (grid_cap_error, key_problem, longest_trial_key,
                                    model_problem, spec_errors)
from workers.grid import MAX_KEY_CHARS, expand_trials
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP

WIDE = dict(frameworks=["jax", "torch"], kinds=["measure", "plan"],
            modes=["p2p", "all_gather", "ulysses"], chips=[1, 2, 4, 8], dp=[1, 2],
            seq_lens=[64, 1024], layers=["gdn_only", "hybrid"], attn_cps=["ring", "all_gather_kv"],
            layouts=["contiguous", "zigzag"], kernels=["reference", "fused"],
            documents=["single", "uniform:8-24"], repeats=3, admit_over_memory=True)
LONGEST = dict(frameworks=["torch"], modes=["all_gather"], chips=[16384], dp=[8192],
               seq_lens=[2 ** 30], dtypes=["bfloat16"], layers=["hybrid"],
               attn_cps=["all_gather_kv"], layouts=["zigzag"], kernels=["fused"], repeats=20,
               admit_over_memory=True)
"""tests/workers/test_grid_documents.py's: every dimension at its longest, 181 characters."""


@pytest.mark.parametrize("fields", [
    WIDE, LONGEST, dict(frameworks=["torch"], modes=["p2p"], chips=[1], seq_lens=[64]),
    dict(frameworks=["jax"], modes=["log_scan"], chips=[2, 3], seq_lens=[96],
         one_chip_baseline=False, admit_over_memory=True),
    dict(frameworks=["jax"], modes=["p2p"], chips=[1, 2], seq_lens=[64],
         one_chip_baseline=False),
], ids=["wide", "longest", "one-chip", "no-baseline", "one-chip-per-mode"])
def test_the_longest_key_is_the_longest_the_expansion_makes(fields):
    spec = SweepSpec.model_validate({**TINY_SWEEP, **fields})
    trials = expand_trials(spec)
    assert len(trials) == spec.grid_size
    assert longest_trial_key(spec) in {t.key for t in trials}
    assert len(longest_trial_key(spec)) == max(len(t.key) for t in trials)
    assert key_problem(spec) is None and model_problem(spec) is None
    assert spec_errors(spec, spec.grid_size) == []


def test_a_key_over_its_column_is_refused_as_the_expansion_refuses_it():
    spec = SweepSpec.model_validate({**TINY_SWEEP, **LONGEST,
                                     "documents": ["uniform:1000000000-1000000000"]})
    with pytest.raises(ValidationError, match="characters, over the 200 a stored key holds"):
        expand_trials(spec)  # at its first key too long; admission names the longest
    problem = key_problem(spec)
    assert problem is not None and "repeat=19' has 221 characters" in problem
    assert f"over the {MAX_KEY_CHARS} a stored key holds" in problem
    (error,) = spec_errors(spec, spec.grid_size)
    assert error["loc"] == ["body", "spec", "documents"] and error["msg"] == problem


def test_the_grid_cap_message_multiplies_out_to_the_grid_size():
    spec = SweepSpec.model_validate({**TINY_SWEEP, **WIDE})
    message = grid_cap_error(spec, spec.grid_size - 1)["msg"]
    assert message.startswith(f"the grid has {spec.grid_size} trials (measure: repeats 3 × "
                              "frameworks 2 × kernels 2 × seq_lens 2 × ")
    assert ("gdn_only: modes 3 × layouts 2 × meshes (chips × dp) 5 + the one-chip baseline + "
            "1 pure data-parallel mesh(es)") in message
    assert "hybrid: modes 3 × attn_cps 2 × layouts 2 × meshes (chips × dp) 5" in message
    assert grid_cap_error(spec, spec.grid_size) is None
