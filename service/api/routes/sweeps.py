"""Sweeps: create (validated against the grid cap), list, read, list trials, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Response, status
from sqlalchemy.exc import IntegrityError

from service.api.deps import SchedulerDep, SessionDep, SettingsDep, TokenDep
from service.api.params import Offset, RowId
from service.db import crud
from service.db.bounds import DB_INT_MAX
from service.db.models import FINAL_SWEEP_STATUSES
from service.schemas.sweeps import SweepCreate, SweepCreated, SweepPublic, SweepsPublic
from service.schemas.trials import TrialPublic, TrialsPublic
from service.runs.admission import grid_cap_error
from workers.result import TrialStatus

router = APIRouter(prefix="/sweeps", tags=["sweeps"])


IdempotencyKeyHeader = Annotated[str | None, Header(
    alias="Idempotency-Key", min_length=1, max_length=200, pattern=r"^[\x20-\x7e]+$",
    description="1–200 printable ASCII characters: a repeat with the same key and body answers "
                "the sweep the first request created (200) instead of creating another")]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SweepCreated,
             dependencies=[TokenDep],
             responses={200: {"model": SweepCreated, "description": "a repeat of an "
                              "Idempotency-Key: the sweep its first request created"},
                        409: {"description": "the Idempotency-Key came with another body"}})
def create_sweep(sweep_in: SweepCreate, session: SessionDep, settings: SettingsDep,
                 scheduler: SchedulerDep, response: Response,
                 idempotency_key: IdempotencyKeyHeader = None) -> SweepCreated:
    """Queue a sweep; its trials run in the background (skipped grid points counted apart).
    With an `Idempotency-Key`, a retried request answers the sweep it created the first time."""
    if idempotency_key is not None:
        earlier = crud.get_idempotency_key(session=session, key=idempotency_key)
        if earlier is not None:
            return _replayed(earlier, sweep_in, response)
    too_large = grid_cap_error(sweep_in, settings.grid_cap)
    if too_large is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[too_large])
    try:
        sweep = crud.create_sweep(session=session, sweep_create=sweep_in,
                                  idempotency_key=idempotency_key)
    except ValueError as err:  # a model the presets cannot build: nothing was committed
        session.rollback()
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
            "type": "value_error", "loc": ["body", "model"], "msg": str(err)}]) from err
    except IntegrityError:  # a concurrent request with the same key committed its sweep first
        session.rollback()
        earlier = (None if idempotency_key is None else
                   crud.get_idempotency_key(session=session, key=idempotency_key))
        if earlier is None:
            raise
        return _replayed(earlier, sweep_in, response)
    if scheduler is not None:
        scheduler.wake()
    return SweepCreated.from_row(sweep)


def _replayed(earlier, sweep_in: SweepCreate, response: Response) -> SweepCreated:
    """200 with the first request's body if `sweep_in` is what it asked for; else 409."""
    if earlier.request_hash != crud.spec_hash(sweep_in):
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"Idempotency-Key {earlier.key!r} was used for sweep "
                            f"{earlier.sweep_id} with another request body; send a new key "
                            "for a new sweep")
    response.status_code = status.HTTP_200_OK
    response.headers["Idempotent-Replayed"] = "true"
    return SweepCreated.from_row(earlier.sweep)


@router.get("", response_model=SweepsPublic)
def list_sweeps(session: SessionDep, offset: Offset = 0,
                limit: Annotated[int, Query(ge=1, le=200)] = 20,
                schedule_id: Annotated[int | None, Query(
                    ge=1, le=DB_INT_MAX, description="only the sweeps this schedule created")
                ] = None) -> SweepsPublic:
    """Sweeps, newest first, each with its trial counts per status."""
    sweeps, count = crud.list_sweeps(session=session, offset=offset, limit=limit,
                                     schedule_id=schedule_id)
    counts = crud.status_counts(session=session, sweep_ids=[s.id for s in sweeps])
    return SweepsPublic(count=count, data=[_public(session, s, counts[s.id]) for s in sweeps])


def _public(session, sweep, counts: dict[str, int]) -> SweepPublic:
    return SweepPublic.from_row(sweep, counts=counts,
                                queue_position=crud.queue_position(session=session, sweep=sweep))


def _sweep_or_404(session, sweep_id: int):
    sweep = crud.get_sweep(session=session, sweep_id=sweep_id)
    if sweep is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"sweep {sweep_id} not found")
    return sweep


@router.get("/{sweep_id}", response_model=SweepPublic)
def read_sweep(sweep_id: RowId, session: SessionDep) -> SweepPublic:
    """A sweep's status, spec and trial counts per status."""
    sweep = _sweep_or_404(session, sweep_id)
    counts = crud.status_counts(session=session, sweep_ids=[sweep_id])[sweep_id]
    return _public(session, sweep, counts)


@router.get("/{sweep_id}/trials", response_model=TrialsPublic)
def list_sweep_trials(sweep_id: RowId, session: SessionDep,
                      status_: Annotated[list[TrialStatus] | None, Query(alias="status")] = None,
                      offset: Offset = 0,
                      limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> TrialsPublic:
    """The sweep's trials in grid order with their metrics (filter with ?status=…)."""
    _sweep_or_404(session, sweep_id)
    rows, count = crud.list_trials(session=session, sweep_id=sweep_id, status=status_ or (),
                                   offset=offset, limit=limit)
    return TrialsPublic(count=count, data=TrialPublic.from_rows(rows))


@router.post("/{sweep_id}/cancel", status_code=status.HTTP_202_ACCEPTED,
             response_model=SweepPublic, dependencies=[TokenDep])
def cancel_sweep(sweep_id: RowId, session: SessionDep, scheduler: SchedulerDep) -> SweepPublic:
    """Cancel: a queued sweep ends at once; a running one stops its trials (202, cancelling)."""
    sweep = _sweep_or_404(session, sweep_id)
    if sweep.status in FINAL_SWEEP_STATUSES:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"sweep {sweep_id} is already {sweep.status}; only queued or running "
                            "sweeps can be cancelled")
    if crud.claim_sweep(session=session, sweep_id=sweep_id, from_statuses=("queued",),
                        to_status="cancelled"):
        crud.close_unfinished(session=session, sweep_id=sweep_id, status="cancelled",
                              error="sweep cancelled before this trial ran")
    elif crud.claim_sweep(session=session, sweep_id=sweep_id, from_statuses=("running",),
                          to_status="cancelling") and scheduler is not None:
        scheduler.cancel(sweep_id)
    session.expire_all()
    return read_sweep(sweep_id, session)
