"""`gdn-sweep run sweep.yaml --db URL`: one sweep in the foreground, into the database.

The sweep is recorded like one submitted to the API (the dashboard shows it live) and is
claimed by this process (`cli:<host>:<pid>`), so a service scheduler on the same database
leaves it alone while this process renews its heartbeat.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path
from typing import TextIO

from pydantic import ValidationError
from sqlalchemy import func, select

from workers.events import TrialFinished
from workers.result import FINAL_STATUSES
from workers.spec import SweepSpec

from . import crud, sweep_run
from .core.config import Settings
from .core.db import make_engine, make_session_factory, upgrade_database
from .models import FINAL_SWEEP_STATUSES, Sweep, Trial
from .ray_setup import RayConnection
from .sink import DatabaseSink


def load_spec(path: str | Path) -> SweepSpec:
    """Read a sweep YAML (or JSON) file into the API's SweepSpec."""
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return SweepSpec.model_validate(data)


class ProgressBar:
    """One line redrawn in place on a terminal; one line per finished trial otherwise."""

    def __init__(self, out: TextIO, *, enabled: bool = True, width: int = 30) -> None:
        self.out, self.enabled, self.width = out, enabled, width
        self.tty = enabled and hasattr(out, "isatty") and out.isatty()
        self.counts: dict[str, int] = {}

    def on_event(self, event) -> None:
        if not self.enabled or not isinstance(event, TrialFinished):
            return
        status = event.result.status
        self.counts[status] = self.counts.get(status, 0) + 1
        filled = int(self.width * event.done / max(event.total, 1))
        counts = " ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {event.done}/{event.total} "
                f"{counts} | {event.result.trial.key} {status}")
        if self.tty:
            self.out.write("\r\x1b[2K" + line)
            if event.done == event.total:
                self.out.write("\n")
        else:
            self.out.write(line + "\n")
        self.out.flush()


def run_sweep_into_db(spec_path: str | Path | None, *, settings: Settings,
                      resume_sweep_id: int | None = None, progress: bool = True,
                      out: TextIO = sys.stderr, driver_options=None) -> int:
    """Run a sweep file (or resume a recorded sweep) to the end; exit code 0, 1 or 130."""
    runner_id = f"cli:{socket.gethostname()}:{os.getpid()}"
    upgrade_database(settings.database_url)
    engine = make_engine(settings.database_url)
    session_factory = make_session_factory(engine)
    try:
        with session_factory() as session:
            if resume_sweep_id is None:
                try:
                    spec = load_spec(spec_path)
                except (ValidationError, OSError, ValueError) as err:
                    print(f"{spec_path}: {err}", file=sys.stderr)
                    return 2
                sweep_id = _sweep_for(session, spec, runner_id, settings.lease_s)
            else:
                sweep = crud.get_sweep(session=session, sweep_id=resume_sweep_id)
                if sweep is None:
                    print(f"sweep {resume_sweep_id} not found in the database", file=sys.stderr)
                    return 2
                if sweep.status in FINAL_SWEEP_STATUSES:
                    print(f"sweep {resume_sweep_id} is already {sweep.status}", file=out)
                    return 0
                sweep_id, spec = sweep.id, SweepSpec.model_validate(sweep.spec)
            claimed = sweep_run.claim(session=session, sweep_id=sweep_id, runner_id=runner_id,
                                      lease_s=settings.lease_s)
            if claimed is None:
                print(f"sweep {sweep_id} is being run by another live runner", file=sys.stderr)
                return 1
        print(f"sweep {sweep_id} {spec.name!r}: {spec.grid_size} trial(s) into "
              f"{engine.url.render_as_string(hide_password=True)}", file=out)
        ray = RayConnection(settings.ray_address, cpu_chips=settings.cpu_chips)
        if claimed == "running" and not ray.ensure():
            error = f"cannot reach Ray: {ray.error}"
            with session_factory() as session:
                sweep_run.finish(session=session, sweep_id=sweep_id, status="failed", error=error)
            print(error, file=sys.stderr)
            return 1
        return _drive(session_factory, sweep_id, spec, settings, runner_id, claimed,
                      ProgressBar(out, enabled=progress), out, driver_options)
    finally:
        engine.dispose()


