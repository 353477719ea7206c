"""The scheduler end to end: the real workers driver on a local Ray, SQLite.

Restart: a scheduler stopped mid-sweep leaves one trial succeeded, one running and the rest
pending, and releases its claim; a new scheduler on the same database finishes the sweep and
every trial ends with exactly one result row. Cancel: through the API, the running trial stops
and every other trial is recorded cancelled. Retry: a trial whose rank is killed succeeds on
its second attempt, and the database and API keep the first attempt's reason.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from service.core.config import Settings
from service.db import crud
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.models import Result, Sweep, Trial
from service.main import create_app
from service.runs.db_sink import DatabaseSink
from service.runs.sweep_queue import Scheduler
from workers.driver import run_trials
from workers.events import TrialFinished, TrialStarted
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP, api_settings


@pytest.fixture
def sqlite_db(tmp_path):
    url = f"sqlite:///{tmp_path / 'scheduler.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    yield url, make_session_factory(engine)
    engine.dispose()


def scheduler_settings(url: str) -> Settings:
    return Settings(database_url=url, upgrade_on_start=False, scheduler_poll_s=0.2,
                    max_concurrent_trials=2, cpu_chips=4)


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def trial_statuses(session_factory, sweep_id: int) -> dict[str, str]:
    with session_factory() as s:
        return dict(s.execute(select(Trial.key, Trial.status)
                              .where(Trial.sweep_id == sweep_id)).all())


def results_per_trial(session_factory, sweep_id: int) -> dict[int, int]:
    with session_factory() as s:
        counts = dict(s.execute(select(Trial.id, func.count(Result.trial_id))
                                .outerjoin(Result, Result.trial_id == Trial.id)
                                .where(Trial.sweep_id == sweep_id).group_by(Trial.id)).all())
    return counts


def sweep_status(session_factory, sweep_id: int) -> str:
    with session_factory() as s:
        return s.scalar(select(Sweep.status).where(Sweep.id == sweep_id))


@pytest.mark.timeout(60)
def test_a_sweep_whose_rows_cannot_be_run_fails_and_the_scheduler_goes_on(sqlite_db, tmp_path):
    """The driver runs the trial rows; a row whose columns no longer make its key (written by
    another version) fails its sweep with the reason, instead of the scheduler's loop."""
    url, session_factory = sqlite_db
    with session_factory() as s:
        sweep_id = crud.create_sweep(session=s, sweep_create=SweepSpec(**TINY_SWEEP)).id
        s.execute(update(Trial).where(Trial.sweep_id == sweep_id).values(key="renamed"))
        s.commit()
    settings = scheduler_settings(url).model_copy(update={"spool_dir": str(tmp_path)})
    Scheduler(session_factory=session_factory, settings=settings)._run(sweep_id)
    with session_factory() as s:
        sweep = s.get(Sweep, sweep_id)
        assert sweep.status == "failed"
        assert "its trials cannot be run: trial" in sweep.error and "'renamed'" in sweep.error
    assert trial_statuses(session_factory, sweep_id) == {"renamed": "failed"}


@pytest.mark.slow  # a fault run (a killed scheduler); resume by default: workers/test_driver resume, takeover: test_runner_identity
@pytest.mark.timeout(240)
def test_restart_mid_sweep_resumes_and_no_trial_gets_two_results(local_ray, sqlite_db):
    url, session_factory = sqlite_db
    spec = SweepSpec.model_validate({**TINY_SWEEP, "name": "restart",
                                     "seq_lens": [64, 128, 192, 256]})
    with session_factory() as s:
        sweep_id = crud.create_sweep(session=s, sweep_create=spec).id
    stopped = threading.Event()

    def stop_after_first_result(event) -> None:
        if isinstance(event, TrialFinished) and not stopped.is_set():
            stopped.set()
            first.request_stop()  # "the service dies" right after one result is stored

    first = Scheduler(session_factory=session_factory, settings=scheduler_settings(url),
                      on_event=stop_after_first_result)
    first.start()
    assert first.join(150), "first scheduler did not stop"
    assert stopped.is_set()
    before = trial_statuses(session_factory, sweep_id)
    assert sorted(before.values()) == ["pending", "pending", "running", "succeeded"], before
    assert sweep_status(session_factory, sweep_id) == "running"
    with session_factory() as s:
        kept = s.execute(select(Result.trial_id, Result.finished_at)).one()
        # a clean stop gives the claim up, so the next scheduler resumes at once
        assert s.execute(select(Sweep.runner, Sweep.heartbeat_at)).one() == (None, None)

    second = Scheduler(session_factory=session_factory, settings=scheduler_settings(url))
    second.start()
    try:
        wait_for(lambda: sweep_status(session_factory, sweep_id) == "finished", 150,
                 "the resumed sweep to finish")
    finally:
        assert second.stop(60)
    assert set(trial_statuses(session_factory, sweep_id).values()) == {"succeeded"}
    assert list(results_per_trial(session_factory, sweep_id).values()) == [1, 1, 1, 1]
    with session_factory() as s:
        assert s.get(Result, kept.trial_id).finished_at == kept.finished_at  # not re-run
        assert s.scalar(select(func.count()).select_from(Result)) == 4


