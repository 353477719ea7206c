"""Database reads and writes behind the API. Every function takes keyword-only arguments and
returns rows: ORM objects, or plain row tuples (TrialRow) where a listing joins many tables.
The API models are built from them by service.schemas, which this layer never imports."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import ValidationError
from sqlalchemy import Select, and_, case, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from service.core.cron import next_due
from service.db.interpreted import compiled_kernels
from service.db.models import (
    FACT_COLUMNS,
    IdempotencyKey,
    Result,
    Schedule,
    ScheduleRun,
    Sweep,
    Trial,
    TrialAttempt,
    result_for,
    trial_row,
    trial_spec,
    utcnow,
)
from workers.result import FINAL_STATUSES, TRIAL_STATUSES
from workers.grid import TrialSpec, expand_trials
from workers.sweep_spec import AcceleratorSpec, ModelSpec, SweepSpec


def create_sweep(*, session: Session, sweep_create: SweepSpec,
                 idempotency_key: str | None = None,
                 trials: Sequence[TrialSpec] | None = None) -> Sweep:
    """Insert the sweep and one row per grid point in one transaction (skipped ones final),
    with its `idempotency_key` if given (IntegrityError: another sweep committed that key).
    `trials`: see add_sweep."""
    sweep = add_sweep(session=session, sweep_create=sweep_create, trials=trials)
    if idempotency_key is not None:
        session.add(IdempotencyKey(key=idempotency_key, request_hash=spec_hash(sweep_create),
                                   sweep_id=sweep.id, created_at=sweep.created_at))
    session.commit()
    return sweep


def add_sweep(*, session: Session, sweep_create: SweepSpec, schedule_id: int | None = None,
              trials: Sequence[TrialSpec] | None = None) -> Sweep:
    """Add the queued sweep, its trial rows and the results of its skipped points to the
    session's transaction (flushed, not committed); ValueError for a model the presets cannot
    build. The rows are the sweep's one expansion: `trials` when the caller has expanded
    `sweep_create` already (expand_trials), else expanded here. Its runners run these rows
    (sweep_trials)."""
    trials = expand_trials(sweep_create) if trials is None else trials
    skipped = sum(t.skip_reason is not None for t in trials)
    now = utcnow()
    sweep = Sweep(name=sweep_create.name, status="queued",
                  spec=sweep_create.model_dump(mode="json"), trials_total=len(trials),
                  trials_skipped=skipped, created_at=now, schedule_id=schedule_id)
    session.add(sweep)
    session.flush()
    rows = [trial_row(sweep_id=sweep.id, spec=spec, created_at=now,
                      status="pending" if spec.skip_reason is None else "skipped")
            for spec in trials]
    session.add_all(rows)
    session.flush()
    session.add_all(result_for(row, status="skipped", error=row.skip_reason, finished_at=now)
                    for row in rows if row.skip_reason is not None)
    session.flush()
    return sweep


def get_sweep(*, session: Session, sweep_id: int) -> Sweep | None:
    return session.get(Sweep, sweep_id)


def sweep_trials(*, session: Session, sweep_id: int) -> list[TrialSpec]:
    """The sweep's trials as its rows hold them, in grid order: what a runner hands the
    driver (the grid is not expanded again). ValueError for a row this version cannot run."""
    spec = stored_spec(session.get(Sweep, sweep_id).spec)
    rows = session.scalars(select(Trial).where(Trial.sweep_id == sweep_id).order_by(Trial.id))
    # a plan runs once whatever the repeats (expand_trials)
    return [trial_spec(row, repeats=spec.repeats if row.kind == "measure" else 1,
                       profile=spec.profile, admit_over_memory=spec.admit_over_memory)
            for row in rows]


def list_sweeps(*, session: Session, offset: int, limit: int,
                schedule_id: int | None = None) -> tuple[Sequence[Sweep], int]:
    """Sweeps newest first (only those `schedule_id` created, if given), and how many there
    are in all."""
    where = [] if schedule_id is None else [Sweep.schedule_id == schedule_id]
    count = session.scalar(select(func.count()).select_from(Sweep).where(*where)) or 0
    rows = session.scalars(select(Sweep).where(*where).order_by(Sweep.id.desc())
                           .offset(offset).limit(limit))
    return rows.all(), count


def status_counts(*, session: Session, sweep_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """Trials per status for each sweep, every status present (zeros included)."""
    counts = {sid: dict.fromkeys(TRIAL_STATUSES, 0) for sid in sweep_ids}
    if not sweep_ids:
        return counts
    stmt = (select(Trial.sweep_id, Trial.status, func.count())
            .where(Trial.sweep_id.in_(sweep_ids)).group_by(Trial.sweep_id, Trial.status))
    for sweep_id, status, n in session.execute(stmt):
        counts[sweep_id][status] = n
    return counts


def stored_spec(raw: dict) -> SweepSpec:
    """A stored sweep's spec as it was accepted: a rule added since (torch on TPU refused, say)
    must not make an old sweep unreadable, so an invalid one is shown unvalidated."""
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError:
        return SweepSpec.model_construct(**{
            **raw, "model": ModelSpec.model_construct(**raw.get("model", {})),
            "accelerator": AcceleratorSpec.model_construct(**raw.get("accelerator", {}))})


def queue_position(*, session: Session, sweep: Sweep) -> int | None:
    """1 + the queued sweeps taken before this one, in the scheduler's order (oldest id first:
    `runs.sweep_run.next_sweep_id`); None unless the sweep is queued."""
    if sweep.status != "queued":
        return None
    ahead = session.scalar(select(func.count()).select_from(Sweep).where(
        Sweep.status == "queued", Sweep.id < sweep.id)) or 0
    return ahead + 1


_BaselineTrial, _BaselineResult = aliased(Trial), aliased(Result)


class TrialRow(NamedTuple):
    """A trial as the listings read it: plain rows, no ORM objects (listings of thousands stay
    fast). service.schemas.trials.TrialPublic.from_row(s) makes the API's trial of it."""

    columns: Mapping[str, Any]
    """The trial's columns, its result's (its start as `result_started_at`), and its one-chip
    baseline's `baseline_trial_id` and `baseline_tokens_per_s_per_chip` (public_trial_columns)."""
    attempts: list[dict[str, Any]]
    """Its trial_attempts rows in order, as {attempt, status, reason, hosts, started_at,
    finished_at} (none before it ends)."""


