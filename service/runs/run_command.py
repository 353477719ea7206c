"""`gdn-sweep run` and `deploy/run_sweep.py`: one sweep run in this process to its end, into
the database (`run_sweep_into_db`) or a JSON-lines file (`run_sweep_into_jsonl`), then a
summary table (progress.py).

The sweep is recorded like one submitted to the API (the dashboard shows it live: its trial
rows are the one expansion of its grid, and what the driver runs) and is claimed by this
process (`cli@<host>:<pid>:<start>`), so a service scheduler on the same database leaves it
alone while this process renews its heartbeat.

The file goes through the API's checks (sweep_file.load_spec) before anything is written; a bad
one is one message and exit code 2. Exit codes (preflight.py): 0 when every trial succeeded or
was skipped, 1 otherwise, 2 bad input, 130 Ctrl-C. Ctrl-C stops the running trials and puts
the sweep back in the queue (`queued`, no runner; the stopped trials `pending`): running the
same file again, `--resume ID`, or a service on the database resumes it at once. `new=True` (a
nightly run) always makes a new sweep.

Before anything runs, in this order: the file, the sink (the database is reached and
migrated; a JSON-lines file's folder exists), then Ray (preflight.py). Each failure is one
line, no traceback: exit 2 for bad input (the file, a bad database URL, a results file that
holds another sweep), 1 when the database or Ray cannot be reached.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from sqlalchemy import func, select, update

from service.core.config import Settings
from service.core.logging import sweep_event_logger
from service.db import crud
from service.db.engine import make_engine, make_session_factory
from service.db.models import FINAL_SWEEP_STATUSES, Sweep, Trial
from service.runs import sweep_run
from service.runs.db_sink import DatabaseSink
from service.runs.preflight import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TRIALS_FAILED,
    database_error,
    first_line,
    ray_address_error,
)
from service.runs.progress import (ProgressBar, db_rows, file_rows, print_summary,
                                   status_counts_text)
from service.runs.ray_setup import RayConnection
from service.runs.sweep_file import ResultsFileError, SweepFileError, jsonl_target, load_spec
from workers.result import FINAL_STATUSES
from workers.result_sink import JsonLinesError, JsonLinesSink, read_jsonl
from workers.grid import TrialSpec, expand_trials
from workers.sweep_spec import SweepSpec

SUCCESSFUL = frozenset({"succeeded", "skipped"})


def needs_ray(trials: Sequence[TrialSpec]) -> bool:
    """False when every trial is skipped (recorded without running): no Ray to start."""
    return any(trial.skip_reason is None for trial in trials)


def run_sweep_into_db(spec_path: str | Path | None, *, settings: Settings,
                      resume_sweep_id: int | None = None, new: bool = False,
                      progress: bool = True, out: TextIO | None = None,
                      summary_out: TextIO | None = None, driver_options=None) -> int:
    """Run a sweep file (or resume a recorded sweep) to the end; exit code 0, 1, 2 or 130
    (see the module); the log gets one line per trial event. The sweep's id and a summary
    table go to `summary_out` (default stdout) at the end; the rest to `out` (stderr)."""
    out, summary_out = out or sys.stderr, summary_out or sys.stdout
    spec = None
    if resume_sweep_id is None:
        try:  # before the database is touched: a bad file writes nothing
            spec = load_spec(spec_path, grid_cap=settings.grid_cap)
        except SweepFileError as err:
            print(err, file=sys.stderr)
            return EXIT_BAD_INPUT
    runner_id = sweep_run.runner_identity("cli")
    failed = database_error(settings.database_url)
    if failed is not None:
        print(failed[1], file=sys.stderr)
        return failed[0]
    engine = make_engine(settings.database_url)
    session_factory = make_session_factory(engine)
    try:
        with session_factory() as session:
            if spec is not None and new:
                sweep = crud.create_sweep(session=session, sweep_create=spec)
            elif spec is not None:
                sweep = _sweep_for(session, spec, runner_id, settings.lease_s)
            else:
                sweep = crud.get_sweep(session=session, sweep_id=resume_sweep_id)
                if sweep is None:
                    print(f"sweep {resume_sweep_id} not found in the database", file=sys.stderr)
                    return EXIT_BAD_INPUT
                if sweep.status in FINAL_SWEEP_STATUSES:
                    print(f"sweep {resume_sweep_id} is already {sweep.status}", file=out)
                    rows = db_rows(session, sweep.id)
                    print_summary(summary_out, sweep.id, sweep.name, sweep.status, rows)
                    print(closing_line(sweep.id, sweep.status, rows, settings.database_url),
                          file=summary_out)
                    return _outcome(session, sweep.id)
            sweep_id, name = sweep.id, sweep.name
            claimed = sweep_run.claim(session=session, sweep_id=sweep_id, runner_id=runner_id,
                                      lease_s=settings.lease_s)
            if claimed is None:
                print(f"sweep {sweep_id} is being run by another live runner", file=sys.stderr)
                return EXIT_TRIALS_FAILED
            try:
                trials, problem = crud.sweep_trials(session=session, sweep_id=sweep_id), None
            except ValueError as err:  # rows another version wrote
                trials, problem = [], f"its trials cannot be run: {err}"
        print(f"sweep {sweep_id} {name!r}: {len(trials)} trial(s) into "
              f"{engine.url.render_as_string(hide_password=True)}", file=out)
        ray = RayConnection.from_settings(settings)
        try:
            if problem is None and claimed == "running" and needs_ray(trials):
                problem = _ray_error(settings, ray)
            if problem is not None:
                with session_factory() as session:
                    sweep_run.finish(session=session, sweep_id=sweep_id, status="failed",
                                     error=problem)
                print(problem, file=sys.stderr)
                return EXIT_TRIALS_FAILED
            return _drive(session_factory, sweep_id, name, trials, settings, runner_id,
                          claimed, ProgressBar(out, enabled=progress), out, driver_options,
                          summary_out)
        finally:
            ray.shutdown()
    finally:
        engine.dispose()


def _ray_error(settings: Settings, ray: RayConnection) -> str | None:
    """None once Ray is reached, else why not (one line)."""
    unreachable = ray_address_error(settings.ray_address)
    if unreachable is None and not ray.ensure():
        unreachable = first_line(ray.error)
    return None if unreachable is None else f"cannot reach Ray: {unreachable}"


def _drive(session_factory, sweep_id, name, trials, settings, runner_id, claimed, bar, out,
           driver_options, summary_out) -> int:
    cancel_event, error = threading.Event(), None
    if claimed == "running":
        log_event = sweep_event_logger(lambda: sweep_id)

        def on_driver_event(event) -> None:
            bar.on_event(event)
            log_event(event)

        try:
            error = sweep_run.drive(
                session_factory=session_factory, sweep_id=sweep_id, name=name, trials=trials,
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
        rows = db_rows(session, sweep_id)
    shown = ", ".join(f"{k} {v}" for k, v in counts.items() if v and k in FINAL_STATUSES)
    print(f"sweep {sweep_id}: {status} ({shown})", file=out)
    print_summary(summary_out, sweep_id, name, status, rows)
    print(closing_line(sweep_id, status, rows, settings.database_url), file=summary_out)
    return code


def closing_line(sweep_id: int, status: str, rows, database_url: str) -> str:
    """The last line of a run into the database: how its trials ended, and where to see them."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url).render_as_string(hide_password=True)
    return (f"sweep {sweep_id} {status}: {status_counts_text(rows)}. See them with "
            f"`gdn-sweep results --sweep-id {sweep_id} --db {url}` (the succeeded ones), or at "
            f"/sweeps/{sweep_id} on the dashboard of `gdn-sweep serve --db {url}`")


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


