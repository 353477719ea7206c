"""The service's log lines: `time level logger message key=value…` or one JSON object, and one
line per trial event with the sweep id, trial key, status and duration."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import re

import pytest

from service.core.logging import configure_logging, sweep_event_logger
from workers.events import TrialFinished, TrialStarted
from workers.grid import expand_trials
from workers.result import TrialResult
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP


@pytest.fixture
def log_stream():
    stream, root = io.StringIO(), logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)


def test_text_lines_carry_extra_fields_as_key_values(log_stream):
    configure_logging("info", "text", stream=log_stream)
    logging.getLogger("service.test").info("sweep %s: claimed", 7, extra={
        "sweep_id": 7, "runner": "service@host:1:2", "note": "two words"})
    logging.getLogger("service.test").debug("not shown at info")
    (line,) = log_stream.getvalue().splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO service\.test sweep 7: "
                        r'claimed sweep_id=7 runner=service@host:1:2 note="two words"', line)


def test_json_lines_parse_with_the_same_fields(log_stream):
    configure_logging("warning", "json", stream=log_stream)
    logging.getLogger("service.test").warning("trial finished", extra={"sweep_id": 3,
                                                                      "status": "oom"})
    body = json.loads(log_stream.getvalue())
    assert body["level"] == "WARNING" and body["logger"] == "service.test"
    assert (body["message"], body["sweep_id"], body["status"]) == ("trial finished", 3, "oom")


def test_a_second_configuration_replaces_the_first(log_stream):
    configure_logging("info", "text", stream=log_stream)
    configure_logging("info", "text", stream=log_stream)
    logging.getLogger("service.test").info("once")
    assert log_stream.getvalue().count("once") == 1


def test_trial_events_become_one_line_each_with_ids_status_and_duration(log_stream):
    configure_logging("info", "text", stream=log_stream)
    trial = expand_trials(SweepSpec.model_validate(TINY_SWEEP))[0]
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    on_event = sweep_event_logger(lambda: 42)
    on_event(TrialStarted(trial=trial, attempt=1, workers=(), reused_workers=False))
    on_event(TrialFinished(TrialResult(trial=trial, status="timeout", error="took too long",
                                       attempts=1, started_at=start,
                                       finished_at=start + dt.timedelta(seconds=2.5)),
                           done=1, total=1))
    started, finished = log_stream.getvalue().splitlines()
    key = json.dumps(trial.key)
    assert f"INFO service.sweeps trial started sweep_id=42 trial={key} attempt=1" in started
    assert (f"WARNING service.sweeps trial finished sweep_id=42 trial={key} status=timeout "
            f"duration_s=2.500 attempts=1 done=1/1 error=\"took too long\"") in finished