def public_trial_columns() -> tuple:
    """The columns of a TrialRow: a trial, its result and its one-chip baseline's id and
    tokens/s/chip."""
    skip = {"trial_id", "status", "started_at", *FACT_COLUMNS}
    return (*Trial.__table__.columns,
            *(c for c in Result.__table__.columns if c.key not in skip),
            Result.started_at.label("result_started_at"),
            _BaselineTrial.id.label("baseline_trial_id"),
            # an interpreted baseline's tokens/s is no speed: no scaling efficiency from it
            case((compiled_kernels(_BaselineResult), _BaselineResult.tokens_per_s_per_chip),
                 else_=None).label("baseline_tokens_per_s_per_chip"))


@functools.cache
def public_select() -> Select:
    """Trials joined to their results and baselines (built once: statements are immutable,
    and building its ~80 columns cost more than running it)."""
    return (select(*public_trial_columns()).select_from(Trial)
            .outerjoin(Result, Result.trial_id == Trial.id)
            .outerjoin(_BaselineTrial, and_(_BaselineTrial.sweep_id == Trial.sweep_id,
                                            _BaselineTrial.key == Trial.baseline_key))
            .outerjoin(_BaselineResult, and_(_BaselineResult.trial_id == _BaselineTrial.id,
                                             _BaselineResult.status == "succeeded")))


_ATTEMPT_COLUMNS = tuple(c.label(f"attempt_{c.key}") for c in TrialAttempt.__table__.columns
                         if c.key != "trial_id")
_ATTEMPT_FIELDS = tuple((c.key, c.key.removeprefix("attempt_")) for c in _ATTEMPT_COLUMNS)
"""(the row's label, the trial_attempts column) of each attempt column."""


