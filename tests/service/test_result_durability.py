"""A measured result survives the database failing under it, and a database error never
becomes a trial's outcome.

Fast (PostgreSQL): a trigger fails the third result INSERT once with a serialization failure
(SQLSTATE 40001); the sink retries it and the sweep finishes with every trial succeeded.
Slow: a real service on a private PostgreSQL; the server is stopped for 30 s mid-sweep, the
service is SIGKILLed while results wait in its spool, both are started again: every result is
stored exactly once and nothing that had finished runs again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError

from service.core.config import Settings
from service.db import crud
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.errors import clean_error
from service.db.models import Result, Sweep, Trial, utcnow
from service.runs import sweep_run
from service.runs.db_sink import DatabaseSink, record_result, replay_spool
from service.runs.spool import Spool, unstored_results
from service.runs.sweep_queue import Scheduler
from workers.events import TrialStarted
from workers.grid import expand_trials
from workers.result import TrialMetrics, TrialResult
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP
from .private_postgres import PrivatePostgres, free_port
from .test_scheduler import results_per_trial, sweep_status, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]

# A sequence, not a counter row: nextval() is not rolled back with the failed INSERT, so the
# trigger fails exactly one INSERT, not every retry of it.
FAIL_THIRD_RESULT_INSERT = """
CREATE SEQUENCE results_inserts;
CREATE FUNCTION fail_third_result_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('results_inserts') = 3 THEN
        RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_third_result_insert BEFORE INSERT ON results
    FOR EACH ROW EXECUTE FUNCTION fail_third_result_insert();
