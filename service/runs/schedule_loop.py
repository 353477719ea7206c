"""The thread that fires schedules: every `schedule_poll_s` it fires what is due
(service/runs/schedules.py), apart from the scheduler's thread, which blocks while it drives a
sweep. Every process that runs a scheduler runs one; the database makes each due time fire
once however many do. A database outage is logged and retried at the next poll, never fatal.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from service.core.config import Settings
from service.db.models import utcnow
from service.runs.schedules import Fired, fire_due
from service.runs.sink import clean_error, is_transient

log = logging.getLogger(__name__)


class ScheduleLoop:
    """Own one background thread that fires due schedules."""

    def __init__(self, *, session_factory: sessionmaker[Session], settings: Settings,
                 clock: Callable[[], dt.datetime] = utcnow,
                 on_created: Callable[[int], None] | None = None) -> None:
        """`clock`: the current time, aware UTC (tests pass their own); `on_created`: called
        with the id of each sweep created (the service wakes its scheduler)."""
        self._session_factory = session_factory
        self._poll_s = settings.schedule_poll_s
        self._grid_cap = settings.grid_cap
        self._clock = clock
        self._on_created = on_created
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("this ScheduleLoop was started already; make a new one")
        self._thread = threading.Thread(target=self._loop, name="gdn-sweep-schedules",
                                        daemon=True)
        self._thread.start()

    def tick(self) -> list[Fired]:
        """Fire what is due now (raises on a database error)."""
        fired = fire_due(session_factory=self._session_factory, now=self._clock(),
                         grid_cap=self._grid_cap)
        for outcome in fired:
            if outcome.sweep_id is not None and self._on_created is not None:
                self._on_created(outcome.sweep_id)
        return fired

    def request_stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread; False if it still runs after timeout_s."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def stop(self, timeout_s: float = 30.0) -> bool:
        self.request_stop()
        return self.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as err:  # keep firing: log, wait, look again
                if is_transient(err):
                    log.warning("schedules: database unavailable (%s); retrying in %.1f s",
                                clean_error(err), self._poll_s)
                else:
                    log.exception("schedules: firing failed; retrying in %.1f s", self._poll_s)
            self._stop.wait(self._poll_s)
