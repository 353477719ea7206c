"""One trial with its result."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from service.api.deps import SessionDep
from service.api.params import RowId
from service.db import crud
from service.db.schemas import TrialPublic

router = APIRouter(prefix="/trials", tags=["trials"])


@router.get("/{trial_id}", response_model=TrialPublic)
def read_trial(trial_id: RowId, session: SessionDep) -> TrialPublic:
    """One trial with its result, its one-chip baseline (ids and speed-up) and every attempt
    it took (`attempt_history`: a retried trial keeps the reasons of the attempts that died)."""
    trial = crud.get_trial(session=session, trial_id=trial_id)
    if trial is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} not found")
    return trial