"""
REMOVE_TRIGGER = """
DROP TRIGGER IF EXISTS fail_third_result_insert ON results;
DROP FUNCTION IF EXISTS fail_third_result_insert();
DROP SEQUENCE IF EXISTS results_inserts;
"""


@pytest.fixture
def pg_failing_third_insert(postgresql_url):
    engine = make_engine(postgresql_url)
    with engine.begin() as conn:
        for table in ("results", "trials", "sweeps"):
            conn.execute(text(f"DELETE FROM {table}"))
        conn.execute(text(REMOVE_TRIGGER))
        conn.execute(text(FAIL_THIRD_RESULT_INSERT))
    try:
        yield postgresql_url, make_session_factory(engine)
    finally:
        with engine.begin() as conn:
            conn.execute(text(REMOVE_TRIGGER))
        engine.dispose()


@pytest.mark.timeout(240)
def test_a_serialization_failure_on_a_result_write_is_retried(local_ray, pg_failing_third_insert,
                                                               tmp_path):
    url, session_factory = pg_failing_third_insert
    spec = SweepSpec.model_validate({**TINY_SWEEP, "name": "blink",
                                     "seq_lens": [32, 48, 64, 80, 96, 128]})
    with session_factory() as s:
        sweep_id = crud.create_sweep(session=s, sweep_create=spec).id
    runs: list[str] = []

    def count_runs(event) -> None:
        if isinstance(event, TrialStarted):
            runs.append(event.trial.key)

    settings = Settings(database_url=url, upgrade_on_start=False, scheduler_poll_s=0.2,
                        max_concurrent_trials=2, cpu_chips=4, spool_dir=str(tmp_path))
    scheduler = Scheduler(session_factory=session_factory, settings=settings,
                          on_event=count_runs)
    scheduler.start()
    try:
        wait_for(lambda: sweep_status(session_factory, sweep_id) in ("finished", "failed"), 180,
                 "the sweep to end")
    finally:
        assert scheduler.stop(60)
    with session_factory() as s:
        sweep = s.get(Sweep, sweep_id)
        statuses = sorted(s.scalars(select(Trial.status).where(Trial.sweep_id == sweep_id)))
        errors = list(s.scalars(select(Result.error)))
        inserts = s.scalar(text("SELECT last_value FROM results_inserts"))
    assert (sweep.status, sweep.error) == ("finished", None)
    assert statuses == ["succeeded"] * 6 and errors == [None] * 6
    assert list(results_per_trial(session_factory, sweep_id).values()) == [1] * 6
    assert inserts == 7, "the trigger should have failed one INSERT, retried once"
    assert sorted(runs) == sorted(t.key for t in expand_trials(spec)), "a trial ran twice"
    assert not list(Spool(tmp_path, url).directory.glob("*.jsonl")), "results left spooled"



def one_trial_sweep(session_factory):
    spec = SweepSpec.model_validate({**TINY_SWEEP, "name": "one"})
    with session_factory() as s:
        sweep_id = crud.create_sweep(session=s, sweep_create=spec).id
    (trial,) = expand_trials(spec)
    return sweep_id, trial


def measured(trial) -> TrialResult:
    at = utcnow()
    return TrialResult(trial=trial, status="succeeded", attempts=1, started_at=at,
                       finished_at=at, metrics=TrialMetrics(tokens_per_s_per_chip=123.0))


@pytest.fixture
def private_one_trial_sweep():
    """A migrated private PostgreSQL holding a one-trial sweep: (server, sessions, id, trial)."""
    with PrivatePostgres() as pg:
        upgrade_database(pg.url)
        engine = make_engine(pg.url)
        session_factory = make_session_factory(engine)
        yield pg, session_factory, *one_trial_sweep(session_factory)
        engine.dispose()


@pytest.mark.timeout(120)
def test_a_result_reported_during_an_outage_is_stored_when_the_database_is_back(
        tmp_path, private_one_trial_sweep):
    pg, session_factory, sweep_id, trial = private_one_trial_sweep
    spool = Spool(tmp_path, pg.url)
    sink = DatabaseSink(session_factory, sweep_id, spool=spool)
    pg.stop()
    began = time.monotonic()
    sink.trial_started(trial)  # neither raises into the driver
    sink.trial_finished(result := measured(trial))
    assert time.monotonic() - began < 5, "the driver waited for the database"
    (path,) = spool.directory.glob("*.jsonl")
    assert [r for _, r in unstored_results(path.read_text()).values()] == [result]
    assert not sink.wait_drained(1.0)
    pg.start()
    assert sink.wait_drained(60)
    with session_factory() as s:
        row = s.scalars(select(Result)).one()
        assert (row.status, row.tokens_per_s_per_chip, row.finished_at) == (
            "succeeded", 123.0, result.finished_at)
        assert s.scalar(select(Trial.status)) == "succeeded"
    assert not spool.directory.exists()  # stored: the file and its directory are gone
    sink.close()


@pytest.mark.slow  # an outage run; by default: a result reported during an outage is stored once it is back
@pytest.mark.timeout(120)
def test_finishing_a_sweep_waits_out_an_outage(private_one_trial_sweep):
    pg, session_factory, sweep_id, trial = private_one_trial_sweep
    record_result(session_factory=session_factory, sweep_id=sweep_id, result=measured(trial))
    pg.stop()
    stop = threading.Event()
    with session_factory() as s:  # a scheduler stopping meanwhile leaves it to resume
        stop.set()
        assert sweep_run.finish(session=s, sweep_id=sweep_id, status="finished",
                                stop_event=stop) is False
    ended = []
    with session_factory() as s:
        finishing = threading.Thread(target=lambda: ended.append(sweep_run.finish(
            session=s, sweep_id=sweep_id, status="finished")))
        finishing.start()
        time.sleep(2)
        assert finishing.is_alive() and not ended
        pg.start()
        finishing.join(60)
    assert ended == [True]
    with session_factory() as s:
        assert s.get(Sweep, sweep_id).status == "finished"
        assert s.scalar(select(Result.status)) == "succeeded"


LEAVE_A_SPOOLED_RESULT = """
import sys
from service.runs.spool import Spool
from workers.result import TrialMetrics, TrialResult
journal = Spool(sys.argv[1], sys.argv[2]).journal(int(sys.argv[3]))
journal.append(TrialResult.model_validate_json(sys.stdin.read()))
print("spooled", flush=True)
sys.stdin.close()
import time; time.sleep(60)
"""


@pytest.mark.timeout(120)
def test_a_killed_processs_spool_is_replayed_once(session_factory, db_url, tmp_path):
    sweep_id, trial = one_trial_sweep(session_factory)
    result = measured(trial)
    writer = subprocess.Popen([sys.executable, "-c", LEAVE_A_SPOOLED_RESULT, str(tmp_path),
                               db_url, str(sweep_id)], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    writer.stdin.write(result.model_dump_json())
    writer.stdin.close()
    assert writer.stdout.readline().strip() == "spooled"
    spool = Spool(tmp_path, db_url)
    sink = DatabaseSink(session_factory, sweep_id, spool=spool)
    try:
        assert sink.finished_keys() == set()  # a live writer's file is its own
        assert len(list(spool.directory.glob("*.jsonl"))) == 1
        writer.kill()
        writer.wait()
        assert sink.finished_keys() == {trial.key}  # replayed first, so it is not re-run
        assert replay_spool(spool, session_factory) == 0
    finally:
        writer.kill()
        writer.wait()
    with session_factory() as s:
        row = s.scalars(select(Result)).one()
        assert (row.status, row.tokens_per_s_per_chip) == ("succeeded", 123.0)
        # the measurement as it was taken (SQLite hands UTC back without its zone)
        assert row.started_at.replace(tzinfo=None) == result.started_at.replace(tzinfo=None)
    assert not list(spool.directory.glob("*"))


def test_a_database_error_is_stored_without_its_sql(session_factory):
    sweep_id, _ = one_trial_sweep(session_factory)
    with session_factory() as s:
        with pytest.raises(DBAPIError) as raised:
            s.execute(text("SELECT secret_column FROM no_such_table WHERE x = :x"),
                      {"x": "a-bound-value"})
        s.rollback()
        assert "[SQL:" in str(raised.value)  # what used to be stored
        cleaned = clean_error(raised.value)
        assert cleaned.startswith(type(raised.value.orig).__name__)
        sweep_run.finish(session=s, sweep_id=sweep_id, status="failed",
                         error=f"sweep driver failed: {raised.value}")
        sweep = s.get(Sweep, sweep_id)
        result_error = s.scalar(select(Result.error))
    for stored in (cleaned, sweep.error, result_error):
        assert "no_such_table" in stored
        assert "SELECT" not in stored and "a-bound-value" not in stored, stored


class Service:
    """`gdn-sweep serve` in a process of its own (its own session, so its Ray processes can be
    found), its log in a file."""

    def __init__(self, env: dict, log_path: Path) -> None:
        self.port, self.log_path = free_port(), log_path
        with log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)],
                env={**env, "GDN_SWEEP_LOG_LEVEL": "info"}, cwd=REPO_ROOT, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def wait_healthy(self, timeout_s: float = 180) -> None:
        def healthy() -> bool:
            assert self.process.poll() is None, f"the service exited:\n{self.log()}"
            try:
                return self.call("GET", "/api/health") is not None
            except OSError:
                return False

        wait_for(healthy, timeout_s, "the service to answer /api/health")

    def log(self) -> str:
        return self.log_path.read_text()

    def started_trials(self) -> list[str]:
        """Keys of the trials this service ran (the sink logs each start)."""
        return re.findall(r"sweep \d+: (\S+) started\b", self.log())


def session_processes(leader_pid: int) -> list[int]:
    """Live processes of the session `leader_pid` started (its Ray, its trial workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == leader_pid and sweep_run.process_start(
                        int(entry.name)) is not None:
                    found.append(int(entry.name))
            except OSError:
                pass  # exited meanwhile
    return found


def spooled(spool_dir: Path) -> dict[str, TrialResult]:
    results = {}
    for path in spool_dir.rglob("*.jsonl"):
        for _sweep_id, result in unstored_results(path.read_text(), path).values():
            results[result.trial.key] = result
    return results


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_results_survive_an_outage_and_a_killed_service(tmp_path):
    spool_dir = tmp_path / "spool"
    body = {**TINY_SWEEP, "name": "outage", "steps": 30,
            "seq_lens": [64, 128, 192, 256, 320, 384, 448, 512]}
    keys = sorted(t.key for t in expand_trials(SweepSpec.model_validate(body)))
    with PrivatePostgres() as pg:
        env = {**os.environ, "DATABASE_URL": pg.url, "GDN_SWEEP_SPOOL_DIR": str(spool_dir),
               "GDN_SWEEP_SCHEDULER_POLL_S": "0.5", "GDN_SWEEP_CPU_CHIPS": "2",
               "GDN_SWEEP_MAX_CONCURRENT_TRIALS": "1",
               # far longer than the test: the restarted service must resume its dead
               # predecessor's sweep because that process is gone, not because of the lease
               "GDN_SWEEP_LEASE_S": "3600"}
        engine = make_engine(pg.url)
        session_factory = make_session_factory(engine)
        first = Service(env, tmp_path / "first.log")
        second = None
        try:
            first.wait_healthy()
            sweep_id = first.call("POST", "/api/sweeps", body)["id"]
            stored_first = wait_for(lambda: stored_keys(session_factory), 180,
                                    "the first result to be stored")
            engine.dispose()
            pg.stop()
            down_at = time.monotonic()
            wait_for(lambda: len(spooled(spool_dir)) >= 3, 25,
                     "three results to wait in the spool while the database is down")
            killed_at = utcnow()
            os.kill(first.process.pid, signal.SIGKILL)
            first.process.wait(30)
            in_spool = spooled(spool_dir)  # what the killed service had not stored
            assert len(in_spool) >= 3 and not set(in_spool) & stored_first
            time.sleep(max(0.0, 30 - (time.monotonic() - down_at)))
            pg.start()

            second = Service(env, tmp_path / "second.log")
            second.wait_healthy()
            wait_for(lambda: second.call("GET", f"/api/sweeps/{sweep_id}")["status"]
                     in ("finished", "failed", "cancelled"), 300, "the sweep to end")
            sweep = second.call("GET", f"/api/sweeps/{sweep_id}")
            second.process.send_signal(signal.SIGINT)  # a clean stop: Ray shut down
            assert second.process.wait(90) in (0, 130), second.log()
            with session_factory() as s:
                rows = {row.key: row for row in s.execute(
                    select(Trial.key, Result.status, Result.attempts, Result.started_at,
                           Result.finished_at).join(Result, Result.trial_id == Trial.id)
                    .where(Trial.sweep_id == sweep_id))}
                results = s.scalar(select(func.count()).select_from(Result))
        finally:
            for service in (first, second):
                if service is not None and service.process.poll() is None:
                    os.killpg(service.process.pid, signal.SIGKILL)
            engine.dispose()
    assert (sweep["status"], sweep["error"]) == ("finished", None), second.log()
    assert sorted(rows) == keys and results == len(keys)  # one result per trial
    assert {(r.status, r.attempts) for r in rows.values()} == {("succeeded", 1)}
    for key, result in in_spool.items():  # the spooled measurements, as measured
        assert (rows[key].started_at, rows[key].finished_at) == (
            result.started_at, result.finished_at), key
        assert f"replayed the result of {key}" in second.log()
    ran_first, ran_again = first.started_trials(), second.started_trials()
    assert len(ran_first) == len(set(ran_first)) and len(ran_again) == len(set(ran_again))
    finished_before_kill = {key for key, row in rows.items() if row.finished_at < killed_at}
    assert stored_first | set(in_spool) <= finished_before_kill
    # nothing that had finished ran again; everything else ran once after the restart; the
    # only trial run twice is the one the kill cut short (one trial runs at a time)
    assert sorted(ran_again) == sorted(set(keys) - finished_before_kill), (ran_first, ran_again)
    assert finished_before_kill <= set(ran_first)
    assert len(set(ran_first) - finished_before_kill) <= 1, ran_first
    assert not list(spool_dir.rglob("*.jsonl"))
    wait_for(lambda: not session_processes(first.process.pid)
             and not session_processes(second.process.pid), 60,
             "the services' Ray processes to exit")


def stored_keys(session_factory) -> set[str]:
    with session_factory() as s:
        return set(s.scalars(select(Trial.key).join(Result, Result.trial_id == Trial.id)
                             .where(Trial.status == "succeeded")))
