"""What an operator watches, read from the database at once: sweeps and trials by status, the
queue's depth, and how late the most overdue schedule is (the scrape of /metrics reads it)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db.models import SWEEP_STATUSES, Schedule, Sweep, Trial
from workers.result import TRIAL_STATUSES

QUEUE_SWEEP_STATUSES = ("queued", "running")
"""Sweeps whose pending trials are work the scheduler still has to run."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class OperatorCounts:
    sweeps_by_status: dict[str, int]
    """Every sweep status, 0 where none."""
    trials_by_status: dict[str, int]
    """Every trial status, 0 where none."""
    queued_trials: int
    """Pending trials of queued or running sweeps: trials the scheduler has yet to start."""
    schedule_lag_s: float
    """How long ago the most overdue unpaused schedule was due (next_run_at ≤ now), 0 when
    none is due: a firing thread keeps it under GDN_SWEEP_SCHEDULE_POLL_S."""


def operator_counts(*, session: Session, now: dt.datetime) -> OperatorCounts:
    """The counts, read in one session (`now`: aware UTC, for the schedule lag)."""
    sweeps = dict.fromkeys(SWEEP_STATUSES, 0) | dict(session.execute(
        select(Sweep.status, func.count()).group_by(Sweep.status)).all())
    trials = dict.fromkeys(TRIAL_STATUSES, 0) | dict(session.execute(
        select(Trial.status, func.count()).group_by(Trial.status)).all())
    queued = session.scalar(select(func.count()).select_from(Trial).join(Sweep).where(
        Trial.status == "pending", Sweep.status.in_(QUEUE_SWEEP_STATUSES))) or 0
    overdue = session.scalar(select(func.min(Schedule.next_run_at)).where(
        Schedule.paused.is_(False), Schedule.next_run_at <= now))
    if overdue is not None and overdue.tzinfo is None:  # SQLite hands back naive UTC
        overdue = overdue.replace(tzinfo=dt.UTC)
    lag = 0.0 if overdue is None else max(0.0, (now - overdue).total_seconds())
    return OperatorCounts(sweeps_by_status=sweeps, trials_by_status=trials, queued_trials=queued,
                          schedule_lag_s=lag)


__all__ = ["OperatorCounts", "QUEUE_SWEEP_STATUSES", "operator_counts"]
