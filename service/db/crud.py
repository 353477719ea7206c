"""Database reads and writes behind the API. Every function takes keyword-only arguments."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence

from pydantic import ValidationError
from sqlalchemy import Select, and_, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased, object_session

from service.db.models import (
    FACT_COLUMNS,
    IdempotencyKey,
    Result,
    Sweep,
    Trial,
    TrialAttempt,
    result_for,
    trial_row,
    utcnow,
)
from service.db.schemas import SweepPublic, TrialPublic, trials_from_mappings
from workers.result import FINAL_STATUSES, TRIAL_STATUSES
from workers.spec import AcceleratorSpec, ModelSpec, SweepSpec, expand_trials


def create_sweep(*, session: Session, sweep_create: SweepSpec,
                 idempotency_key: str | None = None) -> Sweep:
    """Insert the sweep and one row per grid point in one transaction (skipped ones final),
    with its `idempotency_key` if given (IntegrityError: another sweep committed that key)."""
    trials = expand_trials(sweep_create)
    skipped = sum(t.skip_reason is not None for t in trials)
    sweep = Sweep(name=sweep_create.name, status="queued",
                  spec=sweep_create.model_dump(mode="json"), trials_total=len(trials),
                  trials_skipped=skipped, created_at=utcnow())
    session.add(sweep)
    session.flush()
    now = utcnow()
    rows = [trial_row(sweep_id=sweep.id, spec=spec, created_at=now,
                      status="pending" if spec.skip_reason is None else "skipped")
            for spec in trials]
    session.add_all(rows)
    session.flush()
    session.add_all(result_for(row, status="skipped", error=row.skip_reason, finished_at=now)
                    for row in rows if row.skip_reason is not None)
    if idempotency_key is not None:
        session.add(IdempotencyKey(key=idempotency_key, request_hash=spec_hash(sweep_create),
                                   sweep_id=sweep.id, created_at=now))
    session.commit()
    return sweep


def get_sweep(*, session: Session, sweep_id: int) -> Sweep | None:
    return session.get(Sweep, sweep_id)


def list_sweeps(*, session: Session, offset: int, limit: int) -> tuple[Sequence[Sweep], int]:
    """Sweeps newest first, and how many there are in all."""
    count = session.scalar(select(func.count()).select_from(Sweep)) or 0
    rows = session.scalars(select(Sweep).order_by(Sweep.id.desc()).offset(offset).limit(limit))
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


def sweep_public(*, sweep: Sweep, counts: dict[str, int]) -> SweepPublic:
    from service.core.chip_memory import chip_memory

    spec = stored_spec(sweep.spec)
    memory, label = chip_memory(spec.accelerator.kind, spec.accelerator.type)
    return SweepPublic(
        id=sweep.id, name=sweep.name, status=sweep.status, error=sweep.error,
        created_at=sweep.created_at, started_at=sweep.started_at, finished_at=sweep.finished_at,
        trials_total=sweep.trials_total, trials_skipped=sweep.trials_skipped,
        trials_done=sum(n for s, n in counts.items() if s in FINAL_STATUSES), counts=counts,
        spec=spec, chip_memory_bytes=memory, chip_memory_label=label,
        queue_position=queue_position(session=object_session(sweep), sweep=sweep))


_BaselineTrial, _BaselineResult = aliased(Trial), aliased(Result)


def public_trial_columns() -> tuple:
    """Columns that make a TrialPublic (with `schemas.trials_from_mappings`): a trial, its
    result and its one-chip baseline's id and tokens/s/chip, read as plain rows (no ORM
    objects: listings of thousands stay fast)."""
    skip = {"trial_id", "status", "started_at", *FACT_COLUMNS}
    return (*Trial.__table__.columns,
            *(c for c in Result.__table__.columns if c.key not in skip),
            Result.started_at.label("result_started_at"),
            _BaselineTrial.id.label("baseline_trial_id"),
            _BaselineResult.tokens_per_s_per_chip.label("baseline_tokens_per_s_per_chip"))


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
"""(the row's label, the AttemptPublic field) of each attempt column."""


def public_trials(*, session: Session, ids: Select, order_by: Sequence) -> list[TrialPublic]:
    """TrialPublic, attempt histories included, of the trials whose ids `ids` selects (a
    page's own query), in `order_by`: one statement, one snapshot — the database picks the
    page, joins it and its attempts (one row per attempt, in order; none before it ends)."""
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
    return trials_from_mappings(trials.values(), histories)


def list_trials(*, session: Session, sweep_id: int, status: Sequence[str] = (), offset: int = 0,
                limit: int | None = None) -> tuple[list[TrialPublic], int]:
    """A sweep's trials in grid order with their results (metrics None until they end)."""
    where = [Trial.sweep_id == sweep_id]
    if status:
        where.append(Trial.status.in_(status))
    count = session.scalar(select(func.count()).select_from(Trial).where(*where)) or 0
    page = select(Trial.id).where(*where).order_by(Trial.id).offset(offset).limit(limit)
    return public_trials(session=session, ids=page, order_by=[Trial.id]), count


def get_trial(*, session: Session, trial_id: int) -> TrialPublic | None:
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
