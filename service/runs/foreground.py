"""`gdn-sweep run sweep.yaml --db URL`: one sweep in the foreground, into the database.

The sweep is recorded like one submitted to the API (the dashboard shows it live) and is
claimed by this process (`cli@<host>:<pid>:<start>`), so a service scheduler on the same
database leaves it alone while this process renews its heartbeat.

The file goes through the API's checks (SweepSpec, the grid cap, the model's presets) before
anything is written; a bad one is one message and exit code 2. Exit codes: 0 when every trial
succeeded or was skipped, 1 otherwise, 2 bad input, 130 Ctrl-C. Ctrl-C stops the running
trials and puts the sweep back in the queue (`queued`, no runner; the stopped trials
`pending`): running the same file again, `--resume ID`, or a service on the database
resumes it at once.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TextIO

from pydantic import ValidationError
from sqlalchemy import func, select, update

from service.core.config import Settings
from service.core.logging import sweep_event_logger
from service.db import crud
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.models import FINAL_SWEEP_STATUSES, Sweep, Trial
from service.runs import sweep_run
from service.runs.admission import grid_cap_error, validation_text
from service.runs.ray_setup import RayConnection
from service.runs.sink import DatabaseSink
from workers.events import TrialFinished
from workers.result import FINAL_STATUSES
from workers.spec import SweepSpec, expand_trials

EXIT_OK, EXIT_TRIALS_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
SUCCESSFUL = frozenset({"succeeded", "skipped"})


class SweepFileError(ValueError):
    """A sweep file that cannot be run; str() is the message to show (it names the file)."""


def load_spec(path: str | Path, *, grid_cap: int | None = None) -> SweepSpec:
    """Read a sweep YAML (or JSON) file into the API's SweepSpec, with the API's checks: the
    spec, the grid cap (when given) and the model's presets. SweepFileError if any fails."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SweepFileError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise SweepFileError(f"{path}: not a text file (UTF-8)") from None
    except OSError as err:
        raise SweepFileError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark, context = err.problem_mark or err.context_mark, ""
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        if err.problem and err.context and err.context_mark is not None:
            context = f" ({err.context} at line {err.context_mark.line + 1})"
        raise SweepFileError(f"{path}{where}: not valid YAML: "
                             f"{err.problem or err.context}{context}") from None
    except yaml.YAMLError as err:
        raise SweepFileError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        held = "nothing" if data is None else f"a {type(data).__name__}"
        raise SweepFileError(f"{path}: a sweep is a YAML mapping (name: …, frameworks: […], "
                             f"…); this file holds {held}")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise SweepFileError(f"{path}: not a valid sweep:\n{validation_text(err)}") from None
    too_large = None if grid_cap is None else grid_cap_error(spec, grid_cap)
    if too_large is not None:
        raise SweepFileError(f"{path}: {too_large['msg']}")
    try:
        expand_trials(spec)  # what POST /api/sweeps does: a model the presets cannot build
    except ValueError as err:
        raise SweepFileError(f"{path}: model: {err}") from None
    return spec


def needs_ray(spec: SweepSpec) -> bool:
    """False when every trial is skipped (recorded without running): no Ray to start."""
    return any(trial.skip_reason is None for trial in expand_trials(spec))


class ProgressBar:
    """One line redrawn in place on a terminal; one line per finished trial otherwise.
    Silent once `stopped` is set (the driver then reports trials it never finished)."""

    def __init__(self, out: TextIO, *, enabled: bool = True, width: int = 30) -> None:
        self.out, self.enabled, self.width = out, enabled, width
        self.tty = enabled and hasattr(out, "isatty") and out.isatty()
        self.counts: dict[str, int] = {}
        self.stopped = threading.Event()

    def on_event(self, event) -> None:
        if not self.enabled or self.stopped.is_set() or not isinstance(event, TrialFinished):
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
    """Run a sweep file (or resume a recorded sweep) to the end; exit code 0, 1, 2 or 130
    (see the module); the log gets one line per trial event."""
    spec = None
    if resume_sweep_id is None:
        try:  # before the database is touched: a bad file writes nothing
            spec = load_spec(spec_path, grid_cap=settings.grid_cap)
        except SweepFileError as err:
            print(err, file=sys.stderr)
            return EXIT_BAD_INPUT
    runner_id = sweep_run.runner_identity("cli")
    upgrade_database(settings.database_url)
    engine = make_engine(settings.database_url)
    session_factory = make_session_factory(engine)
    try:
        with session_factory() as session:
            if spec is not None:
                sweep_id = _sweep_for(session, spec, runner_id, settings.lease_s)
            else:
                sweep = crud.get_sweep(session=session, sweep_id=resume_sweep_id)
                if sweep is None:
                    print(f"sweep {resume_sweep_id} not found in the database", file=sys.stderr)
                    return EXIT_BAD_INPUT
                if sweep.status in FINAL_SWEEP_STATUSES:
                    print(f"sweep {resume_sweep_id} is already {sweep.status}", file=out)
                    return _outcome(session, sweep.id)
                sweep_id, spec = sweep.id, SweepSpec.model_validate(sweep.spec)
            claimed = sweep_run.claim(session=session, sweep_id=sweep_id, runner_id=runner_id,
                                      lease_s=settings.lease_s)
            if claimed is None:
                print(f"sweep {sweep_id} is being run by another live runner", file=sys.stderr)
                return EXIT_TRIALS_FAILED
        print(f"sweep {sweep_id} {spec.name!r}: {spec.grid_size} trial(s) into "
              f"{engine.url.render_as_string(hide_password=True)}", file=out)
        ray = RayConnection.from_settings(settings)
        try:
            if claimed == "running" and needs_ray(spec) and not ray.ensure():
                error = f"cannot reach Ray: {ray.error}"
                with session_factory() as session:
                    sweep_run.finish(session=session, sweep_id=sweep_id, status="failed",
                                     error=error)
                print(error, file=sys.stderr)
                return EXIT_TRIALS_FAILED
            return _drive(session_factory, sweep_id, spec, settings, runner_id, claimed,
                          ProgressBar(out, enabled=progress), out, driver_options)
        finally:
            ray.shutdown()
    finally:
        engine.dispose()


