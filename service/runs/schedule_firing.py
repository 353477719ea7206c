"""Firing schedules: each due time of a schedule claimed exactly once, in the transaction of
the sweep it creates; `ScheduleLoop`, the thread that fires what is due every
`schedule_poll_s` (apart from the sweep queue's thread, which blocks while it drives a sweep).

Every process that runs a scheduler runs a ScheduleLoop; the database makes each due time fire
once however many do. `fire_due(now=…)` fires every schedule whose next due time has come,
with the clock passed in (the loop passes the wall clock, tests a fixed instant). For one
schedule:

1. The tick fired is the latest due time at or before `now`: a service that was down over
   several ticks fires once, for the last of them; the earlier missed ticks are not recorded.
2. A `schedule_runs` row (primary key schedule_id, due_at) is inserted with ON CONFLICT DO
   NOTHING as the transaction's first write: of several processes at the same instant one
   inserts it, the others (PostgreSQL: once the first has committed; SQLite: one writer at a
   time) insert nothing and create nothing.
3. In the same transaction: the sweep and its trial rows (crud.add_sweep, the path of POST
   /api/sweeps), or no sweep when the schedule's previous sweep is still queued, running or
   cancelling (`skipped_overlap`, unless allow_overlap) or the stored spec no longer makes a
   sweep (`failed`, with the reason); the schedule's next due time moves past the tick. One
   commit: no sweep without its claim, no claim without its outcome. A database error rolls
   it all back and the next poll tries again; the loop logs it, never stops on it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.core.config import Settings
from service.core.cron import latest_due, local_time, next_due
from service.db import crud
from service.db.errors import clean_error, is_transient
from service.db.models import Schedule, ScheduleRun, Sweep, utcnow
from service.runs.admission import grid_cap_error
from service.runs.background_loop import BackgroundLoop
from workers.sweep_spec import SweepSpec

log = logging.getLogger(__name__)

OPEN_SWEEP_STATUSES = ("queued", "running", "cancelling")
"""A schedule's sweep in one of these is still going: the next tick overlaps it."""
NAME_LIMIT = 200
"""Longest sweep name (sweeps.name)."""


@dataclasses.dataclass(frozen=True)
class Fired:
    """What one due time of a schedule did."""

    schedule_id: int
    due_at: dt.datetime
    outcome: str
    """created, skipped_overlap or failed (models.SCHEDULE_RUN_OUTCOMES)."""
    sweep_id: int | None = None
    error: str | None = None


def sweep_name(name: str, due_at: dt.datetime, timezone: str) -> str:
    """`<name> <due time in the schedule's zone>`, e.g. "nightly 2026-12-03 02:00 CET",
    the name cut so the whole fits a sweep name."""
    when = local_time(due_at, timezone).strftime("%Y-%m-%d %H:%M %Z")
    return f"{name[:NAME_LIMIT - len(when) - 1].rstrip()} {when}"


def fire_due(*, session_factory: sessionmaker[Session], now: dt.datetime,
             grid_cap: int | None = None) -> list[Fired]:
    """Fire every unpaused schedule due at `now` (aware UTC), each in its own transaction.
    A transient database error stops the round (the caller retries); any other error is
    logged and the other schedules still fire."""
    with session_factory() as session:
        due_ids = session.scalars(select(Schedule.id).where(
            Schedule.paused.is_(False), Schedule.next_run_at <= now)
            .order_by(Schedule.next_run_at, Schedule.id)).all()
    fired = []
    for schedule_id in due_ids:
        try:
            with session_factory() as session:
                outcome = fire_schedule(session=session, schedule_id=schedule_id, now=now,
                                        grid_cap=grid_cap)
        except Exception as err:
            if is_transient(err):
                raise
            log.exception("schedule %s: firing failed (%s)", schedule_id, clean_error(err))
            continue
        if outcome is not None:
            fired.append(outcome)
    return fired


