"""Environments (issue 25): a real trial on the local Ray records what it ran with, stored
once per distinct environment (also under concurrent writers, on SQLite and PostgreSQL), read
back on a trial and diffed between two trials over the API."""

from __future__ import annotations

import importlib.metadata
import platform
import threading

import pytest
from sqlalchemy import func, select

from service.core.environment_diff import EnvironmentChange, environment_diff
from service.db import crud
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.models import Environment, Result
from service.runs.db_sink import DatabaseSink, record_result
from service.runs.sweep_queue import sweep_source
from workers.driver import run_trials
from workers.grid import expand_trials
from workers.options import DriverOptions
from workers.result import TrialResult
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP


def _environment(**packages) -> dict:
    return {"python": "3.11.7", "packages": {"torch": "2.13.0", "jax": "0.10.2", **packages},
            "project": {"version": "0.1.0", "git_commit": "abc", "git_dirty": False},
            "runtime": {"cuda": None, "cudnn": None, "nvidia_driver": None, "libtpu": None},
            "accelerator": {"kind": "cpu", "type": "cpu", "device_name": "x", "host_count": 1},
            "source": {"kind": "api"}}


def _sweep(session_factory, **changes) -> tuple[int, list]:
    spec = SweepSpec.model_validate({**TINY_SWEEP, **changes})
    with session_factory() as session:
        sweep_id = crud.create_sweep(session=session, sweep_create=spec).id
    return sweep_id, expand_trials(spec)


def _trial_ids(session_factory, sweep_id: int) -> dict[str, int]:
    with session_factory() as session:
        trials, _ = crud.list_trials(session=session, sweep_id=sweep_id)
    return {t.columns["key"]: t.columns["id"] for t in trials}


@pytest.fixture
def sqlite_factory(tmp_path):
    """A migrated SQLite database of this test's own."""
    url = f"sqlite:///{tmp_path / 'environments.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.mark.timeout(120)
def test_a_real_trial_records_its_environment_once_per_sweep(local_ray, sqlite_factory):
    sweep_id, trials = _sweep(sqlite_factory, name="env", seq_lens=[64, 128])
    run_trials(trials, DatabaseSink(sqlite_factory, sweep_id, spool=None), name="env",
               options=DriverOptions(source=sweep_source(None)))
    with sqlite_factory() as session:
        rows = session.execute(select(Result.status, Result.environment_id)
                               .where(Result.sweep_id == sweep_id)).all()
        assert [status for status, _ in rows] == ["succeeded", "succeeded"]
        assert len({env for _, env in rows}) == 1  # two trials, one environments row
        assert session.scalar(select(func.count()).select_from(Environment)) == 1
        body = session.get(Environment, rows[0][1]).body
    assert body["packages"]["torch"] == importlib.metadata.version("torch")
    assert body["packages"]["jax"] == importlib.metadata.version("jax")
    assert body["python"] == platform.python_version()
    assert body["runtime"] == {"cuda": None, "cudnn": None, "nvidia_driver": None,
                               "libtpu": None}  # a CPU trial: no device runtime, not a guess
    assert body["accelerator"]["host_count"] == 1 and body["source"] == {"kind": "api"}


def _result(trial, environment: dict | None) -> TrialResult:
    return TrialResult(trial=trial, status="succeeded", attempts=1, environment=environment)


@pytest.mark.timeout(60)
def test_concurrent_writers_of_one_environment_store_one_row(session_factory):
    sweep_id, trials = _sweep(session_factory, name="race", seq_lens=[64, 128, 256, 512],
                              chips=[1, 2])
    assert len(trials) >= 6
    start, errors = threading.Barrier(len(trials)), []

    def write(trial) -> None:
        try:
            start.wait()
            assert record_result(session_factory=session_factory, sweep_id=sweep_id,
                                 result=_result(trial, _environment()))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(t,)) for t in trials]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    with session_factory() as session:
        ids = session.scalars(select(Result.environment_id)
                              .where(Result.sweep_id == sweep_id)).all()
        assert len(ids) == len(trials) and None not in ids and len(set(ids)) == 1
        assert session.scalar(select(func.count()).select_from(Environment)) == 1


def test_trial_and_diff_over_the_api(client, session_factory):
    sweep_id, trials = _sweep(session_factory, name="diff", seq_lens=[64, 128, 256, 512])
    before, after = _environment(), _environment(torch="2.14.0")
    after["runtime"]["cuda"] = "12.8"
    for trial, env in zip(trials, (before, after, before, None)):
        record_result(session_factory=session_factory, sweep_id=sweep_id,
                      result=_result(trial, env))
    ids = _trial_ids(session_factory, sweep_id)
    a, b, c, none = (ids[t.key] for t in trials)

    detail = client.get(f"/api/trials/{b}").json()
    assert detail["environment"] == after and detail["environment_id"] is not None
    listed = client.get(f"/api/sweeps/{sweep_id}/trials").json()["data"]
    assert {t["id"]: t["environment_id"] for t in listed}[a] != detail["environment_id"]
    assert client.get(f"/api/trials/{none}").json()["environment"] is None
    stored = client.get(f"/api/environments/{detail['environment_id']}").json()
    assert stored["body"] == after and len(stored["content_hash"]) == 64

    diff = client.get("/api/environments/diff", params={"a": a, "b": b})
    assert diff.status_code == 200, diff.text
    assert diff.json()["same"] is False
    assert diff.json()["changes"] == [
        {"key": "packages.torch", "before": "2.13.0", "after": "2.14.0", "present": [True, True]},
        {"key": "runtime.cuda", "before": None, "after": "12.8", "present": [True, True]}]
    same = client.get("/api/environments/diff", params={"a": a, "b": c}).json()
    assert same["same"] is True and same["changes"] == []

    missing = client.get("/api/environments/diff", params={"a": a, "b": none})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["query", "b"]
    assert f"trial {none} recorded no environment" in missing.json()["detail"][0]["msg"]
    unknown = client.get("/api/environments/diff", params={"a": 2**31 - 1, "b": a})
    assert unknown.status_code == 404 and str(2**31 - 1) in unknown.json()["detail"]
    for bad in ({"a": 0, "b": a}, {"a": "x", "b": a}, {"a": a}):
        answer = client.get("/api/environments/diff", params=bad)
        assert answer.status_code == 422, (bad, answer.text)
    assert client.get(f"/api/environments/{2**31 - 1}").status_code == 404


def test_environment_diff_compares_leaves_and_tells_absent_from_null():
    before = {"packages": {"torch": "2.13.0", "fla-core": None}, "runtime": {"cuda": None}}
    after = {"packages": {"torch": "2.13.0"}, "runtime": {"cuda": "12.8"}, "python": "3.12"}
    assert environment_diff(before, before) == []
    assert environment_diff(before, after) == [
        EnvironmentChange(key="packages.fla-core", before=None, after=None,
                          present=(True, False)),
        EnvironmentChange(key="python", before=None, after="3.12", present=(False, True)),
        EnvironmentChange(key="runtime.cuda", before=None, after="12.8")]
    # a section replaced by a plain value is a change of that key and of each leaf it held
    assert [c.key for c in environment_diff({"source": {"kind": "api"}},
                                            {"source": "api"})] == ["source", "source.kind"]


def test_the_service_names_a_scheduled_sweeps_schedule_and_others_the_api():
    assert sweep_source(7).describe() == {"kind": "schedule", "schedule_id": 7}
    assert sweep_source(None).describe()["kind"] in ("api", "ray_job")  # ray_job: under a job