def _drive(session_factory, sweep_id, spec, settings, runner_id, claimed, bar, out,
           driver_options) -> int:
    cancel_event, error = threading.Event(), None
    if claimed == "running":
        log_event = sweep_event_logger(lambda: sweep_id)

        def on_driver_event(event) -> None:
            bar.on_event(event)
            log_event(event)

        try:
            error = sweep_run.drive(
                session_factory=session_factory, sweep_id=sweep_id, spec=spec,
                sink=DatabaseSink(session_factory, sweep_id), cancel_event=cancel_event,
                runner_id=runner_id, max_concurrent_trials=settings.max_concurrent_trials,
                poll_s=settings.scheduler_poll_s, on_event=on_driver_event,
                driver_options=driver_options)
        except KeyboardInterrupt:  # drive() detached the sink and stopped the driver
            bar.stopped.set()
            with session_factory() as session:
                pending, done = _requeue(session, sweep_id, runner_id)
            print(f"\nsweep {sweep_id} stopped: {pending} trial(s) stay pending for a resume "
                  f"({done} done); run the same command again (or `gdn-sweep run --resume "
                  f"{sweep_id} --db …`) to finish them, or cancel the sweep from the dashboard",
                  file=out)
            return EXIT_INTERRUPTED
    status = ("failed" if error else "cancelled" if cancel_event.is_set() or claimed != "running"
              else "finished")
    with session_factory() as session:
        sweep_run.finish(session=session, sweep_id=sweep_id, status=status,
                         error=None if error is None else f"sweep driver failed: {error}")
        counts = crud.status_counts(session=session, sweep_ids=[sweep_id])[sweep_id]
        code = _outcome(session, sweep_id)
    shown = ", ".join(f"{k} {v}" for k, v in counts.items() if v and k in FINAL_STATUSES)
    print(f"sweep {sweep_id}: {status} ({shown})", file=out)
    return code


def _outcome(session, sweep_id: int) -> int:
    """0 when every trial of the sweep succeeded or was skipped, else 1."""
    counts = crud.status_counts(session=session, sweep_ids=[sweep_id])[sweep_id]
    return EXIT_OK if all(n == 0 or s in SUCCESSFUL for s, n in counts.items()) \
        else EXIT_TRIALS_FAILED


def _requeue(session, sweep_id: int, runner_id: str) -> tuple[int, int]:
    """After Ctrl-C: the sweep back to `queued` with no runner and its stopped trials back to
    `pending` (what the dashboard then shows is true, and any runner resumes it at once); a
    `cancelling` one only loses its runner. Returns (trials left to run, trials done)."""
    requeued = session.execute(update(Sweep).where(
        Sweep.id == sweep_id, Sweep.runner == runner_id, Sweep.status == "running").values(
        status="queued", runner=None, heartbeat_at=None)).rowcount
    if requeued:
        session.execute(update(Trial).where(Trial.sweep_id == sweep_id,
                                            Trial.status == "running").values(
            status="pending", started_at=None))
    session.commit()
    sweep_run.release(session=session, sweep_id=sweep_id, runner_id=runner_id)
    open_trials = session.scalar(select(func.count()).select_from(Trial).where(
        Trial.sweep_id == sweep_id, Trial.status.not_in(FINAL_STATUSES))) or 0
    total = session.scalar(select(func.count()).select_from(Trial).where(
        Trial.sweep_id == sweep_id)) or 0
    return open_trials, total - open_trials


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