def fire_schedule(*, session: Session, schedule_id: int, now: dt.datetime,
                  grid_cap: int | None = None) -> Fired | None:
    """Fire the schedule's latest due time at or before `now` if no process has (see the
    module docstring); None when it is not due, or another process fired it."""
    schedule = session.get(Schedule, schedule_id, populate_existing=True)
    if schedule is None or schedule.paused or schedule.next_run_at is None:
        return None
    next_run_at = _utc(schedule.next_run_at)
    if next_run_at > now:
        return None
    seen = (schedule.cron, schedule.timezone, next_run_at)
    due = max(latest_due(schedule.cron, schedule.timezone, now), next_run_at)
    following = next_due(schedule.cron, schedule.timezone, due)
    session.rollback()  # the claim below is the transaction's first statement

    claimed = session.execute(_claim(session).values(
        schedule_id=schedule_id, due_at=due, outcome="created", created_at=now)
        .returning(ScheduleRun.schedule_id)).first() is not None
    # FOR NO KEY UPDATE: serializes firings of the schedule without waiting on the key-share
    # locks other claims' foreign keys hold (FOR UPDATE would deadlock two claims)
    schedule = session.scalars(select(Schedule).where(Schedule.id == schedule_id)
                               .with_for_update(key_share=True)
                               .execution_options(populate_existing=True)).one_or_none()
    if schedule is None or schedule.paused or (
            schedule.cron, schedule.timezone, _utc(schedule.next_run_at)) != seen:
        session.rollback()  # changed (or fired) meanwhile: the next poll looks again
        return None
    if not claimed:  # fired already (a process that died before moving next_run_at cannot
        schedule.next_run_at = following  # exist: both are one commit; this is a backstop)
        session.commit()
        return None
    fired = _outcome(session, schedule, due, grid_cap)
    session.execute(update(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id,
                                              ScheduleRun.due_at == due)
                    .values(outcome=fired.outcome, sweep_id=fired.sweep_id, error=fired.error))
    schedule.next_run_at = following
    schedule.last_run_at = due
    session.commit()
    log.info("schedule %s: %s for %s%s", schedule_id, fired.outcome, due.isoformat(),
             "" if fired.sweep_id is None else f" (sweep {fired.sweep_id})",
             extra={"event": "schedule_fired", "schedule_id": schedule_id,
                    "sweep_id": fired.sweep_id, "outcome": fired.outcome})
    return fired


def _outcome(session: Session, schedule: Schedule, due: dt.datetime,
             grid_cap: int | None) -> Fired:
    """The sweep this tick creates (flushed into the session's transaction), or why none."""
    if not schedule.allow_overlap and session.scalar(select(exists().where(
            Sweep.schedule_id == schedule.id, Sweep.status.in_(OPEN_SWEEP_STATUSES)))):
        return Fired(schedule.id, due, "skipped_overlap")
    try:
        spec = SweepSpec.model_validate(schedule.spec)
        too_large = None if grid_cap is None else grid_cap_error(spec, grid_cap)
        if too_large is not None:
            raise ValueError(too_large["msg"])
        spec = spec.model_copy(update={"name": sweep_name(spec.name, due, schedule.timezone)})
        sweep = crud.add_sweep(session=session, sweep_create=spec, schedule_id=schedule.id)
    except ValueError as err:  # a rule, preset or cap changed since the schedule was saved
        log.warning("schedule %s: its spec makes no sweep: %s", schedule.id, err)
        return Fired(schedule.id, due, "failed", error=str(err)[:2000])
    return Fired(schedule.id, due, "created", sweep_id=sweep.id)


def _claim(session: Session):
    """INSERT INTO schedule_runs … ON CONFLICT DO NOTHING, in the session's dialect."""
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(ScheduleRun).on_conflict_do_nothing(index_elements=["schedule_id", "due_at"])


def _utc(value: dt.datetime) -> dt.datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class ScheduleLoop:
    """Own one background thread that fires due schedules."""

    def __init__(self, *, session_factory: sessionmaker[Session], settings: Settings,
                 clock: Callable[[], dt.datetime] = utcnow,
                 on_created: Callable[[int], None] | None = None) -> None:
        """`clock`: the current time, aware UTC (tests pass their own); `on_created`: called
        with the id of each sweep created (the service wakes its scheduler)."""
        self._session_factory = session_factory
        self._grid_cap = settings.grid_cap
        self._clock = clock
        self._on_created = on_created
        self._loop = BackgroundLoop(self.tick, name="gdn-sweep-schedules", what="schedules",
                                    interval_s=settings.schedule_poll_s, log=log)

    def start(self) -> None:
        self._loop.start()

    def tick(self) -> list[Fired]:
        """Fire what is due now (raises on a database error; the loop logs it and goes on)."""
        fired = fire_due(session_factory=self._session_factory, now=self._clock(),
                         grid_cap=self._grid_cap)
        for outcome in fired:
            if outcome.sweep_id is not None and self._on_created is not None:
                self._on_created(outcome.sweep_id)
        return fired

    def request_stop(self) -> None:
        self._loop.request_stop()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread; False if it still runs after timeout_s."""
        return self._loop.join(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> bool:
        self.request_stop()
        return self.join(timeout_s)
