"""The service's log: one line per record on stderr, for `serve`, `scheduler` and `run`.

    2026-12-01T14:20:42.101Z INFO service.sweeps trial finished sweep_id=3 trial=torch/…
        status=succeeded duration_s=4.200 attempts=1 done=2/8      (one line, wrapped here)

Fields come from `extra=` (`log.info("sweep claimed", extra={"sweep_id": 3})`); with
GDN_SWEEP_LOG_FORMAT=json each line is one JSON object instead (`time, level, logger, message`,
the fields, and `exc` for a traceback). uvicorn's loggers propagate here too (serve passes
`log_config=None`), so the access log has the same shape.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from collections.abc import Callable
from typing import TextIO

_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message", "asctime", "color_message", "taskName"}
"""What every LogRecord has; anything else on a record came from `extra=`."""


def record_fields(record: logging.LogRecord) -> dict:
    """The `extra=` fields of a record (private ones, e.g. Ray's `_ray_timestamp_ns`, left
    out)."""
    return {k: v for k, v in record.__dict__.items()
            if k not in _RECORD_ATTRS and not k.startswith("_")}


def _time(record: logging.LogRecord) -> str:
    at = dt.datetime.fromtimestamp(record.created, dt.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _text_value(value) -> str:
    if isinstance(value, float):
        value = f"{value:.3f}"
    text = str(value)
    return json.dumps(text) if not text or any(c in text for c in ' "=\n\t') else text


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_time(record)} {record.levelname} {record.name} {record.getMessage()}"
        fields = record_fields(record)
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {"time": _time(record), "level": record.levelname, "logger": record.name,
                "message": record.getMessage(), **record_fields(record)}
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


class _ServiceHandler(logging.StreamHandler):
    """Marks the handler configure_logging installed, so a second call replaces it."""


def configure_logging(level: str | int = "info", fmt: str = "text",
                      stream: TextIO | None = None) -> None:
    """Send every logger's records at `level` and above to `stream` (stderr), one line each."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _ServiceHandler)]:
        root.removeHandler(handler)
    handler = _ServiceHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


def sweep_event_logger(sweep_id: Callable[[], int | None],
                       logger: logging.Logger | None = None) -> Callable[[object], None]:
    """An `on_event` for the workers' driver: one log line per trial started, retried and
    finished (sweep id, trial key, status, duration), `sweep_id()` naming the running sweep."""
    from workers.events import SweepFinished, TrialFinished, TrialRetrying, TrialStarted

    log = logger or logging.getLogger("service.sweeps")

    def on_event(event: object) -> None:
        ids = {"sweep_id": sweep_id()}
        if isinstance(event, TrialStarted):
            log.info("trial started", extra={**ids, "trial": event.trial.key,
                                              "attempt": event.attempt,
                                              "warm": event.reused_workers})
        elif isinstance(event, TrialRetrying):
            log.warning("trial retrying", extra={**ids, "trial": event.trial.key,
                                                 "attempt": event.attempt,
                                                 "error": event.error[:300]})
        elif isinstance(event, TrialFinished):
            result = event.result
            duration = (None if result.started_at is None or result.finished_at is None
                        else (result.finished_at - result.started_at).total_seconds())
            fields = {**ids, "trial": result.trial.key, "status": result.status,
                      "duration_s": duration, "attempts": result.attempts,
                      "done": f"{event.done}/{event.total}"}
            if result.error and result.status not in ("succeeded", "skipped"):
                fields["error"] = result.error.strip().splitlines()[-1][:300]
            log.log(logging.INFO if result.status in ("succeeded", "skipped", "cancelled")
                    else logging.WARNING, "trial finished", extra=fields)
        elif isinstance(event, SweepFinished):
            log.info("sweep trials done", extra={**ids, "counts": json.dumps(event.counts),
                                                 "already_finished": event.already_finished})

    return on_event


__all__ = ["JsonFormatter", "TextFormatter", "configure_logging", "record_fields",
           "sweep_event_logger"]
