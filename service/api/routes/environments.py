"""Environments trials measured in: one by id, and what changed between two trials'."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy.orm import Session

from service.api.deps import SessionDep
from service.api.params import RowId
from service.core.environment_diff import environment_diff
from service.db import crud
from service.db.bounds import DB_INT_MAX
from service.db.environments import get_environment, trial_environment
from service.db.models import Environment
from service.schemas.trials import EnvironmentDiffPublic, EnvironmentPublic, TrialEnvironmentRef

router = APIRouter(prefix="/environments", tags=["environments"])

TrialIdQuery = Annotated[int, Query(ge=1, le=DB_INT_MAX, description="a trial id")]


@router.get("/diff", response_model=EnvironmentDiffPublic)
def diff_environments(a: TrialIdQuery, b: TrialIdQuery,
                      session: SessionDep) -> EnvironmentDiffPublic:
    """The keys whose values differ from trial `a`'s environment to trial `b`'s, each with
    before (a) and after (b). 404 for an unknown trial; 422 for a trial that recorded no
    environment (it has not run, no worker ran it, or it ran before environments were kept)."""
    first, second = _recorded(session, "a", a), _recorded(session, "b", b)
    return EnvironmentDiffPublic(
        a=TrialEnvironmentRef(trial_id=a, environment_id=first.id),
        b=TrialEnvironmentRef(trial_id=b, environment_id=second.id),
        same=first.id == second.id, changes=environment_diff(first.body, second.body))


@router.get("/{environment_id}", response_model=EnvironmentPublic)
def read_environment(environment_id: RowId, session: SessionDep) -> EnvironmentPublic:
    """One stored environment (a trial's `environment_id`)."""
    environment = get_environment(session=session, environment_id=environment_id)
    if environment is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"environment {environment_id} not found")
    return EnvironmentPublic.model_validate(environment, from_attributes=True)


def _recorded(session: Session, name: str, trial_id: int) -> Environment:
    """Trial `trial_id`'s environment (query parameter `name`), else the 404 or 422."""
    has_result, environment = trial_environment(session=session, trial_id=trial_id)
    if environment is not None:
        return environment
    if not has_result and crud.get_trial(session=session, trial_id=trial_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} not found")
    raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, [{
        "type": "no_environment", "loc": ["query", name], "input": trial_id,
        "msg": f"trial {trial_id} recorded no environment (it has not run, no worker process "
               f"ran it, or it ran before environments were kept); give a trial with an "
               f"environment_id"}])