def _drive(session_factory, sweep_id, spec, settings, runner_id, claimed, bar, out,
           driver_options) -> int:
    cancel_event, error = threading.Event(), None
    if claimed == "running":
        try:
            error = sweep_run.drive(
                session_factory=session_factory, sweep_id=sweep_id, spec=spec,
                sink=DatabaseSink(session_factory, sweep_id), cancel_event=cancel_event,
                runner_id=runner_id, max_concurrent_trials=settings.max_concurrent_trials,
                poll_s=settings.scheduler_poll_s, on_event=bar.on_event,
                driver_options=driver_options)
        except KeyboardInterrupt:  # drive() detached the sink and stopped the driver
            with session_factory() as session:
                sweep_run.release(session=session, sweep_id=sweep_id, runner_id=runner_id)
            print(f"\nsweep {sweep_id} stopped; run the same command again to resume it, or "
                  "cancel it from the dashboard", file=out)
            return 130
    status = ("failed" if error else "cancelled" if cancel_event.is_set() or claimed != "running"
              else "finished")
    with session_factory() as session:
        sweep_run.finish(session=session, sweep_id=sweep_id, status=status,
                         error=None if error is None else f"sweep driver failed: {error}")
        counts = crud.status_counts(session=session, sweep_ids=[sweep_id])[sweep_id]
    shown = ", ".join(f"{k} {v}" for k, v in counts.items() if v and k in FINAL_STATUSES)
    print(f"sweep {sweep_id}: {status} ({shown})", file=out)
    return 1 if error else 0


def _sweep_for(session, spec: SweepSpec, runner_id: str, lease_s: float) -> int:
    """An unfinished sweep of exactly this spec that no live runner holds (so running the same
    file again resumes it), else a new one."""
    wanted = spec.model_dump(mode="json")
    for sweep in session.scalars(select(Sweep).where(
            Sweep.name == spec.name, Sweep.status.in_(("queued", "running")))
            .order_by(Sweep.id.desc())):
        if sweep.spec == wanted and sweep_run.claimable(
                session=session, sweep_id=sweep.id, runner_id=runner_id, lease_s=lease_s):
            return sweep.id
    return crud.create_sweep(session=session, sweep_create=spec).id


class _CliSink(DatabaseSink):
    """DatabaseSink for the workers' `run --db` path: holds the sweep's claim with a heartbeat
    thread and ends the sweep (finished) when its last open trial gets a result."""

    def __init__(self, session_factory, sweep_id: int, runner_id: str, poll_s: float) -> None:
        super().__init__(session_factory, sweep_id)
        self.runner_id, self._done = runner_id, threading.Event()
        threading.Thread(target=self._beat, args=(poll_s,), daemon=True,
                         name=f"gdn-sweep-heartbeat-{sweep_id}").start()

    def _beat(self, poll_s: float) -> None:
        while not self._done.wait(poll_s):
            with self._session_factory() as session:
                if sweep_run.heartbeat(session=session, sweep_id=self.sweep_id,
                                       runner_id=self.runner_id) is None:
                    self.detach()  # another runner took the sweep over
                    return

    def trial_finished(self, result) -> None:
        super().trial_finished(result)
        if self.detached:
            return
        with self._session_factory() as session:
            open_trials = session.scalar(select(func.count()).select_from(Trial).where(
                Trial.sweep_id == self.sweep_id, Trial.status.not_in(FINAL_STATUSES)))
            if not open_trials:
                sweep_run.finish(session=session, sweep_id=self.sweep_id, status="finished")
                self._done.set()


def open_cli_sink(database_url: str, spec: SweepSpec) -> DatabaseSink:
    """Record `spec` in the database (resuming an unfinished identical sweep) and return a sink
    that holds its claim. Cancels from the API are not seen on this path; `run_with_db` (the
    service's own `run`) handles them and prints a progress bar."""
    settings = Settings(database_url=database_url)
    runner_id = f"cli:{socket.gethostname()}:{os.getpid()}"
    upgrade_database(settings.database_url)
    session_factory = make_session_factory(make_engine(settings.database_url))
    with session_factory() as session:
        sweep_id = _sweep_for(session, spec, runner_id, settings.lease_s)
        if sweep_run.claim(session=session, sweep_id=sweep_id, runner_id=runner_id,
                           lease_s=settings.lease_s) != "running":
            raise SystemExit(f"sweep {sweep_id} is held by another live runner")
    return _CliSink(session_factory, sweep_id, runner_id, settings.scheduler_poll_s)
