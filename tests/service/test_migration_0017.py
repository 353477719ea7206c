"""Migration 0017 (profile status): an old profiled row reads back `stored` where a trace path
is recorded and `failed` where the profiler left none, an unprofiled row has no profile; a
downgrade drops the column and an upgrade brings it back. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from alembic import command

from service.db import crud
from service.db.engine import alembic_config, current_revision, head_revision, make_engine, \
    make_session_factory
from service.schemas.trials import TrialPublic

from .test_migration_0008 import _columns, _sql
from .test_migration_0010 import _insert_0009_sweep
from .test_migrations import empty_url  # noqa: F401 - the fixture, both databases


def _status_after_upgrade(url: str, config) -> tuple:
    command.upgrade(config, "head")
    (stored,) = _sql(url, "SELECT profile_status FROM results WHERE trial_id = 1001")
    engine = make_engine(url)
    with make_session_factory(engine)() as session:
        profile = TrialPublic.from_row(crud.get_trial(session=session, trial_id=1001)).profile
    engine.dispose()
    command.downgrade(config, "0016_interpreted_kernels")
    assert "profile_status" not in _columns(url, "results")
    return stored[0], profile


@pytest.mark.timeout(120)
def test_0017_old_profiles_are_stored_or_failed(empty_url):  # noqa: F811
    config = alembic_config(empty_url)
    command.upgrade(config, "0016_interpreted_kernels")
    _insert_0009_sweep(empty_url)  # never profiled
    assert _status_after_upgrade(empty_url, config) == (None, None)

    _sql(empty_url, "UPDATE results SET profile_format = 'chrome_trace_json_gz', "
         "profile_error = 'the profiler produced no trace'")
    status, profile = _status_after_upgrade(empty_url, config)
    assert status == "failed" and (profile.status, profile.url) == ("failed", None)

    _sql(empty_url, "UPDATE results SET profile_path = 'profiles/2026-12-01/a.pt.trace.json.gz',"
         " profile_bytes = 10, profile_error = NULL")
    status, profile = _status_after_upgrade(empty_url, config)
    assert status == "stored" and profile.status == "stored"
    assert profile.url == "/api/trials/1001/profile"
    command.upgrade(config, "head")
    assert current_revision(empty_url) == head_revision()
