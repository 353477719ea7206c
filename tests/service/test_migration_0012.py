"""Migration 0012 (environments): old results read back with no environment, new ones store
theirs once, the results triggers of 0005 still fire after the column is added, and a
downgrade removes the table and the column and keeps every result. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect

from service.db import crud
from service.db.engine import alembic_config, current_revision, head_revision, make_engine, \
    make_session_factory
from service.db.models import Trial
from service.runs.db_sink import record_result
from service.schemas.trials import TrialPublic
from workers.result import TrialMetrics, TrialResult

from .test_migration_0008 import _columns, _sql
from .test_migration_0010 import _insert_0009_sweep
from .test_migrations import empty_url  # noqa: F401 - the fixture, both databases


def _results_version(url: str) -> int:
    return _sql(url, "SELECT version FROM cache_versions WHERE name = 'results'")[0][0]


@pytest.mark.timeout(120)
def test_0012_old_results_have_no_environment_and_downgrade_keeps_them(empty_url):  # noqa: F811
    config = alembic_config(empty_url)
    command.upgrade(config, "0010_data_parallel")
    _insert_0009_sweep(empty_url)  # a sweep and one succeeded result, as 0010 holds them

    command.upgrade(config, "0012_environments")
    assert [tuple(r) for r in _sql(empty_url, "SELECT environment_id FROM results")] == [(None,)]
    command.upgrade(config, "head")  # the models below are head's
    engine = make_engine(empty_url)
    session_factory = make_session_factory(engine)
    with session_factory() as session:
        old = crud.get_trial(session=session, trial_id=1001)
        assert TrialPublic.from_row(old).environment_id is None
        pending = crud.sweep_trials(session=session, sweep_id=1000)
        spec = next(t for t in pending if session.get(Trial, 1000).key == t.key)
    version = _results_version(empty_url)
    body = {"packages": {"torch": "2.13.0"}, "source": {"kind": "cli"}}
    assert record_result(session_factory=session_factory, sweep_id=1000, result=TrialResult(
        trial=spec, status="succeeded", attempts=1, environment=body,
        metrics=TrialMetrics(tokens_per_s_per_chip=10.0)))
    with session_factory() as session:
        stored = TrialPublic.from_row(crud.get_trial(session=session, trial_id=1000))
    engine.dispose()
    assert stored.environment_id is not None
    assert _results_version(empty_url) == version + 1  # 0005's trigger survived the ALTER
    assert [tuple(r) for r in _sql(empty_url, "SELECT id FROM environments")] == [
        (stored.environment_id,)]

    command.downgrade(config, "0010_data_parallel")
    assert "environment_id" not in _columns(empty_url, "results")
    engine = make_engine(empty_url)
    assert "environments" not in inspect(engine).get_table_names()
    engine.dispose()
    assert sorted(tuple(r) for r in _sql(empty_url, "SELECT trial_id, tokens_per_s_per_chip "
                                                    "FROM results")) == [(1000, 10.0), (1001, 50.0)]
    command.upgrade(config, "head")
    assert current_revision(empty_url) == head_revision()