def public_trials(*, session: Session, ids: Select, order_by: Sequence) -> list[TrialRow]:
    """TrialRows, attempts included, of the trials whose ids `ids` selects (a page's own
    query), in `order_by`: one statement, one snapshot — the database picks the page, joins
    it and its attempts (one row per attempt, in order; none before it ends)."""
    stmt = (public_select().add_columns(*_ATTEMPT_COLUMNS)
            .outerjoin(TrialAttempt, TrialAttempt.trial_id == Trial.id)
            .where(Trial.id.in_(ids.correlate(None))).order_by(*order_by, TrialAttempt.attempt))
    trials: dict[int, dict] = {}
    histories: dict[int, list[dict]] = {}
    for row in session.execute(stmt).mappings():
        trial = trials.setdefault(row["id"], row)
        if row["attempt_attempt"] is not None:
            histories.setdefault(trial["id"], []).append(
                {field: row[label] for label, field in _ATTEMPT_FIELDS})
    return [TrialRow(row, histories.get(trial_id, [])) for trial_id, row in trials.items()]


def list_trials(*, session: Session, sweep_id: int, status: Sequence[str] = (), offset: int = 0,
                limit: int | None = None) -> tuple[list[TrialRow], int]:
    """A sweep's trials in grid order with their results (metrics None until they end), and
    how many match in all."""
    where = [Trial.sweep_id == sweep_id]
    if status:
        where.append(Trial.status.in_(status))
    count = session.scalar(select(func.count()).select_from(Trial).where(*where)) or 0
    page = select(Trial.id).where(*where).order_by(Trial.id).offset(offset).limit(limit)
    return public_trials(session=session, ids=page, order_by=[Trial.id]), count


def get_trial(*, session: Session, trial_id: int) -> TrialRow | None:
    """The trial with its result, baseline and attempts; None if there is none."""
    rows = public_trials(session=session, ids=select(Trial.id).where(Trial.id == trial_id),
                         order_by=[])
    return rows[0] if rows else None


def close_unfinished(*, session: Session, sweep_id: int, status: str, error: str) -> int:
    """Give every trial of the sweep without a final status `status`, with a result row."""
    for _attempt in range(3):  # a result written meanwhile by a sink wins; then retry the rest
        now = utcnow()
        open_trials = session.scalars(select(Trial).where(
            Trial.sweep_id == sweep_id, Trial.status.not_in(FINAL_STATUSES))).all()
        for trial in open_trials:
            session.add(result_for(trial, status=status, error=error,
                                   started_at=trial.started_at, finished_at=now))
            trial.status = status
        try:
            session.commit()
            return len(open_trials)
        except IntegrityError:
            session.rollback()
    raise RuntimeError(f"could not close the open trials of sweep {sweep_id}")


def claim_sweep(*, session: Session, sweep_id: int, from_statuses: Sequence[str],
                to_status: str) -> bool:
    """Move the sweep to `to_status` only if it is in one of `from_statuses` (atomic)."""
    values: dict = {"status": to_status}
    if to_status == "running":
        values["started_at"] = func.coalesce(Sweep.started_at, utcnow())
    if to_status in ("finished", "cancelled", "failed"):
        values["finished_at"] = utcnow()
    done = session.execute(update(Sweep).where(Sweep.id == sweep_id,
                                               Sweep.status.in_(from_statuses)).values(**values))
    session.commit()
    return done.rowcount == 1


