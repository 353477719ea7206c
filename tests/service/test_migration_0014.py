"""Migration 0014 (profiles): old results read back unprofiled, their sweeps' stored specs
(no `profile`) expand to the stored keys and run unprofiled; a profiled result written at head
keeps its trace reference; a downgrade drops the columns and an upgrade brings them back. On
SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from alembic import command

from service.db import crud
from service.db.engine import alembic_config, current_revision, head_revision, make_engine, \
    make_session_factory
from service.db.models import PROFILE_COLUMNS
from service.schemas.trials import TrialPublic
from workers.grid import expand_trials

from .profile_seed import seed_profiled_sweep
from .test_migration_0008 import _columns, _sql
from .test_migration_0010 import _insert_0009_sweep
from .test_migrations import empty_url  # noqa: F401 - the fixture, both databases


@pytest.mark.timeout(120)
def test_0014_old_results_are_unprofiled_and_the_columns_go_down_and_up(empty_url, tmp_path):  # noqa: F811
    config = alembic_config(empty_url)
    command.upgrade(config, "0013_regression_alerts")
    _insert_0009_sweep(empty_url)  # no dp, no profile: as older code stored it
    assert not set(PROFILE_COLUMNS) & _columns(empty_url, "results")

    command.upgrade(config, "head")
    assert set(PROFILE_COLUMNS) <= _columns(empty_url, "results")
    assert [tuple(r) for r in _sql(empty_url, "SELECT profile_format, profile_path, "
                                   "profile_bytes, profile_summary, profile_error FROM "
                                   "results")] == [(None,) * 5]
    engine = make_engine(empty_url)
    sessions = make_session_factory(engine)
    with sessions() as session:
        old = TrialPublic.from_row(crud.get_trial(session=session, trial_id=1001))
        stored = crud.stored_spec(crud.get_sweep(session=session, sweep_id=1000).spec)
        runnable = crud.sweep_trials(session=session, sweep_id=1000)
    assert old.profile is None and old.tokens_per_s_per_chip == 50.0
    assert stored.profile is False
    assert {t.key for t in expand_trials(stored)} == {t.key for t in runnable}
    assert not any(t.profile for t in runnable)

    ids = seed_profiled_sweep(sessions, tmp_path / "artifacts")  # written at head
    with sessions() as session:
        profiled = crud.get_trial(session=session, trial_id=ids["profiled"])
        assert TrialPublic.from_row(profiled).profile.url
    engine.dispose()
    # down to 0013: the references go (the files stay where they are), the rows stay
    command.downgrade(config, "0013_regression_alerts")
    assert not set(PROFILE_COLUMNS) & _columns(empty_url, "results")
    assert _sql(empty_url, "SELECT COUNT(*) FROM results WHERE trial_id = :t",
                t=ids["profiled"])[0][0] == 1
    command.upgrade(config, "head")
    assert current_revision(empty_url) == head_revision()
