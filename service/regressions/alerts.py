"""Which regressions a finished sweep opened, and the record that each was alerted once.

A regression is new to a sweep when the series, read as that sweep left it (its runs up to
and including the sweep's), has it open, and the same series without the sweep's run does
not (report.series_shifts' `new`). `claim_alerts` inserts one `regression_alerts` row per
regression with ON CONFLICT DO NOTHING on (schedule, series, metric, first run): of two
processes, or a sweep finished twice, only the first to commit sends it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import update
from sqlalchemy.orm import Session

from service.db.models import RegressionAlert, Schedule, Sweep, utcnow
from service.regressions.report import series_shifts
from service.schemas.schedules import ShiftPublic
from service.regressions.series import load_series

ERROR_LIMIT = 2000
"""Characters of a delivery error kept."""


def new_regressions(*, session: Session, sweep_id: int) -> tuple[Schedule | None,
                                                                  list[ShiftPublic]]:
    """The schedule that created sweep `sweep_id` and the regressions the sweep opened in its
    series (none for a sweep no schedule created)."""
    sweep = session.get(Sweep, sweep_id)
    if sweep is None or sweep.schedule_id is None:
        return None, []
    schedule = session.get(Schedule, sweep.schedule_id)
    found = []
    for series in load_series(session=session, schedule_ids=[sweep.schedule_id],
                              before_sweep_id=sweep_id):
        if series.runs[-1].sweep_id != sweep_id:
            continue
        found.extend(s for s in series_shifts(session, series, with_points=False)
                     if s.kind == "regression" and s.new)
    return schedule, found


def claim_alerts(*, session: Session, schedule_id: int, sweep_id: int,
                 regressions: Sequence[ShiftPublic]) -> list[tuple[int, ShiftPublic]]:
    """Record each regression as being alerted; (alert id, regression) of those no process
    recorded before (in one commit)."""
    insert = _insert(session)
    claimed = []
    for shift in regressions:
        alert_id = session.execute(insert.values(
            schedule_id=schedule_id, series=shift.series, metric=shift.metric,
            first_sweep_id=shift.first_run.sweep_id, sweep_id=sweep_id,
            relative_change=shift.relative_change, status="pending", attempts=0,
            created_at=utcnow()).returning(RegressionAlert.id)).scalar()
        if alert_id is not None:
            claimed.append((alert_id, shift))
    session.commit()
    return claimed


def record_delivery(*, session: Session, schedule_id: int, alert_ids: Sequence[int],
                    error: str | None, attempts: int) -> None:
    """Store how the POST of `alert_ids` ended (error None: delivered) on the alerts and as
    the schedule's latest delivery."""
    now = utcnow()
    status = "delivered" if error is None else "failed"
    error = None if error is None else error[:ERROR_LIMIT]
    session.execute(update(RegressionAlert).where(RegressionAlert.id.in_(list(alert_ids)))
                    .values(status=status, error=error, attempts=attempts,
                            delivered_at=now if error is None else None))
    session.execute(update(Schedule).where(Schedule.id == schedule_id).values(
        webhook_status=status, webhook_error=error, webhook_at=now))
    session.commit()


def _insert(session: Session):
    """INSERT INTO regression_alerts … ON CONFLICT DO NOTHING, in the session's dialect."""
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(RegressionAlert).on_conflict_do_nothing(
        index_elements=["schedule_id", "series", "metric", "first_sweep_id"])
