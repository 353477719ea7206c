"""What the service shows of profile retention (issue 37 item 3), on SQLite and PostgreSQL:
`/metrics` reports the bytes and traces held under the artifact directory, read from disk at
each scrape; a skipped profile is shown as skipped with its reason beside the trial's stored
measurements, and its download is a 404 that says why."""

from __future__ import annotations

import datetime as dt
import os

from fastapi.testclient import TestClient
from sqlalchemy import select

from service.db import crud
from service.db.models import Trial
from service.main import create_app
from service.runs.db_sink import DatabaseSink
from workers.grid import expand_trials
from workers.profile_store import ProfileRetention, store_profile
from workers.profiling import CHROME_TRACE, CapturedProfile
from workers.result import TrialMetrics, TrialResult
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP, api_settings
from .test_metrics import scrape


def test_metrics_show_the_profile_bytes_held(db_url, tmp_path):
    artifacts = tmp_path / "artifacts"
    settings = api_settings(db_url, spool_dir=str(tmp_path / "spool"),
                            artifact_dir=str(artifacts), profile_max_bytes=10 ** 6)
    with TestClient(create_app(settings)) as client:
        empty = scrape(client)
        assert (empty[("gdn_sweep_profile_bytes", ())], empty[("gdn_sweep_profile_traces", ())],
                empty[("gdn_sweep_profile_max_bytes", ())]) == (0, 0, 10 ** 6)
        for size in (1000, 2500):
            store_profile(CapturedProfile(format=CHROME_TRACE, data=os.urandom(size)),
                          artifact_dir=str(artifacts), trial_key="t",
                          retention=settings.profile_retention())
        held = scrape(client)
    assert (held[("gdn_sweep_profile_bytes", ())], held[("gdn_sweep_profile_traces", ())]) == (
        3500, 2)


def test_a_skipped_profile_is_shown_with_its_reason_and_the_result_stands(
        session_factory, db_url, tmp_path):
    spec = SweepSpec.model_validate({**TINY_SWEEP, "chips": [2], "profile": True})
    with session_factory() as session:
        sweep_id = crud.create_sweep(session=session, sweep_create=spec).id
        (trial_id,) = session.scalars(select(Trial.id).where(Trial.sweep_id == sweep_id))
    full = ProfileRetention(min_free_bytes=10 ** 18)  # more than any disk has free
    profile = store_profile(CapturedProfile(format=CHROME_TRACE, data=b"x" * 100,
                                            summary={"wall_s": 0.5}),
                            artifact_dir=str(tmp_path / "artifacts"), trial_key="t",
                            retention=full)
    sink = DatabaseSink(session_factory, sweep_id, spool=None)
    at = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    (trial,) = expand_trials(spec)
    sink.trial_finished(TrialResult(trial=trial, status="succeeded", attempts=1,
                                    started_at=at, finished_at=at, profile=profile,
                                    metrics=TrialMetrics(step_time_s=0.01,
                                                         measured_steps=trial.steps)))
    assert sink.close(timeout_s=30)
    settings = api_settings(db_url, spool_dir=str(tmp_path / "spool"),
                            artifact_dir=str(tmp_path / "artifacts"))
    with TestClient(create_app(settings)) as client:
        shown = client.get(f"/api/trials/{trial_id}").json()
        download = client.get(f"/api/trials/{trial_id}/profile")
    assert shown["status"] == "succeeded" and shown["step_time_s"] == 0.01
    assert shown["profile"]["status"] == "skipped" and shown["profile"]["url"] is None
    assert shown["profile"]["error"].startswith("profile skipped: the artifact directory")
    assert download.status_code == 404 and "profile skipped" in download.json()["detail"]
