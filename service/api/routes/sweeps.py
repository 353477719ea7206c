"""Sweeps: create (validated against the grid cap), list, read, list trials, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from workers.result import TrialStatus

from ... import crud
from ...admission import grid_cap_error
from ...models import FINAL_SWEEP_STATUSES
from ...schemas import SweepCreate, SweepCreated, SweepPublic, SweepsPublic, TrialsPublic
from ..deps import SchedulerDep, SessionDep, SettingsDep, TokenDep

router = APIRouter(prefix="/sweeps", tags=["sweeps"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SweepCreated,
             dependencies=[TokenDep])
def create_sweep(sweep_in: SweepCreate, session: SessionDep, settings: SettingsDep,
                 scheduler: SchedulerDep) -> SweepCreated:
    """Queue a sweep; its trials run in the background (skipped grid points counted apart)."""
    too_large = grid_cap_error(sweep_in, settings.grid_cap)
    if too_large is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[too_large])
    try:
        sweep = crud.create_sweep(session=session, sweep_create=sweep_in)
    except ValueError as err:  # a model the presets cannot build: nothing was committed
        session.rollback()
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
            "type": "value_error", "loc": ["body", "model"], "msg": str(err)}]) from err
    if scheduler is not None:
        scheduler.wake()
    return SweepCreated(id=sweep.id, name=sweep.name, status=sweep.status,
                        trials=sweep.trials_total, skipped=sweep.trials_skipped)


@router.get("", response_model=SweepsPublic)
def list_sweeps(session: SessionDep, offset: Annotated[int, Query(ge=0)] = 0,
                limit: Annotated[int, Query(ge=1, le=200)] = 20) -> SweepsPublic:
    """Sweeps, newest first, each with its trial counts per status."""
    sweeps, count = crud.list_sweeps(session=session, offset=offset, limit=limit)
    counts = crud.status_counts(session=session, sweep_ids=[s.id for s in sweeps])
    return SweepsPublic(count=count, data=[crud.sweep_public(sweep=s, counts=counts[s.id])
                                           for s in sweeps])


def _sweep_or_404(session, sweep_id: int):
    sweep = crud.get_sweep(session=session, sweep_id=sweep_id)
    if sweep is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"sweep {sweep_id} not found")
    return sweep


@router.get("/{sweep_id}", response_model=SweepPublic)
def read_sweep(sweep_id: int, session: SessionDep) -> SweepPublic:
    """A sweep's status, spec and trial counts per status."""
    sweep = _sweep_or_404(session, sweep_id)
    counts = crud.status_counts(session=session, sweep_ids=[sweep_id])[sweep_id]
    return crud.sweep_public(sweep=sweep, counts=counts)


@router.get("/{sweep_id}/trials", response_model=TrialsPublic)
def list_sweep_trials(sweep_id: int, session: SessionDep,
                      status_: Annotated[list[TrialStatus] | None, Query(alias="status")] = None,
                      offset: Annotated[int, Query(ge=0)] = 0,
                      limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> TrialsPublic:
    """The sweep's trials in grid order with their metrics (filter with ?status=…)."""
    _sweep_or_404(session, sweep_id)
    rows, count = crud.list_trials(session=session, sweep_id=sweep_id, status=status_ or (),
                                   offset=offset, limit=limit)
    return TrialsPublic(count=count, data=rows)


@router.post("/{sweep_id}/cancel", status_code=status.HTTP_202_ACCEPTED,
             response_model=SweepPublic, dependencies=[TokenDep])
def cancel_sweep(sweep_id: int, session: SessionDep, scheduler: SchedulerDep) -> SweepPublic:
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
