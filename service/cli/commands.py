"""The service's `gdn-sweep` actions: serve, scheduler, results, db upgrade, run (a sweep
into the DB).

Each is a plain function returning an exit code; `add_service_commands` adds them to the CLI's
argparse sub-commands (service/cli.py wires them).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
from typing import TextIO

from service.cli.database import database_command, shown_url
from service.core.config import Settings
from service.core.exposure import refusal_to_serve

log = logging.getLogger("service.cli.commands")
SCHEDULER_STOP_TIMEOUT_S = 150.0
"""How long serve waits for its scheduler process to stop (running trials, then Ray)."""


def cli_settings(**overrides) -> Settings:
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def _export(**variables: str | None) -> None:
    """Command-line options into the environment, where every process of the service (uvicorn
    workers, the scheduler process) reads its Settings."""
    os.environ.update({k: v for k, v in variables.items() if v is not None})


def serve(*, host: str = "127.0.0.1", port: int = 8000, database_url: str | None = None,
          ray_address: str | None = None, log_level: str | None = None, workers: int = 1,
          access_log: bool = True, allow_unauthenticated: bool = False) -> int:
    """Run the API and dashboard in `workers` uvicorn processes, and the scheduler: inside
    the one worker, or with several, in one `gdn-sweep scheduler` process of its own (API
    workers then run none: exactly one scheduler per database). SIGTERM and Ctrl-C stop it
    all cleanly (the scheduler, then a local Ray, every process of it); exit code 0.
    Beyond loopback without GDN_SWEEP_API_TOKEN it refuses to start (exit 2) unless
    `allow_unauthenticated`."""
    import uvicorn

    from service.core.logging import configure_logging

    _export(DATABASE_URL=database_url, RAY_ADDRESS=ray_address, GDN_SWEEP_LOG_LEVEL=log_level,
            GDN_SWEEP_SERVED_HOST=host,  # the API and scheduler processes read it: webhooks
            GDN_SWEEP_ALLOW_UNAUTHENTICATED="true" if allow_unauthenticated else None)
    settings = Settings()
    # the Host check answers the name bound to (an address is answered anyway)
    _export(GDN_SWEEP_ALLOWED_HOSTS=",".join([*settings.allowed_hosts, host.lower()]))
    configure_logging(settings.log_level, settings.log_format)
    if settings.open_to_network:
        if not settings.allow_unauthenticated:
            print(f"gdn-sweep serve: {refusal_to_serve(host)}", file=sys.stderr)
            return 2
        log.warning("serving on %s with no GDN_SWEEP_API_TOKEN (--allow-unauthenticated): "
                    "anyone who reaches it can start and cancel sweeps", host)
    log.info("dashboard on http://%s:%d/", "127.0.0.1" if host == "0.0.0.0" else host, port,
             extra={"database": shown_url(settings.database_url), "workers": workers})
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl-C
    scheduler_process = None
    try:
        if workers > 1:
            if settings.upgrade_on_start:  # once, here: the processes would race to migrate
                from service.db.engine import upgrade_database

                log.info("database at revision %s", upgrade_database(settings.database_url))
                _export(GDN_SWEEP_UPGRADE_ON_START="false")
            if settings.run_scheduler:
                scheduler_process = subprocess.Popen(
                    [sys.executable, "-m", "service.cli", "scheduler"])
                log.info("scheduler process started", extra={"pid": scheduler_process.pid})
            _export(GDN_SWEEP_RUN_SCHEDULER="false")
        uvicorn.run("service.main:serve_app", factory=True, host=host, port=port,
                    workers=workers, log_config=None, log_level=settings.log_level,
                    access_log=access_log)
    except KeyboardInterrupt:  # a signal before uvicorn took over signals: nothing runs yet
        pass
    finally:
        if scheduler_process is not None:
            _stop_process(scheduler_process, SCHEDULER_STOP_TIMEOUT_S)
    log.info("shutdown complete")
    return 0


def _stop_process(process: subprocess.Popen, timeout_s: float) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        log.error("scheduler process %d did not stop in %.0f s; killing it", process.pid,
                  timeout_s)
        process.kill()
        process.wait()
    log.info("scheduler process stopped", extra={"pid": process.pid,
                                                 "exit_code": process.returncode})


def scheduler(*, database_url: str | None = None, ray_address: str | None = None,
              log_level: str | None = None) -> int:
    """Run the scheduler alone, no HTTP, until SIGTERM or Ctrl-C (it fires due schedules
    too): it stops the running sweep for a resume, stops a local Ray completely and exits 0.
    A database that cannot be reached at start: one line, exit 1."""
    from service.cli.database import open_database
    from service.core.logging import configure_logging

    settings = cli_settings(database_url=database_url, ray_address=ray_address,
                         log_level=log_level)
    configure_logging(settings.log_level, settings.log_format)
    stop = threading.Event()

    def request_stop(signum, _frame) -> None:
        if not stop.is_set():
            log.info("%s received: stopping", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request_stop)

    def run() -> int:
        with open_database(settings.database_url,
                           upgrade=settings.upgrade_on_start) as session_factory:
            code = _run_scheduler(session_factory, settings, stop)
        if code == 0:
            log.info("shutdown complete")
        return code

    return database_command(run, err=sys.stderr)


def _run_scheduler(session_factory, settings: Settings, stop: threading.Event) -> int:
    """The scheduler and schedule loop of `scheduler`, until `stop` is set: 0, or 1 when the
    scheduler thread ended on its own."""
    from service.main import build_schedule_loop, build_scheduler

    runner = build_scheduler(session_factory, settings)
    schedules = build_schedule_loop(session_factory, settings, runner)
    runner.start()
    schedules.start()
    log.info("scheduler started", extra={"runner": runner.runner_id,
                                         "database": shown_url(settings.database_url)})
    try:
        while not stop.wait(1.0):
            if runner.join(0):
                log.error("the scheduler thread ended on its own")
                return 1
    finally:
        schedules.stop()
        if not runner.stop(SCHEDULER_STOP_TIMEOUT_S - 30):
            log.error("the scheduler did not stop in time")
        log.info("scheduler stopped")
        runner.ray.shutdown()
    return 0


def db_upgrade(*, database_url: str | None = None, revision: str = "head",
               out: TextIO = sys.stdout) -> int:
    """Apply the Alembic migrations (the service also does this when it starts)."""
    from service.db.engine import upgrade_database

    settings = cli_settings(database_url=database_url)

    def upgrade() -> int:
        at = upgrade_database(settings.database_url, revision)
        print(f"database {shown_url(settings.database_url)} at revision {at}", file=out)
        return 0

    return database_command(upgrade, err=sys.stderr)


def results(*, database_url: str | None = None, csv: bool = False, out: TextIO | None = None,
            err: TextIO | None = None, **filter_values) -> int:
    """Print succeeded trials from the database to `out` (default: the sys.stdout of the
    call): `filter_values` are GET /api/results' query parameters (lists for the repeatable
    ones; None or empty: not given). Without --db or DATABASE_URL it names the database it
    reads on `err`; a SQLite file that does not exist is refused, and not created."""
    out, err = sys.stdout if out is None else out, sys.stderr if err is None else err
    from pydantic import ValidationError

    from service.cli.database import database_session, database_to_read
    from service.cli.results_table import results_table
    from service.db.results_query import query_results
    from service.schemas.results import ResultFilters, to_csv
    from service.schemas.trials import TrialPublic
    from service.runs.admission import validation_text

    try:
        given = {name: value for name, value in filter_values.items() if value not in (None, [])}
        filters = ResultFilters(**given, format="csv" if csv else "json")
    except ValidationError as invalid:
        print(validation_text(invalid), file=err)
        return 2

    def show() -> int:
        with database_session(database_to_read(database_url, err=err)) as session:
            found, count = query_results(session=session, filters=filters)
            rows = TrialPublic.from_rows(found)
        out.write(to_csv(rows) if csv else results_table(rows, count))
        return 0

    return database_command(show, err=err)


def add_service_commands(sub: argparse._SubParsersAction) -> None:
    """Add serve, scheduler, results and db to the `gdn-sweep` sub-commands."""
    from service.cli.parsers import add_parsers

    add_parsers(sub, serve=serve, scheduler=scheduler, results=results, db_upgrade=db_upgrade)
