"""The metric list has one definition, workers.result.TrialMetrics: the results table's columns
and the API's TrialPublic follow it (names, nullability, type); and a trial row reads back as
the TrialSpec it was written from."""

from __future__ import annotations

import types
import typing

import pytest
from pydantic import TypeAdapter
from sqlalchemy import BigInteger, Float, Integer, String, Text

from service.db.models import (FACT_COLUMNS, METRIC_COLUMNS, PROFILE_COLUMNS, Result, Trial,
                               result_for, trial_row, trial_spec, utcnow)
from service.schemas.trials import TrialPublic
from workers.result import TrialMetrics, TrialProfile
from workers.grid import MAX_KEY_CHARS, expand_trials
from workers.sweep_spec import Documents
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP

COLUMN_TYPES = {float: (Float,), int: (Integer, BigInteger), str: (Text, String)}
"""The SQL types a metric's Python type may be stored as."""


def _optional(annotation) -> type:
    """`X | None` → X; anything else fails (every metric is optional: a trial that failed
    has none)."""
    args = typing.get_args(annotation)
    assert isinstance(annotation, types.UnionType) and type(None) in args and len(args) == 2, \
        annotation
    return next(a for a in args if a is not type(None))


def test_metric_columns_are_the_fields_of_trial_metrics():
    assert METRIC_COLUMNS == tuple(TrialMetrics.model_fields)


@pytest.mark.parametrize("name", list(TrialMetrics.model_fields))
def test_every_metric_is_a_nullable_results_column_of_its_type(name):
    column = Result.__table__.columns.get(name)
    assert column is not None, f"results has no column {name!r} (TrialMetrics has the field)"
    assert column.nullable, f"results.{name} must be nullable: a failed trial has no metrics"
    python_type = _optional(TrialMetrics.model_fields[name].annotation)
    assert isinstance(column.type, COLUMN_TYPES[python_type]), \
        f"results.{name} is {column.type!r}, TrialMetrics.{name} is {python_type.__name__}"


def test_results_has_no_metric_column_trial_metrics_lacks():
    other = {"trial_id", "status", "error", "attempts", "hosts", "versions", "environment_id",
             "started_at", "finished_at", *PROFILE_COLUMNS,
             *(c.key for c in Result.__table__.columns if c.key in Trial.__table__.columns)}
    extra = {c.key for c in Result.__table__.columns} - other - set(METRIC_COLUMNS)
    assert not extra, f"results columns that are no TrialMetrics field: {sorted(extra)}"


def test_profile_columns_are_the_fields_of_trial_profile():
    """A profile is no metric (one extra step, after the measured ones): its own columns."""
    assert PROFILE_COLUMNS == tuple(f"profile_{name}" for name in TrialProfile.model_fields)
    assert all(Result.__table__.columns[c].nullable for c in PROFILE_COLUMNS)


def test_trial_public_has_every_metric_after_the_trials_own_fields():
    fields = list(TrialPublic.model_fields)
    metrics = list(TrialMetrics.model_fields)
    assert fields[-len(metrics):] == metrics and fields[0] == "id"  # JSON and CSV column order
    for name in metrics:
        assert TrialPublic.model_fields[name].annotation == \
            TrialMetrics.model_fields[name].annotation


def test_a_trial_row_reads_back_as_the_trial_spec_it_was_written_from():
    spec = SweepSpec.model_validate({
        **TINY_SWEEP, "frameworks": ["jax"], "kinds": ["measure", "plan"],
        "chips": [1, 2, 3, 4], "dp": [1, 2], "layers": ["gdn_only", "hybrid"],
        "kernels": ["reference", "fused"], "documents": ["single", "uniform:8-24"],
        "repeats": 2})
    trials = expand_trials(spec)
    assert any(t.skip_reason for t in trials) and any(t.kind == "plan" for t in trials)
    assert {t.kernels for t in trials} == {"reference", "fused"}
    assert {t.documents for t in trials} == {"single", "uniform:8-24"}
    assert {(t.chips, t.dp) for t in trials} == {(1, 1), (2, 1), (2, 2), (3, 1), (4, 1), (4, 2)}
    rows = [trial_row(sweep_id=1, spec=t, status="pending", created_at=utcnow()) for t in trials]
    assert [trial_spec(row, repeats=2 if row.kind == "measure" else 1) for row in rows] == trials


def test_a_row_whose_columns_no_longer_make_its_key_is_refused():
    (trial,) = expand_trials(SweepSpec.model_validate(TINY_SWEEP))
    row = trial_row(sweep_id=1, spec=trial, status="pending", created_at=utcnow())
    row.key += "/remat=full"
    with pytest.raises(ValueError, match="its columns make the key"):
        trial_spec(row, repeats=1)


def test_a_trial_row_and_its_result_hold_dp_and_the_public_trial_the_global_batch():
    spec = SweepSpec.model_validate({**TINY_SWEEP, "modes": ["p2p"], "chips": [4], "dp": [2],
                                     "batch_size": 3})
    (trial,) = expand_trials(spec)
    row = trial_row(sweep_id=1, spec=trial, status="pending", created_at=utcnow())
    assert (row.chips, row.dp, row.batch_size) == (4, 2, 3)
    assert "/chips=4/dp=2/" in row.key
    row.id = 7
    assert result_for(row, status="succeeded").dp == 2
    public = TrialPublic.model_validate({
        **{c.key: getattr(row, c.key) for c in Trial.__table__.columns},
        "accelerator": row.accelerator_type, "global_batch_size": 99})
    assert (public.dp, public.batch_size, public.global_batch_size) == (2, 3, 6)
    fields = list(TrialPublic.model_fields)
    assert fields.index("dp") == fields.index("chips") + 1
    assert fields.index("global_batch_size") == fields.index("batch_size") + 1


def test_a_packed_trials_row_result_and_public_trial_hold_its_documents():
    spec = SweepSpec.model_validate({**TINY_SWEEP, "documents": ["uniform:8-24"]})
    (trial,) = expand_trials(spec)
    row = trial_row(sweep_id=1, spec=trial, status="pending", created_at=utcnow())
    assert row.documents == "uniform:8-24" and row.key.endswith("/documents=uniform:8-24")
    row.id = 7
    assert result_for(row, status="succeeded").documents == "uniform:8-24"
    public = TrialPublic.model_validate({
        **{c.key: getattr(row, c.key) for c in Trial.__table__.columns},
        "accelerator": row.accelerator_type})
    assert public.documents == "uniform:8-24"


def test_the_key_and_documents_columns_hold_what_the_workers_allow():
    """workers.grid refuses a key longer than the column; the spec a documents value longer."""
    assert Trial.__table__.c.key.type.length == MAX_KEY_CHARS
    assert Trial.__table__.c.baseline_key.type.length == MAX_KEY_CHARS
    documents_bound = TypeAdapter(Documents).json_schema()["maxLength"]
    assert Trial.__table__.c.documents.type.length == documents_bound
    assert Result.__table__.c.documents.type.length == documents_bound


def test_a_result_copies_its_trials_grid_columns_as_they_are_defined():
    """One definition (models.GridPoint) makes both tables' grid columns: same type, width,
    nullability and server default, so a copied value always fits."""
    for name in FACT_COLUMNS:
        trial, result = Trial.__table__.c[name], Result.__table__.c[name]
        assert (repr(trial.type), trial.nullable) == (repr(result.type), result.nullable), name
        if name != "sweep_id":  # the trial's is a foreign key, the result's a plain copy
            assert str(getattr(trial.server_default, "arg", None)) == \
                str(getattr(result.server_default, "arg", None)), name
