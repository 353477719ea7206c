"""The one background thread of the sweep queue and the schedule loop (runs/background_loop.py):
it survives its step's errors, logging a transient database error as one warning and anything
else with its traceback; it wakes at once when asked, stops and joins."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from sqlalchemy.exc import OperationalError

from service.runs.background_loop import BackgroundLoop

log = logging.getLogger("tests.background_loop")


def _wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.timeout(30)
def test_the_loop_survives_errors_logs_them_by_kind_and_stops(caplog):
    calls, started = [], threading.Event()
    failures = [OperationalError("SELECT 1", {}, Exception("server closed the connection")),
                RuntimeError("a bug")]

    def step() -> None:
        calls.append(time.monotonic())
        if failures:
            raise failures.pop(0)

    loop = BackgroundLoop(step, name="test-loop", what="tester", interval_s=0.2, log=log,
                          on_start=started.set)
    with caplog.at_level(logging.INFO, logger=log.name):
        loop.start()
        _wait_for(lambda: len(calls) >= 4)
        assert loop.stop_event.is_set() is False
        loop.request_stop()
        assert loop.join(5.0)
    assert started.is_set()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage().split(" (")[0] for r in warnings] == ["tester: database unavailable"]
    assert warnings[0].exc_info is None  # a transient error: one line, no traceback
    assert len(errors) == 1 and errors[0].exc_info[0] is RuntimeError
    assert "tester: failed; retrying in 0.2 s" in errors[0].getMessage()
    with pytest.raises(RuntimeError, match="started already"):
        loop.start()


@pytest.mark.timeout(30)
def test_wake_runs_the_next_step_at_once_and_stop_ends_a_long_wait():
    calls = []
    loop = BackgroundLoop(lambda: calls.append(1), name="test-loop", what="tester",
                          interval_s=60.0, log=log)  # without wake: one step a minute
    assert loop.join(0)  # never started: nothing to wait for
    loop.start()
    _wait_for(lambda: len(calls) == 1)
    loop.wake()
    _wait_for(lambda: len(calls) == 2)
    start = time.monotonic()
    loop.request_stop()
    assert loop.join(5.0) and time.monotonic() - start < 5.0
    assert len(calls) == 2