def spec_hash(spec: SweepSpec) -> str:
    """SHA-256 of the validated spec as JSON with sorted keys: equal for the same sweep however
    its request body was spelled (whitespace, key order, defaults left out)."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def get_idempotency_key(*, session: Session, key: str) -> IdempotencyKey | None:
    """The stored Idempotency-Key `key` (with its sweep), None if no sweep was created with it."""
    return session.get(IdempotencyKey, key)


SCHEDULE_RUNS_SHOWN = 20
"""Latest ticks listed with each schedule."""


def create_schedule(*, session: Session, name: str, cron: str, timezone: str,
                    spec: SweepSpec, paused: bool = False, allow_overlap: bool = False,
                    webhook_url: str | None = None, now: dt.datetime | None = None) -> Schedule:
    """Insert a schedule (its spec already checked as POST /api/sweeps checks one); its next
    due time is the first after `now`, none while paused."""
    now = now or utcnow()
    schedule = Schedule(name=name, cron=cron, timezone=timezone,
                        spec=spec.model_dump(mode="json"), paused=paused,
                        allow_overlap=allow_overlap, created_at=now, updated_at=now,
                        webhook_url=webhook_url,
                        next_run_at=None if paused else next_due(cron, timezone, now))
    session.add(schedule)
    session.commit()
    return schedule


def get_schedule(*, session: Session, schedule_id: int) -> Schedule | None:
    return session.get(Schedule, schedule_id)


def list_schedules(*, session: Session, offset: int = 0,
                   limit: int | None = None) -> tuple[Sequence[Schedule], int]:
    """Schedules newest first, and how many there are in all."""
    count = session.scalar(select(func.count()).select_from(Schedule)) or 0
    rows = session.scalars(select(Schedule).order_by(Schedule.id.desc())
                           .offset(offset).limit(limit))
    return rows.all(), count


def update_schedule(*, session: Session, schedule: Schedule, changes: Mapping[str, Any],
                    now: dt.datetime | None = None) -> Schedule:
    """Set the columns `changes` names (name, cron, timezone, spec as JSON, paused,
    allow_overlap, webhook_url: None removes it). A change of cron, time zone or paused sets
    the next due time from `now`: ticks missed while paused are not fired on resume."""
    now = now or utcnow()
    retime = any(k in changes and changes[k] != getattr(schedule, k)
                 for k in ("cron", "timezone", "paused"))
    for field, value in changes.items():
        setattr(schedule, field, value)
    if retime:
        schedule.next_run_at = (None if schedule.paused else
                                next_due(schedule.cron, schedule.timezone, now))
    schedule.updated_at = now
    session.commit()
    return schedule


def delete_schedule(*, session: Session, schedule: Schedule) -> None:
    """Delete the schedule and its run records; the sweeps it created stay, unlinked."""
    session.execute(update(Sweep).where(Sweep.schedule_id == schedule.id)
                    .values(schedule_id=None))
    session.execute(delete(ScheduleRun).where(ScheduleRun.schedule_id == schedule.id))
    session.delete(schedule)
    session.commit()


class ScheduleActivity(NamedTuple):
    """What a page of schedules did: per schedule id, its latest runs and its sweep count."""

    runs: dict[int, list[ScheduleRun]]
    """The latest SCHEDULE_RUNS_SHOWN ticks, newest first."""
    sweeps_created: dict[int, int]
    """Ticks that created a sweep, in all."""


def schedule_activity(*, session: Session, schedule_ids: Sequence[int]) -> ScheduleActivity:
    """Each schedule's latest runs and sweep count (two queries for the whole page)."""
    ids = list(schedule_ids)
    runs: dict[int, list] = {i: [] for i in ids}
    created: dict[int, int] = dict.fromkeys(ids, 0)
    if ids:
        rank = func.row_number().over(partition_by=ScheduleRun.schedule_id,
                                      order_by=ScheduleRun.due_at.desc()).label("rank")
        ranked = select(ScheduleRun, rank).where(ScheduleRun.schedule_id.in_(ids)).subquery()
        latest = aliased(ScheduleRun, ranked)
        for run in session.scalars(select(latest).where(ranked.c.rank <= SCHEDULE_RUNS_SHOWN)
                                   .order_by(ranked.c.schedule_id, ranked.c.due_at.desc())):
            runs[run.schedule_id].append(run)
        for schedule_id, n in session.execute(
                select(ScheduleRun.schedule_id, func.count())
                .where(ScheduleRun.schedule_id.in_(ids), ScheduleRun.outcome == "created")
                .group_by(ScheduleRun.schedule_id)):
            created[schedule_id] = n
    return ScheduleActivity(runs, created)
