"""One trial with its result and its environment; its profile trace; profiling its point
again."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import FileResponse

from service.api.deps import SchedulerDep, SessionDep, SettingsDep, TokenDep
from service.api.params import RowId
from service.db import crud
from service.db.environments import get_environment
from service.db.models import Result
from service.schemas.sweeps import SweepCreated
from service.schemas.trials import TrialDetailPublic
from service.runs.profile_trial import NotProfilable, queue_profile_sweep
from workers.profile_store import artifact_path
from workers.profiling import SUFFIX

router = APIRouter(prefix="/trials", tags=["trials"])


@router.get("/{trial_id}", response_model=TrialDetailPublic)
def read_trial(trial_id: RowId, session: SessionDep) -> TrialDetailPublic:
    """One trial with its result, its one-chip baseline (ids and speed-up), every attempt
    it took (`attempt_history`: a retried trial keeps the reasons of the attempts that died)
    and the environment it measured in (`environment`, null before it ran)."""
    row = crud.get_trial(session=session, trial_id=trial_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} not found")
    trial = TrialDetailPublic.from_row(row)
    if trial.environment_id is not None:
        environment = get_environment(session=session, environment_id=trial.environment_id)
        trial.environment = None if environment is None else environment.body
    return trial


@router.get("/{trial_id}/profile", response_class=FileResponse,
            responses={200: {"content": {"application/gzip": {}},
                             "description": "the trace file: a gzipped Chrome / Perfetto trace "
                             "(torch) or a tar.gz of a TensorBoard / XProf profile run (JAX)"},
                       404: {"description": "no such trial, or it has no stored trace"}})
def download_profile(trial_id: RowId, session: SessionDep,
                     settings: SettingsDep) -> FileResponse:
    """The trace of the trial's profiled step (a sweep with `profile: true`)."""
    result = session.get(Result, trial_id)
    if result is None or result.profile_format is None:
        what = "not found" if crud.get_trial(session=session, trial_id=trial_id) is None else (
            "has no profile: it ran without profile: true (POST /api/trials/"
            f"{trial_id}/profile queues a sweep that profiles its point)")
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} {what}")
    if result.profile_path is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} has no trace: "
                            f"{result.profile_error or 'the profiler failed'}")
    path = artifact_path(settings.artifact_dir, result.profile_path)
    if not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"trial {trial_id}'s trace {result.profile_path} is not in the "
                            f"artifact directory {settings.artifact_dir}: removed by the profile "
                            "retention limit (GDN_SWEEP_PROFILE_MAX_BYTES / _MAX_AGE_DAYS), or "
                            "GDN_SWEEP_ARTIFACT_DIR does not name the directory the sweep's "
                            "driver wrote to")
    return FileResponse(path, media_type="application/gzip",
                        filename=f"trial-{trial_id}{SUFFIX.get(result.profile_format, '')}")


@router.post("/{trial_id}/profile", status_code=status.HTTP_201_CREATED,
             response_model=SweepCreated, dependencies=[TokenDep],
             responses={404: {"description": "no such trial"},
                        409: {"description": "a plan or skipped trial: no step to profile"}})
def profile_trial(trial_id: RowId, session: SessionDep,
                  scheduler: SchedulerDep) -> SweepCreated:
    """Queue a sweep of exactly this trial's point with `profile: true`: its one trial runs the
    same step (new measurements beside the old ones, which stay as they were) and one extra
    profiled step. Answers the new sweep."""
    try:
        sweep = queue_profile_sweep(session=session, trial_id=trial_id)
    except NotProfilable as err:
        session.rollback()
        raise HTTPException(status.HTTP_409_CONFLICT, str(err)) from err
    if sweep is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} not found")
    if scheduler is not None:
        scheduler.wake()
    return SweepCreated.from_row(sweep)
