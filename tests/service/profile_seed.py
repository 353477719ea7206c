"""A profiled trial in a test database, its trace real: one torch step run under
torch.profiler here (workers.profiling), stored under an artifact directory, its result
written by the database sink the scheduler uses."""

from __future__ import annotations

import datetime as dt
import pathlib
import tempfile

from sqlalchemy import select

from service.db import crud
from service.db.models import Trial
from service.runs.db_sink import DatabaseSink
from workers.grid import expand_trials
from workers.profile_store import store_profile
from workers.profiling import torch_profile
from workers.result import TrialMetrics, TrialResult
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP


def tiny_torch_step() -> None:
    """A training step in miniature: forward, backward, an update."""
    import torch

    torch.manual_seed(0)
    weight = torch.randn(64, 64, requires_grad=True)
    loss = torch.relu(torch.randn(16, 64) @ weight).square().mean()
    loss.backward()
    with torch.no_grad():
        weight -= 0.1 * weight.grad


def seed_profiled_sweep(session_factory, artifact_dir: pathlib.Path) -> dict[str, int]:
    """A finished profile: true sweep of chips 1 and 2: the chips=2 trial has a stored trace,
    the baseline (chips=1) ran without one. Returns {"sweep", "profiled", "plain"} ids."""
    spec = SweepSpec.model_validate({**TINY_SWEEP, "chips": [1, 2], "profile": True})
    with session_factory() as session:
        sweep_id = crud.create_sweep(session=session, sweep_create=spec).id
        ids = {row.chips: row.id for row in session.scalars(
            select(Trial).where(Trial.sweep_id == sweep_id))}
    sink = DatabaseSink(session_factory, sweep_id, spool=None)
    at = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    for trial in expand_trials(spec):
        profile = None
        if trial.chips == 2:
            with tempfile.TemporaryDirectory() as tmp:
                captured = torch_profile(tiny_torch_step, pathlib.Path(tmp))
            profile = store_profile(captured, artifact_dir=str(artifact_dir),
                                    trial_key=trial.key)
        sink.trial_finished(TrialResult(
            trial=trial, status="succeeded", attempts=1, started_at=at, finished_at=at,
            metrics=TrialMetrics(step_time_s=0.01, measured_steps=trial.steps),
            profile=profile))
    assert sink.close(timeout_s=30)
    return {"sweep": sweep_id, "profiled": ids[2], "plain": ids[1]}
