"""`BackgroundLoop`: the one daemon thread a service loop runs in (the sweep queue's Scheduler,
the ScheduleLoop that fires cron schedules).

It calls `step()` until stopped, waiting `interval_s` after each call, or less when woken
(`wake()`, from any thread; a step that knows there is more to do at once calls it too).
A step that raises is logged and the loop goes on: a transient database error (the database
restarting, a network blip) as one warning line, anything else with its traceback; either way
the next call comes after the usual wait. Lives in `runs`, not `core`, because that logging
reads `service.db.errors`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from service.db.errors import clean_error, is_transient


class BackgroundLoop:
    """A stoppable daemon thread calling `step()` every `interval_s` seconds."""

    def __init__(self, step: Callable[[], object], *, name: str, what: str,
                 interval_s: float, log: logging.Logger,
                 on_start: Callable[[], object] | None = None) -> None:
        """`step`: one round of work (what it returns is ignored). `name`: the thread's;
        `what`: how log lines name the loop; `on_start`: called once in the thread before the
        first step (not guarded: it must not raise)."""
        self._step, self._on_start = step, on_start
        self._name, self._what, self._interval_s, self._log = name, what, interval_s, log
        self.stop_event = threading.Event()
        """Set once a stop was requested; steps that block pass it on to stop early."""
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (once: a stopped loop is not started again)."""
        if self._thread is not None:
            raise RuntimeError(f"the {self._what} loop was started already; make a new one")
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """End the current wait now (the next step runs at once)."""
        self._wake.set()

    def request_stop(self) -> None:
        """Stop after the current step, without waiting for it (safe from any thread)."""
        self.stop_event.set()
        self._wake.set()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread; False if it still runs after timeout_s (True if never
        started)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        while not self.stop_event.is_set():
            try:
                self._step()
            except Exception as err:  # keep going: log, wait, look again
                if is_transient(err):
                    self._log.warning("%s: database unavailable (%s); retrying in %.1f s",
                                      self._what, clean_error(err), self._interval_s)
                else:
                    self._log.exception("%s: failed; retrying in %.1f s", self._what,
                                        self._interval_s)
            self._wake.wait(self._interval_s)
            self._wake.clear()
