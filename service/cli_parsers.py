"""argparse definitions of the service's `gdn-sweep` sub-commands (actions in commands.py)."""

from __future__ import annotations

import argparse

from gdn_core.train_config import COMPUTE_DTYPES, PARAM_SHARDINGS, REMATS
from workers.spec import FRAMEWORKS, TRIAL_MODES

DB_HELP = "database URL (default: $DATABASE_URL, else sqlite:///gdn_sweep.db)"


def add_parsers(sub: argparse._SubParsersAction, *, include_run: bool, serve, results,
                db_upgrade, run_with_db) -> None:
    p = sub.add_parser("serve", help="run the REST API, dashboard and scheduler")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--db", dest="database_url", help=DB_HELP)
    p.add_argument("--ray-address", help="Ray cluster (default: $RAY_ADDRESS; empty: local)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(run=lambda a: serve(host=a.host, port=a.port, database_url=a.database_url,
                                       ray_address=a.ray_address, log_level=a.log_level))

    p = sub.add_parser("results", help="print succeeded trials from the database")
    p.add_argument("--db", dest="database_url", help=DB_HELP)
    p.add_argument("--preset", action="append")
    p.add_argument("--framework", action="append", choices=FRAMEWORKS)
    p.add_argument("--mode", action="append", choices=TRIAL_MODES,
                   help="a CP mode, or none (the one-chip baselines)")
    p.add_argument("--chips", action="append", type=int)
    p.add_argument("--seq-len-min", type=int)
    p.add_argument("--seq-len-max", type=int)
    p.add_argument("--accelerator", action="append", help="chip type: cpu, h100, v5p, …")
    p.add_argument("--dtype", action="append", choices=COMPUTE_DTYPES)
    p.add_argument("--param-sharding", action="append", choices=PARAM_SHARDINGS)
    p.add_argument("--remat", action="append", choices=REMATS)
    p.add_argument("--repeat", action="append", type=int,
                   help="run of a repeated grid point (0, 1, …)")
    p.add_argument("--sweep-id", type=int)
    p.add_argument("--sort", default="-tokens_per_s_per_chip",
                   help="comma-separated keys, '-' for descending (see GET /api/results)")
    p.add_argument("--limit", type=int, default=None,
                   help="rows to print (default 50; CSV: all)")
    p.add_argument("--csv", action="store_true", help="CSV on stdout")
    p.set_defaults(run=lambda a: results(
        database_url=a.database_url, preset=a.preset, framework=a.framework, mode=a.mode,
        chips=a.chips, seq_len_min=a.seq_len_min, seq_len_max=a.seq_len_max,
        accelerator=a.accelerator, dtype=a.dtype, param_sharding=a.param_sharding,
        remat=a.remat, repeat=a.repeat, sweep_id=a.sweep_id, sort=a.sort,
        limit=a.limit if a.limit is not None or a.csv else 50, csv=a.csv))

    p = sub.add_parser("db", help="database maintenance")
    db_sub = p.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="apply the Alembic migrations")
    up.add_argument("--db", dest="database_url", help=DB_HELP)
    up.add_argument("--revision", default="head")
    up.set_defaults(run=lambda a: db_upgrade(database_url=a.database_url, revision=a.revision))

    if not include_run:
        return
    p = sub.add_parser("run", help="run a sweep YAML in the foreground into the database")
    p.add_argument("spec", nargs="?", help="sweep YAML (the POST /api/sweeps body)")
    p.add_argument("--db", dest="database_url", help=DB_HELP)
    p.add_argument("--ray-address", help="Ray cluster (default: $RAY_ADDRESS; empty: local)")
    p.add_argument("--max-concurrent-trials", type=int)
    p.add_argument("--cpu-chips", type=int, help="virtual CPU chips of a local Ray")
    p.add_argument("--resume", type=int, dest="resume_sweep_id", metavar="SWEEP_ID",
                   help="finish a recorded sweep instead of reading a file")
    p.add_argument("--no-progress", action="store_true")

    def _run(a: argparse.Namespace) -> int:
        if a.spec is None and a.resume_sweep_id is None:
            p.error("give a sweep YAML file or --resume SWEEP_ID")
        return run_with_db(a.spec, database_url=a.database_url, ray_address=a.ray_address,
                           max_concurrent_trials=a.max_concurrent_trials,
                           cpu_chips=a.cpu_chips, resume_sweep_id=a.resume_sweep_id,
                           progress=not a.no_progress)

    p.set_defaults(run=_run)
