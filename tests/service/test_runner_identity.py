"""A sweep's runner is one process (`<id>@<host>:<pid>:<start>`), whatever its configured id:
a sweep whose runner is alive and renewing is never taken over, a sweep whose runner process
is gone from this host is taken at once, one whose heartbeat went stale after the lease."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import select as fd_select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select, update

from service.db import crud
from service.db.models import Sweep, Trial, utcnow
from service.runs import sweep_run
from workers.grid import expand_trials
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP

REPO_ROOT = Path(__file__).resolve().parents[2]


def identity_of(process: subprocess.Popen, name: str = "service") -> str:
    """The runner string `process` would use (its pid and start time on this host)."""
    mine = sweep_run.runner_identity(name)
    host = re.search(r"@([^@:]+):", mine)[1]
    return f"{name}@{host}:{process.pid}:{sweep_run.process_start(process.pid)}"


def running_sweep(session_factory, *, runner: str | None, heartbeat_age_s: float | None = 0):
    spec = SweepSpec.model_validate({**TINY_SWEEP, "seq_lens": [64, 128]})
    with session_factory() as s:
        sweep_id = crud.create_sweep(session=s, sweep_create=spec).id
        s.execute(update(Sweep).where(Sweep.id == sweep_id).values(
            status="running", runner=runner, heartbeat_at=None if heartbeat_age_s is None
            else utcnow() - dt.timedelta(seconds=heartbeat_age_s)))
        s.execute(update(Trial).where(Trial.sweep_id == sweep_id).values(status="running"))
        s.commit()
    return sweep_id


def takes_over(session_factory, sweep_id: int, lease_s: float = 60) -> bool:
    me = sweep_run.runner_identity("service")
    with session_factory() as s:
        found = sweep_run.next_sweep_id(session=s, lease_s=lease_s)
        claimed = sweep_run.claim(session=s, sweep_id=sweep_id, runner_id=me, lease_s=lease_s)
    assert (found == sweep_id) == (claimed == "running"), (found, claimed)
    return claimed == "running"


def test_the_runner_identity_is_this_process_and_fits_the_column():
    mine = sweep_run.runner_identity("service")
    match = re.fullmatch(r"service@([^@:]+):(\d+):(\d+)", mine)
    assert match and int(match[2]) == os.getpid()
    assert int(match[3]) == sweep_run.process_start(os.getpid()) > 0
    assert not sweep_run.runner_is_gone(mine)
    long = sweep_run.runner_identity("x" * 300)
    assert len(long) == sweep_run.RUNNER_MAX and long.endswith(mine[len("service"):])
    other = subprocess.run([sys.executable, "-c", "from service.runs.sweep_run import runner_identity;"
                            " print(runner_identity('service'))"], cwd=REPO_ROOT, check=True,
                           capture_output=True, text=True, timeout=60).stdout.strip()
    assert other != mine and other.startswith(f"service@{match[1]}:")


def test_a_runner_whose_process_is_gone_is_taken_over_at_once(session_factory):
    dead = subprocess.Popen(["sleep", "30"])
    runner = identity_of(dead)
    dead.kill()
    dead.wait()
    assert sweep_run.runner_is_gone(runner)
    sweep_id = running_sweep(session_factory, runner=runner)  # heartbeat fresh
    assert takes_over(session_factory, sweep_id)
    with session_factory() as s:  # its trials were running under the dead runner: they re-run
        assert set(s.scalars(select(Trial.status).where(Trial.sweep_id == sweep_id))) == {
            "pending"}
        assert s.get(Sweep, sweep_id).runner == sweep_run.runner_identity("service")


def test_a_reused_pid_does_not_keep_a_dead_runner_alive(session_factory):
    pid, start = os.getpid(), sweep_run.process_start(os.getpid())
    host = re.search(r"@([^@:]+):", sweep_run.runner_identity("x"))[1]
    runner = f"service@{host}:{pid}:{start - 1}"  # our pid, but an earlier process had it
    assert sweep_run.runner_is_gone(runner)
    assert takes_over(session_factory, running_sweep(session_factory, runner=runner))


def test_a_live_runner_with_a_fresh_heartbeat_is_never_taken_over(session_factory):
    live = subprocess.Popen(["sleep", "60"])
    try:
        for runner in (identity_of(live),  # another live process on this host, same id
                       sweep_run.runner_identity("service"),  # this very process
                       "service@another-host:1:1",  # a host we cannot look into
                       "service"):  # a runner name from before identities (waits the lease)
            sweep_id = running_sweep(session_factory, runner=runner)
            assert not takes_over(session_factory, sweep_id), runner
            with session_factory() as s:
                assert s.get(Sweep, sweep_id).runner == runner
                s.execute(update(Sweep).where(Sweep.id == sweep_id).values(status="finished"))
                s.commit()
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("runner, heartbeat_age_s", [
    ("service@another-host:1:1", 120),  # stopped renewing: older than the lease
    ("service@another-host:1:1", None),  # never renewed
    (None, 0),  # released by a clean stop
])
def test_a_sweep_nobody_holds_is_taken_over(session_factory, runner, heartbeat_age_s):
    sweep_id = running_sweep(session_factory, runner=runner, heartbeat_age_s=heartbeat_age_s)
    assert takes_over(session_factory, sweep_id)


COMPETITOR = """
import json, signal, sys, threading
from service.core.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.runs.sweep_queue import Scheduler
from workers.events import TrialStarted


