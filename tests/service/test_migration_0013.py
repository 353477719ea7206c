"""Migration 0013 (regression alerts): a schedule saved before it reads back with no webhook
and runs on; `regression_alerts` takes one row per regression (a second is refused) and goes
with its schedule; a downgrade drops both and an upgrade brings them back. On SQLite and
PostgreSQL."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError

from service.db import crud
from service.db.engine import alembic_config, current_revision, head_revision, make_engine, \
    make_session_factory

from .test_migration_0008 import _columns, _sql
from .test_migrations import empty_url  # noqa: F401 - the fixture, both databases

_ALERT = ("INSERT INTO regression_alerts (schedule_id, series, metric, first_sweep_id, "
          "sweep_id, relative_change, status, attempts, created_at) VALUES (1000, 'torch/none', "
          "'step_time_s', 7, 8, 0.3, 'delivered', 1, '2026-12-01')")


@pytest.mark.timeout(120)
def test_0013_old_schedules_have_no_webhook_and_alerts_are_unique(empty_url):  # noqa: F811
    config = alembic_config(empty_url)
    command.upgrade(config, "0012_environments")
    _sql(empty_url, "INSERT INTO schedules (id, name, cron, timezone, spec, paused, "
         "allow_overlap, created_at, updated_at) VALUES (1000, 'old', '0 2 * * *', 'UTC', "
         "'{}', false, false, '2026-12-01', '2026-12-01')")

    command.upgrade(config, "head")
    assert [tuple(r) for r in _sql(empty_url, "SELECT webhook_url, webhook_status, "
                                   "webhook_error, webhook_at FROM schedules")] == [
        (None, None, None, None)]
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        schedule = crud.get_schedule(session=session, schedule_id=1000)
        assert schedule.webhook_url is None and schedule.name == "old"
    engine.dispose()
    _sql(empty_url, _ALERT)
    with pytest.raises(IntegrityError):  # the same regression twice
        _sql(empty_url, _ALERT)
    _sql(empty_url, "DELETE FROM schedules")  # the alerts go with their schedule
    assert _sql(empty_url, "SELECT COUNT(*) FROM regression_alerts")[0][0] == 0

    command.downgrade(config, "0012_environments")
    assert "webhook_url" not in _columns(empty_url, "schedules")
    engine = make_engine(empty_url)
    assert not inspect(engine).has_table("regression_alerts")
    engine.dispose()
    command.upgrade(config, "head")
    assert current_revision(empty_url) == head_revision()
    assert {"webhook_url", "webhook_status", "webhook_error", "webhook_at"} <= _columns(
        empty_url, "schedules")
