"""The README's main command (service.demo): a refused demo sweep is an error with exit 1, and
the smoke's verdict names what did not succeed. The smoke itself runs in .ci/run, in a venv
holding the runtime dependencies alone; `-m slow` runs it here too."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
import types

import httpx
import pytest
from sqlalchemy import create_engine, text

from service import demo
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.runs import sweep_run
from workers.grid import expand_trials
from workers.sweep_spec import SweepSpec

from .conftest import api_settings, serving
from .seed import seed_sweep


@pytest.mark.timeout(120)
def test_a_refused_demo_sweep_stops_the_service_with_exit_1(tmp_path):
    # A grid cap below the demo's trial count: the API refuses the sweep with 422. Run as a
    # user runs it, in a process of its own (in-process, the server's logging set-up and its
    # threads outlive the test in the pytest worker).
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    env = {**os.environ, "GDN_SWEEP_GRID_CAP": "2",
           "GDN_SWEEP_SPOOL_DIR": str(tmp_path / "spool")}
    done = subprocess.run([sys.executable, "-m", "service.demo", "--smoke", "--db", url],
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=100)

    assert done.returncode == 1, done.stderr[-2000:]
    assert "error: could not submit or follow the sweep: 422" in done.stderr
    assert "grid" in done.stderr  # the service's reason travels to the user
    with create_engine(url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sweeps")).scalar() == 0


@pytest.mark.timeout(120)
def test_a_demo_that_cannot_print_stops_instead_of_serving_on(tmp_path):
    # stdout closed by its reader (`… | head`, a dead terminal): the demo's first line fails;
    # it must stop with a non-zero exit, not serve on with no sweep submitted and nobody told.
    demo_run = subprocess.Popen(
        [sys.executable, "-m", "service.demo", "--smoke", "--db", f"sqlite:///{tmp_path / 'd.db'}"],
        env={**os.environ, "GDN_SWEEP_SPOOL_DIR": str(tmp_path / "spool")},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    demo_run.stdout.close()
    try:
        _, err = demo_run.communicate(timeout=100)
    finally:
        demo_run.kill()
    assert demo_run.returncode not in (0, None)
    assert "BrokenPipeError" in err


def test_the_smoke_sweep_is_four_trials_none_skipped():
    trials = expand_trials(SweepSpec.model_validate(demo.smoke_sweep(cores=2)))
    assert len(trials) == 4
    assert [t.skip_reason for t in trials] == [None] * 4
    assert {(t.framework, t.chips) for t in trials} == {
        (f, c) for f in ("jax", "torch") for c in (1, 2)}


def _view(status: str, **counts: int) -> dict:
    every = dict.fromkeys(("pending", "running", "succeeded", "failed", "skipped"), 0)
    every.update(counts)
    return {"id": 7, "status": status, "counts": every, "trials_total": sum(counts.values())}


@pytest.mark.parametrize(("view", "problem"), [
    (_view("finished", succeeded=4), None),
    (_view("finished", succeeded=3, failed=1), "sweep 7 ended finished with 3/4 trials "
                                                "succeeded (other statuses: {'failed': 1})"),
    (_view("running", succeeded=2, running=2), "sweep 7 ended running with 2/4 trials "
                                               "succeeded (other statuses: {'running': 2})"),
    (_view("finished", succeeded=3, skipped=1), "sweep 7 ended finished with 3/4 trials "
                                                "succeeded (other statuses: {'skipped': 1})"),
])
def test_the_smoke_passes_only_when_every_trial_succeeded(view, problem):
    assert demo.smoke_verdict(view) == problem


@pytest.mark.timeout(90)
def test_the_demo_prints_its_results_url_when_its_sweep_finishes(tmp_path):
    # the demo's follower against a real service: the sweep is queued, then ends (its trials
    # succeeded, one skipped) while the follower polls; one line names the pages to read
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    session_factory = make_session_factory(engine)
    sweep_id = seed_sweep(session_factory, modes=["p2p"], chips=[1, 2, 3])  # 3: skipped
    out = io.StringIO()
    still_serving = types.SimpleNamespace(should_exit=False)  # the uvicorn server's stop flag

    def finish_later() -> None:
        time.sleep(1.0)
        with session_factory() as session:
            sweep_run.finish(session=session, sweep_id=sweep_id, status="finished")

    try:
        with serving(api_settings(url)) as base_url, httpx.Client(base_url=base_url) as client:
            finisher = threading.Thread(target=finish_later)
            finisher.start()
            view = demo.follow_demo(client, still_serving, base_url, sweep_id, out=out)
            finisher.join()
            assert view is not None and view["status"] == "finished"
            assert out.getvalue() == (
                f"sweep {sweep_id} finished: 2 of 3 trials succeeded (1 skipped); results: "
                f"{base_url}/sweeps/{sweep_id} (table: {base_url}/results?sweep_id={sweep_id})\n")
            for page in (f"/sweeps/{sweep_id}", f"/results?sweep_id={sweep_id}"):
                assert client.get(page).status_code == 200  # the printed pages are served
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_smoke_succeeds_and_stops_cleanly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "service.demo", "--smoke"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=880,
                          env={**__import__("os").environ,
                               "GDN_SWEEP_SPOOL_DIR": str(tmp_path / "spool")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "smoke passed: every trial succeeded" in done.stdout
    assert re.search(r"^sweep \d+ finished: 4 of 4 trials succeeded; results: "
                     r"http://127\.0\.0\.1:\d+/sweeps/\d+ ", done.stdout, re.M), done.stdout