def print_runs(event):
    if isinstance(event, TrialStarted):
        print(json.dumps({"started": event.trial.key}), flush=True)


settings = Settings(database_url=sys.argv[1], ray_address=sys.argv[2], upgrade_on_start=False,
                    scheduler_poll_s=0.2, spool_dir=sys.argv[3])
scheduler = Scheduler(session_factory=make_session_factory(make_engine(settings.database_url)),
                      settings=settings, on_event=print_runs)
assert scheduler.ray.ensure()
print(json.dumps({"runner": scheduler.runner_id}), flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
scheduler.start()
stop.wait()
assert scheduler.stop(60)
"""


@pytest.mark.slow  # two services and a real sweep; the takeover rules by default: the tests above
@pytest.mark.timeout(240)
def test_two_services_with_the_same_scheduler_id_run_a_sweep_once(local_ray, tmp_path):
    """The old rule let a runner with the same id take a running sweep at once: a second
    service with the default id ran the first one's trials again, at the same time."""
    import ray

    from service.core.config import Settings
    from service.db.engine import make_engine, make_session_factory, upgrade_database
    from service.runs.sweep_queue import Scheduler
    from workers.events import TrialStarted

    from .test_scheduler import results_per_trial, sweep_status

    url = f"sqlite:///{tmp_path / 'two.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    session_factory = make_session_factory(engine)
    gcs = ray.get_runtime_context().gcs_address
    env = dict(os.environ)
    if gcs.startswith("127.0.0.1:"):  # else Ray swaps 127.0.0.1 for the outward address
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    competitor = subprocess.Popen(
        [sys.executable, "-c", COMPETITOR, url, gcs, str(tmp_path / "spool-b")], env=env,
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    here, runs_here = None, []

    def count_runs(event) -> None:
        if isinstance(event, TrialStarted):
            runs_here.append(event.trial.key)

    try:
        ready, _, _ = fd_select.select([competitor.stdout], [], [], 120)
        line = competitor.stdout.readline() if ready else ""
        assert line, "the second service did not start (connecting to the test's Ray)"
        their_runner = json.loads(line)["runner"]  # it polls now
        here = Scheduler(session_factory=session_factory, settings=Settings(
            database_url=url, upgrade_on_start=False, scheduler_poll_s=0.2, cpu_chips=4,
            spool_dir=str(tmp_path / "spool-a")), on_event=count_runs)
        assert here.runner_id != their_runner
        here.start()
        spec = SweepSpec.model_validate({**TINY_SWEEP, "name": "once",
                                         "seq_lens": [64, 128, 192, 256], "steps": 3})
        with session_factory() as s:
            sweep_id = crud.create_sweep(session=s, sweep_create=spec).id
        here.wake()
        runners: set[str] = set()
        deadline = time.monotonic() + 180
        while sweep_status(session_factory, sweep_id) != "finished":
            assert time.monotonic() < deadline, "the sweep did not finish"
            with session_factory() as s:
                runner = s.scalar(select(Sweep.runner).where(Sweep.id == sweep_id))
            if runner is not None:
                runners.add(runner)
            time.sleep(0.1)
        assert len(runners) == 1 and runners <= {here.runner_id, their_runner}, runners
        assert list(results_per_trial(session_factory, sweep_id).values()) == [1] * 4
    finally:
        if here is not None:
            assert here.stop(60)
        competitor.terminate()
        printed, _ = competitor.communicate(timeout=60)
        engine.dispose()
    runs_there = [json.loads(line)["started"] for line in printed.splitlines()]
    # each trial ran once, in one of the two services
    assert sorted(runs_here + runs_there) == sorted(t.key for t in expand_trials(spec))