@pytest.mark.timeout(180)
def test_cancel_stops_the_running_trial_and_cancels_the_rest(local_ray, sqlite_db):
    url, session_factory = sqlite_db
    body = {**TINY_SWEEP, "name": "cancel me", "seq_lens": [1024, 2048, 4096], "steps": 2000,
            "trial_timeout_s": 120}
    settings = scheduler_settings(url).model_copy(update={"max_concurrent_trials": 1})
    with TestClient(create_app(settings)) as client:
        sweep_id = client.post("/api/sweeps", json=body).json()["id"]
        wait_for(lambda: "running" in trial_statuses(session_factory, sweep_id).values(), 60,
                 "a trial to start")
        time.sleep(1.0)
        cancelled_at = time.monotonic()
        r = client.post(f"/api/sweeps/{sweep_id}/cancel")
        assert r.status_code == 202 and r.json()["status"] == "cancelling"
        wait_for(lambda: client.get(f"/api/sweeps/{sweep_id}").json()["status"] == "cancelled",
                 60, "the sweep to be cancelled")
        took = time.monotonic() - cancelled_at
        trials = client.get(f"/api/sweeps/{sweep_id}/trials").json()["data"]
    assert [t["status"] for t in trials] == ["cancelled"] * 3
    assert any("while the trial ran" in (t["error"] or "") for t in trials), trials
    assert list(results_per_trial(session_factory, sweep_id).values()) == [1, 1, 1]
    assert took < 30, f"cancel took {took:.1f} s"


@pytest.mark.timeout(180)
def test_run_a_sweep_file_into_the_database_with_progress(local_ray, sqlite_db, tmp_path,
                                                          capsys):
    from service.cli.main import main

    url, session_factory = sqlite_db
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump({**TINY_SWEEP, "name": "from yaml",
                                          "seq_lens": [64, 128]}))
    assert main(["run", str(sweep_file), "--db", url, "--max-concurrent-trials", "1"]) == 0
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert "2/2" in printed and "sweep 1: finished (succeeded 2)" in printed, printed
    with session_factory() as s:
        sweep = s.get(Sweep, 1)
        assert sweep.status == "finished" and sweep.runner.startswith("cli@")
    assert list(results_per_trial(session_factory, 1).values()) == [1, 1]


@pytest.mark.slow  # a fault run; by default the retry: workers/test_trial_failures, its history through the API: test_api_results
@pytest.mark.timeout(240)
def test_a_retried_trial_keeps_the_first_attempts_reason(local_ray, sqlite_db):
    url, session_factory = sqlite_db
    spec = SweepSpec.model_validate({**TINY_SWEEP, "name": "retried", "chips": [2],
                                     "steps": 20})
    with session_factory() as s:
        sweep_id = crud.create_sweep(session=s, sweep_create=spec).id
        trials = crud.sweep_trials(session=s, sweep_id=sweep_id)

    def kill_a_rank_of_the_first_attempt(event) -> None:
        if isinstance(event, TrialStarted) and event.attempt == 1:
            os.kill(event.workers[1].pid, signal.SIGKILL)

    (result,) = run_trials(trials, DatabaseSink(session_factory, sweep_id), name=spec.name,
                           on_event=kill_a_rank_of_the_first_attempt)
    assert result.status == "succeeded" and result.attempts == 2
    with TestClient(create_app(api_settings(url))) as client:
        (trial,) = client.get(f"/api/sweeps/{sweep_id}/trials").json()["data"]
        one = client.get(f"/api/trials/{trial['id']}").json()
        (row,) = client.get("/api/results", params={"sweep_id": sweep_id}).json()["data"]
    assert trial["status"] == "succeeded" and trial["error"] is None and trial["attempts"] == 2
    first, second = trial["attempt_history"]
    assert (first["attempt"], first["status"]) == (1, "failed")
    assert "died" in first["reason"].lower() and first["hosts"]
    assert (second["attempt"], second["status"], second["reason"]) == (2, "succeeded", None)
    assert first["finished_at"] <= second["started_at"]
    assert one["attempt_history"] == row["attempt_history"] == trial["attempt_history"]
