"""Migration 0015 (packed documents): old rows read back as the single-document runs they were,
their keys still resume, the views keep packed trials apart from unpacked ones; a downgrade
refuses to drop trials on packed documents. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import select

from service.db import crud
from service.db.engine import alembic_config, current_revision, head_revision, make_engine, \
    make_session_factory
from service.db.models import Sweep, Trial
from service.schemas.trials import TrialPublic
from workers.grid import expand_trials
from workers.sweep_spec import SweepSpec

from .test_migration_0008 import _columns, _sql
from .test_migration_0010 import _insert_0009_sweep
from .test_migrations import OLD_SPEC, empty_url  # noqa: F401 - the fixture, both databases

PACKED = "uniform:16-64"


@pytest.mark.timeout(120)
def test_0015_old_rows_are_single_document_and_downgrade_guards_packed_ones(empty_url):  # noqa: F811
    config = alembic_config(empty_url)
    command.upgrade(config, "0014_profiles")
    _insert_0009_sweep(empty_url)  # no dp, no documents: as older code stored it
    assert "documents" not in _columns(empty_url, "trials") | _columns(empty_url, "results")

    command.upgrade(config, "head")
    assert {tuple(r) for r in _sql(empty_url, "SELECT documents FROM trials")} == {("single",)}
    assert [tuple(r) for r in _sql(empty_url, "SELECT documents FROM results")] == [("single",)]
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        stored_spec = crud.stored_spec(session.get(Sweep, 1000).spec)
        keys = set(session.scalars(select(Trial.key)))
        public = TrialPublic.from_row(crud.get_trial(session=session, trial_id=1001))
        runnable = crud.sweep_trials(session=session, sweep_id=1000)
    engine.dispose()
    # the stored spec still expands to the stored keys: a resume finds every trial
    assert stored_spec.documents == ["single"]
    assert {t.key for t in expand_trials(stored_spec)} == keys == {t.key for t in runnable}
    assert not any("/documents=" in key for key in keys)
    assert public.documents == "single" and {t.documents for t in runnable} == {"single"}
    best = _sql(empty_url, "SELECT mode, chips, documents FROM best_tokens_per_s_per_chip")
    assert [tuple(r) for r in best] == [("p2p", 2, "single")]

    # a packed sweep: its rows say so, and the views keep it apart from the unpacked one
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        packed = crud.create_sweep(session=session, sweep_create=SweepSpec.model_validate(
            {**OLD_SPEC, "name": "packed", "modes": ["p2p"], "documents": [PACKED]})).id
    engine.dispose()
    trials = _sql(empty_url, "SELECT id, mode, chips, documents, key FROM trials WHERE "
                  "sweep_id = :s ORDER BY chips", s=packed)
    assert [tuple(r)[1:4] for r in trials] == [("none", 1, PACKED), ("p2p", 2, PACKED)]
    assert all(r[4].endswith(f"/documents={PACKED}") for r in trials)
    _sql(empty_url, "INSERT INTO results (trial_id, sweep_id, kind, framework, mode, chips, "
         "seq_len, batch_size, preset, num_layers, dtype, param_sharding, remat, documents, "
         "accelerator_kind, accelerator_type, repeat, status, attempts, hosts, versions, "
         "tokens_per_s_per_chip) VALUES (:t, :s, 'measure', 'jax', 'p2p', 2, 256, 1, 'tiny', "
         "2, 'float32', 'replicated', 'none', :d, 'cpu', 'cpu', 0, 'succeeded', 1, '[]', "
         "'{}', 90.0)", t=trials[1][0], s=packed, d=PACKED)
    best = _sql(empty_url, "SELECT documents, tokens_per_s_per_chip FROM "
                "best_tokens_per_s_per_chip ORDER BY documents")
    assert [tuple(r) for r in best] == [("single", 50.0), (PACKED, 90.0)]  # not one winner
    fit = _sql(empty_url, "SELECT documents, max_seq_len_succeeded FROM max_seq_len_fit "
               "ORDER BY documents")
    assert [tuple(r) for r in fit] == [("single", 256), (PACKED, 256)]

    head_view = _columns(empty_url, "best_tokens_per_s_per_chip")
    # down to 0015 first: SQLite commits each revision's downgrade as it goes
    command.downgrade(config, "0015_documents")
    with pytest.raises(RuntimeError, match=r"packed documents \(documents other than "
                                           r"'single'\), which 0014 cannot express"):
        command.downgrade(config, "0014_profiles")
    assert current_revision(empty_url) == "0015_documents"
    _sql(empty_url, "DELETE FROM trials WHERE sweep_id = :s", s=packed)
    command.downgrade(config, "0014_profiles")
    assert "documents" not in _columns(empty_url, "results") | _columns(empty_url, "trials")
    assert _columns(empty_url, "best_tokens_per_s_per_chip") == head_view - {"documents"}
    assert "dp" in _columns(empty_url, "max_seq_len_fit")  # 0010's views back
    # the views name their columns: they pin none of 0014's, whose downgrade drops them
    command.downgrade(config, "0013_regression_alerts")
    command.upgrade(config, "head")
    assert current_revision(empty_url) == head_revision()