def _sweep_for(session, spec: SweepSpec, runner_id: str, lease_s: float) -> Sweep:
    """An unfinished sweep of exactly this spec that no live runner holds (so running the same
    file again resumes it), else a new one."""
    wanted = spec.model_dump(mode="json")
    for sweep in session.scalars(select(Sweep).where(
            Sweep.name == spec.name, Sweep.status.in_(("queued", "running")))
            .order_by(Sweep.id.desc())):
        if sweep.spec == wanted and sweep_run.claimable(
                session=session, sweep_id=sweep.id, runner_id=runner_id, lease_s=lease_s):
            return sweep
    return crud.create_sweep(session=session, sweep_create=spec)



def run_sweep_into_jsonl(spec_path: str | Path | None, *, settings: Settings,
                         target: str | None = None, resume_file: str | Path | None = None,
                         new: bool = False, progress: bool = True, out: TextIO | None = None,
                         summary_out: TextIO | None = None, driver_options=None) -> int:
    """Run a sweep file into a JSON-lines file (see `jsonl_target`), or continue the sweep a
    file holds (`resume_file`: its header gives the spec); exit codes as run_sweep_into_db.
    The file is made only once Ray is reached: a sweep that could not run leaves no file."""
    from workers.driver import run_trials
    from workers.progress import format_event

    out, summary_out = out or sys.stdout, summary_out or sys.stdout
    try:
        if resume_file is not None:
            held = read_jsonl(resume_file)
            if held.header is None:
                raise ResultsFileError(f"{resume_file}: no sweep header (first line); it cannot "
                                       f"be resumed")
            spec, path, fresh = held.spec, Path(resume_file), False
        else:
            spec = load_spec(spec_path, grid_cap=settings.grid_cap)
            path, fresh = jsonl_target(spec, target, new=new)
    except (SweepFileError, ResultsFileError, JsonLinesError) as err:
        print(err, file=sys.stderr)
        return EXIT_BAD_INPUT
    trials = expand_trials(spec)  # the run's one expansion: run, then summarized
    unreachable = ray_address_error(settings.ray_address) if needs_ray(trials) else None
    if unreachable is not None:
        print(f"cannot reach Ray: {unreachable}", file=sys.stderr)
        return EXIT_TRIALS_FAILED

    def show(event) -> None:
        line = format_event(event) if progress else None
        if line:
            print(line, file=out, flush=True)

    ray = RayConnection.from_settings(settings)
    try:
        if needs_ray(trials) and not ray.ensure():
            print(f"cannot reach Ray: {first_line(ray.error)}", file=sys.stderr)
            return EXIT_TRIALS_FAILED
        sink = JsonLinesSink.create(path, spec) if fresh else JsonLinesSink(path)
        uid = read_jsonl(path).header["uid"]
        print(f"sweep {uid} {spec.name!r}: {len(trials)} trial(s) into {path}", file=out,
              flush=True)
        run_trials(trials, sink, name=spec.name,
                   max_concurrent_trials=settings.max_concurrent_trials, on_event=show,
                   options=driver_options)
    except KeyboardInterrupt:
        pending = sum(r.status in ("pending", "cancelled") for r in file_rows(path, trials))
        print(f"\nstopped: {pending} trial(s) stay pending for a resume; continue with "
              f"--resume {path} (results so far in {path})", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        ray.shutdown()
    rows = file_rows(path, trials)
    ok = all(r.status in SUCCESSFUL for r in rows)
    print_summary(summary_out, uid, spec.name, "finished" if ok else "finished with failures",
                  rows)
    print(f"sweep {uid} {'finished' if ok else 'finished with failures'}: "
          f"{status_counts_text(rows)}; results in {path}; load them with "
          f"`gdn-sweep import {path} --db URL`", file=summary_out)
    return EXIT_OK if ok else EXIT_TRIALS_FAILED
