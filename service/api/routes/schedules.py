"""Schedules: a sweep spec run on a cron expression in a time zone. Create (the spec checked
as POST /api/sweeps checks one), list, read, change, pause, resume, delete. Processes that
run a scheduler fire them (service/runs/schedule_firing.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status

from service.api.deps import SessionDep, SettingsDep, TokenDep
from service.api.params import Offset, RowId
from service.db import crud
from service.schemas.schedules import (ScheduleCreate, SchedulePublic, SchedulesPublic,
                                       ScheduleUpdate)
from service.runs.admission import spec_errors

router = APIRouter(prefix="/schedules", tags=["schedules"])


def _checked_spec(spec, settings) -> None:
    """422 for a spec POST /api/sweeps would refuse (grid cap, presets)."""
    problems = spec_errors(spec, settings.grid_cap)
    if problems:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=problems)


def _schedule_or_404(session, schedule_id: int):
    schedule = crud.get_schedule(session=session, schedule_id=schedule_id)
    if schedule is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"schedule {schedule_id} not found")
    return schedule


def _public(session, schedule) -> SchedulePublic:
    (public,) = _page(session, [schedule])
    return public


def _page(session, schedules) -> list[SchedulePublic]:
    """SchedulePublic of each, with its latest runs and sweep count (two queries in all)."""
    activity = crud.schedule_activity(session=session, schedule_ids=[s.id for s in schedules])
    return SchedulePublic.from_rows(schedules, activity)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SchedulePublic,
             dependencies=[TokenDep])
def create_schedule(schedule_in: ScheduleCreate, session: SessionDep,
                    settings: SettingsDep) -> SchedulePublic:
    """Save a schedule; from its next due time on, each tick queues a sweep of `spec` named
    `<spec.name> <due time in the schedule's zone>`."""
    _checked_spec(schedule_in.spec, settings)
    schedule = crud.create_schedule(session=session, **schedule_in.columns())
    return _public(session, schedule)


@router.get("", response_model=SchedulesPublic)
def list_schedules(session: SessionDep, offset: Offset = 0,
                   limit: Annotated[int, Query(ge=1, le=200)] = 50) -> SchedulesPublic:
    """Schedules, newest first, each with its latest ticks."""
    schedules, count = crud.list_schedules(session=session, offset=offset, limit=limit)
    return SchedulesPublic(count=count, data=_page(session, schedules))


@router.get("/{schedule_id}", response_model=SchedulePublic)
def read_schedule(schedule_id: RowId, session: SessionDep) -> SchedulePublic:
    """A schedule, its next due time and its latest ticks (newest first, at most 20)."""
    return _public(session, _schedule_or_404(session, schedule_id))


@router.patch("/{schedule_id}", response_model=SchedulePublic, dependencies=[TokenDep])
def update_schedule(schedule_id: RowId, schedule_in: ScheduleUpdate, session: SessionDep,
                    settings: SettingsDep) -> SchedulePublic:
    """Change some fields; a new cron, time zone or paused sets the next due time from now."""
    schedule = _schedule_or_404(session, schedule_id)
    if schedule_in.spec is not None:
        _checked_spec(schedule_in.spec, settings)
    schedule = crud.update_schedule(session=session, schedule=schedule,
                                    changes=schedule_in.changes())
    return _public(session, schedule)


@router.post("/{schedule_id}/pause", response_model=SchedulePublic, dependencies=[TokenDep])
def pause_schedule(schedule_id: RowId, session: SessionDep) -> SchedulePublic:
    """Stop firing (no next due time) until resumed."""
    schedule = _schedule_or_404(session, schedule_id)
    schedule = crud.update_schedule(session=session, schedule=schedule,
                                    changes={"paused": True})
    return _public(session, schedule)


@router.post("/{schedule_id}/resume", response_model=SchedulePublic, dependencies=[TokenDep])
def resume_schedule(schedule_id: RowId, session: SessionDep) -> SchedulePublic:
    """Fire again from the next due time after now (ticks missed while paused are not run)."""
    schedule = _schedule_or_404(session, schedule_id)
    schedule = crud.update_schedule(session=session, schedule=schedule,
                                    changes={"paused": False})
    return _public(session, schedule)


@router.delete("/{schedule_id}", status_code=status.HTTP_204_NO_CONTENT,
               response_class=Response, dependencies=[TokenDep])
def delete_schedule(schedule_id: RowId, session: SessionDep) -> Response:
    """Delete the schedule and its tick records; the sweeps it created stay (schedule_id
    null)."""
    crud.delete_schedule(session=session, schedule=_schedule_or_404(session, schedule_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)
