"""The sweep queue's Scheduler: runs queued sweeps, one at a time, through the workers' driver
in a thread (cron schedules that create sweeps are schedule_firing.py's).

Restart-safe by construction: the database is the queue (see service/runs/sweep_run.py). On
start and whenever idle, the scheduler takes the oldest sweep that is queued, or
running/cancelling with no live runner (its own from before a restart, or one whose runner
stopped renewing its heartbeat). Before any, it stores the results a dead predecessor left in
the spool (service/runs/spool.py). The driver runs each of the sweep's trial rows whose key
has no final status yet, so pending trials run, trials that were running when the service died
run again, and no trial gets a second result row (service/runs/db_sink.py). Cancel (API, any
process) sets the sweep `cancelling`; the driver then stops the running trials and reports the
rest cancelled. `stop()` is a shutdown, not a cancel: the sink is detached first, so unfinished
trials stay unfinished, and the claim is released, so the next scheduler resumes the sweep at
once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from service.core.config import Settings
from service.db import crud
from service.db.errors import clean_error
from service.regressions.destinations import WebhookPolicy
from service.regressions.webhook import alert_in_background
from service.runs import sweep_run
from service.runs.background_loop import BackgroundLoop
from service.runs.db_sink import DatabaseSink, replay_spool
from service.runs.ray_setup import RayConnection
from service.runs.spool import Spool
from workers.environment import SweepSource
from workers.options import DriverOptions

log = logging.getLogger(__name__)


def sweep_source(schedule_id: int | None) -> SweepSource:
    """What started a sweep the service runs: its schedule, else the API."""
    return (SweepSource(kind="api") if schedule_id is None
            else SweepSource(kind="schedule", schedule_id=schedule_id))


@dataclasses.dataclass
class _Running:
    sweep_id: int
    sink: DatabaseSink
    cancel_event: threading.Event


class Scheduler:
    """Own one background thread that drains the sweep queue kept in the database."""

    def __init__(self, *, session_factory: sessionmaker[Session], settings: Settings,
                 ray: RayConnection | None = None,
                 on_event: Callable[[object], None] | None = None) -> None:
        self._session_factory = session_factory
        self._settings = settings
        self.runner_id = sweep_run.runner_identity(settings.scheduler_id)
        self.spool = Spool(settings.spool_dir, session_factory.kw["bind"].url)
        self.ray = ray or RayConnection.from_settings(settings)
        self._on_event = on_event
        self._lock = threading.Lock()
        self._current: _Running | None = None
        self._spool_replayed = False
        self._loop = BackgroundLoop(
            self._look, name="gdn-sweep-scheduler", what="scheduler",
            interval_s=settings.scheduler_poll_s, log=log,
            # connect at start, so /api/health reports Ray from the beginning
            on_start=self.ray.ensure)

    @property
    def running_sweep_id(self) -> int | None:
        with self._lock:
            return None if self._current is None else self._current.sweep_id

    def start(self) -> None:
        self._loop.start()

    def wake(self) -> None:
        """Look for queued sweeps now (called after a POST)."""
        self._loop.wake()

    def cancel(self, sweep_id: int) -> None:
        """Stop `sweep_id` now if this scheduler runs it (the API has set it cancelling)."""
        with self._lock:
            if self._current is not None and self._current.sweep_id == sweep_id:
                self._current.cancel_event.set()
        self._loop.wake()

    def request_stop(self) -> None:
        """Begin a shutdown without waiting (safe from any thread, an on_event callback too):
        detach the sink, stop the driver. Unfinished trials stay so and re-run on resume."""
        self._loop.stop_event.set()  # first: a sweep claimed from now on is released at once
        with self._lock:
            if self._current is not None:
                self._current.sink.detach()
                self._current.cancel_event.set()
        self._loop.request_stop()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the scheduler thread; False if it still runs after timeout_s."""
        return self._loop.join(timeout_s)

    def stop(self, timeout_s: float = 120.0) -> bool:
        """Shut down: `request_stop()`, then wait for the thread (at most timeout_s)."""
        self.request_stop()
        return self.join(timeout_s)

    def _look(self) -> None:
        """One round of the loop: run the next sweep due, if any (then look again at once)."""
        if not self._spool_replayed:  # what a dead predecessor spooled counts before any resume
            replay_spool(self.spool, self._session_factory)
            self._spool_replayed = True
        with self._session_factory() as session:
            sweep_id = sweep_run.next_sweep_id(session=session, lease_s=self._settings.lease_s)
        if sweep_id is not None and self.ray.ensure():
            self._run(sweep_id)
            self._loop.wake()

    def _run(self, sweep_id: int) -> None:
        stop = self._loop.stop_event
        with self._session_factory() as session:
            claimed = sweep_run.claim(session=session, sweep_id=sweep_id,
                                      runner_id=self.runner_id, lease_s=self._settings.lease_s)
            if claimed is not None:
                log.info("sweep %s: claimed", sweep_id, extra={
                    "event": "sweep_claimed", "sweep_id": sweep_id, "status": claimed})
            if claimed == "cancelling" and not sweep_run.finish(  # no runner was alive
                    session=session, sweep_id=sweep_id, status="cancelled",
                    stop_event=stop):
                self._release(sweep_id)
            if claimed != "running":
                return
            sweep = crud.get_sweep(session=session, sweep_id=sweep_id)
            name, source = sweep.name, sweep_source(sweep.schedule_id)
            try:
                trials = crud.sweep_trials(session=session, sweep_id=sweep_id)
            except ValueError as err:  # rows another version wrote: fail it, not the loop
                log.error("sweep %s: its trials cannot be run: %s", sweep_id, err)
                sweep_run.finish(session=session, sweep_id=sweep_id, status="failed",
                                 error=f"its trials cannot be run: {err}", stop_event=stop)
                return
        running = _Running(sweep_id, DatabaseSink(self._session_factory, sweep_id,
                                                  spool=self.spool), threading.Event())
        with self._lock:
            stopping = stop.is_set()
            if not stopping:
                self._current = running
        if stopping:
            self._release(sweep_id)
            return
        log.info("sweep %s: running %r (runner %s)", sweep_id, name, self.runner_id,
                 extra={"event": "sweep_started", "sweep_id": sweep_id, "trials": len(trials)})
        try:
            error = sweep_run.drive(
                session_factory=self._session_factory, sweep_id=sweep_id, name=name,
                trials=trials, sink=running.sink, cancel_event=running.cancel_event,
                runner_id=self.runner_id,
                max_concurrent_trials=self._settings.max_concurrent_trials,
                poll_s=self._settings.scheduler_poll_s, on_event=self._on_event,
                stop_event=stop,
                # profile traces go where this service's API serves them from
                driver_options=DriverOptions(
                    source=source, artifact_dir=self._settings.artifact_dir,
                    profile_retention=self._settings.profile_retention()))
        finally:
            with self._lock:
                self._current = None
        if running.sink.detached:  # shutdown (or taken over): unfinished trials wait for a resume
            running.sink.close(timeout_s=5.0)  # what is not stored by then stays spooled
            if stop.is_set():
                self._release(sweep_id)
            return
        status = ("failed" if error is not None else
                  "cancelled" if running.cancel_event.is_set() else "finished")
        with self._session_factory() as session:
            ended = sweep_run.finish(
                session=session, sweep_id=sweep_id, status=status, stop_event=stop,
                error=None if error is None else f"sweep driver failed: {error}")
        running.sink.close()
        if not ended:
            self._release(sweep_id)
            return
        log.info("sweep %s: %s", sweep_id, status,
                 extra={"event": "sweep_finished", "sweep_id": sweep_id, "status": status})
        if status == "finished":  # its schedule's webhook, if any, in a thread of its own
            alert_in_background(session_factory=self._session_factory, sweep_id=sweep_id,
                                policy=WebhookPolicy.from_settings(self._settings))

    def _release(self, sweep_id: int) -> None:
        """Give up the claim on a clean stop, so the next scheduler resumes at once (best
        effort: with the database down, the lease or the dead-process check frees it)."""
        try:
            with self._session_factory() as session:
                sweep_run.release(session=session, sweep_id=sweep_id, runner_id=self.runner_id)
        except Exception as err:  # noqa: BLE001
            log.warning("sweep %s: could not release the claim (%s)", sweep_id,
                        clean_error(err))
