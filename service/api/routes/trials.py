"""One trial with its result and its environment."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from service.api.deps import SessionDep
from service.api.params import RowId
from service.db import crud
from service.db.environments import get_environment
from service.db.schemas import TrialDetailPublic

router = APIRouter(prefix="/trials", tags=["trials"])


@router.get("/{trial_id}", response_model=TrialDetailPublic)
def read_trial(trial_id: RowId, session: SessionDep) -> TrialDetailPublic:
    """One trial with its result, its one-chip baseline (ids and speed-up), every attempt
    it took (`attempt_history`: a retried trial keeps the reasons of the attempts that died)
    and the environment it measured in (`environment`, null before it ran)."""
    trial = crud.get_trial(session=session, trial_id=trial_id)
    if trial is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} not found")
    environment = (None if trial.environment_id is None else
                   get_environment(session=session, environment_id=trial.environment_id))
    return TrialDetailPublic(**trial.model_dump(),
                             environment=None if environment is None else environment.body)
