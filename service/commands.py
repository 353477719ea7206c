"""The service's `gdn-sweep` actions: serve, results, db upgrade, run (a sweep into the DB).

Each is a plain function returning an exit code; `add_service_commands` adds them to the CLI's
argparse sub-commands (service/cli.py wires them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from .core.config import Settings


def _settings(**overrides) -> Settings:
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def serve(*, host: str = "127.0.0.1", port: int = 8000, database_url: str | None = None,
          ray_address: str | None = None, log_level: str = "info") -> int:
    """Run the API, dashboard and scheduler (one process: exactly one scheduler per DB)."""
    import uvicorn

    from .main import create_app

    settings = _settings(database_url=database_url, ray_address=ray_address)
    if host not in ("127.0.0.1", "localhost", "::1") and not settings.api_token:
        print(f"warning: serving on {host} with no GDN_SWEEP_API_TOKEN: anyone who reaches it "
              "can start and cancel sweeps", file=sys.stderr)
    print(f"gdn-sweep: dashboard on http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/ "
          f"(database {_shown(settings.database_url)})", file=sys.stderr)
    try:
        uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, workers=1)
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
        return 130
    return 0


def db_upgrade(*, database_url: str | None = None, revision: str = "head",
               out: TextIO = sys.stdout) -> int:
    """Apply the Alembic migrations (the service also does this when it starts)."""
    from .core.db import upgrade_database

    settings = _settings(database_url=database_url)
    at = upgrade_database(settings.database_url, revision)
    print(f"database {_shown(settings.database_url)} at revision {at}", file=out)
    return 0


def results(*, database_url: str | None = None, preset: list[str] | None = None,
            framework: list[str] | None = None, mode: list[str] | None = None,
            chips: list[int] | None = None, seq_len_min: int | None = None,
            seq_len_max: int | None = None, accelerator: list[str] | None = None,
            dtype: list[str] | None = None, param_sharding: list[str] | None = None,
            remat: list[str] | None = None, repeat: list[int] | None = None,
            sweep_id: int | None = None,
            sort: str = "-tokens_per_s_per_chip", limit: int | None = 50, csv: bool = False,
            out: TextIO = sys.stdout) -> int:
    """Print succeeded trials from the database (same filters as GET /api/results)."""
    from pydantic import ValidationError

    from .core.db import make_engine, make_session_factory, upgrade_database
    from .results_query import ResultFilters, query_results, to_csv

    settings = _settings(database_url=database_url)
    try:
        filters = ResultFilters(
            preset=preset or [], framework=framework or [], mode=mode or [], chips=chips or [],
            seq_len_min=seq_len_min, seq_len_max=seq_len_max, accelerator=accelerator or [],
            dtype=dtype or [], param_sharding=param_sharding or [], remat=remat or [],
            repeat=repeat or [], sweep_id=sweep_id, sort=sort, limit=limit,
            format="csv" if csv else "json")
    except ValidationError as err:
        print(_validation_text(err), file=sys.stderr)
        return 2
    upgrade_database(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            rows, count = query_results(session=session, filters=filters)
    finally:
        engine.dispose()
    if csv:
        out.write(to_csv(rows))
        return 0
    from .results_query import to_table

    out.write(to_table(rows, count))
    return 0


def run_with_db(spec_path: str | Path, *, database_url: str | None = None,
                ray_address: str | None = None, max_concurrent_trials: int | None = None,
                cpu_chips: int | None = None, resume_sweep_id: int | None = None,
                progress: bool = True, out: TextIO = sys.stderr, driver_options=None) -> int:
    """Run the sweep of a YAML file in the foreground into the database, with a progress bar.

    The sweep shows up in the dashboard like one submitted through the API. With
    `resume_sweep_id`, the trials of that sweep without a result run again (the file is not
    read); running the same file again resumes an unfinished identical sweep. Ctrl-C stops
    (running trials are killed) and leaves the sweep to resume. `driver_options` is a
    workers.options.DriverOptions (placement/start timeouts, retries, warm reuse).
    """
    from .foreground import run_sweep_into_db

    settings = _settings(database_url=database_url, ray_address=ray_address,
                         max_concurrent_trials=max_concurrent_trials, cpu_chips=cpu_chips)
    return run_sweep_into_db(spec_path, settings=settings, resume_sweep_id=resume_sweep_id,
                             progress=progress, out=out, driver_options=driver_options)


def add_service_commands(sub: argparse._SubParsersAction, *, include_run: bool = True) -> None:
    """Add serve, results, db and (optionally) run to the `gdn-sweep` sub-commands."""
    from .cli_parsers import add_parsers

    add_parsers(sub, include_run=include_run, serve=serve, results=results,
                db_upgrade=db_upgrade, run_with_db=run_with_db)


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _validation_text(err) -> str:
    return "\n".join(f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}"
                     for e in err.errors())
