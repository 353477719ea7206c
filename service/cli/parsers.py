"""argparse definitions of the service's `gdn-sweep` sub-commands (actions in commands.py)."""

from __future__ import annotations

import argparse

from gdn_core.train_config import COMPUTE_DTYPES, FRAMEWORKS, PARAM_SHARDINGS, REMATS
from gdn_core.config import LAYERS
from gdn_core.cp_layout import LAYOUTS
from gdn_core.cp_modes import ATTN_CP_MODES
from gdn_core.kernels import KERNELS
from workers.grid import TRIAL_MODES
from workers.sweep_spec import TRIAL_KINDS

DB_HELP = ("database URL (default: $DATABASE_URL, else sqlite:///gdn_sweep.db in the current "
           "folder)")
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_parsers(sub: argparse._SubParsersAction, *, serve, scheduler, results,
                db_upgrade) -> None:
    p = sub.add_parser("serve", help="run the REST API, dashboard and scheduler")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--db", dest="database_url", help=DB_HELP)
    p.add_argument("--ray-address", help="Ray cluster (default: $RAY_ADDRESS; empty: local)")
    p.add_argument("--workers", type=_positive, default=1,
                   help="API worker processes (default 1, with the scheduler inside; more: "
                        "the scheduler runs in a process of its own, started and stopped "
                        "with the service)")
    p.add_argument("--log-level", choices=LOG_LEVELS, help="default $GDN_SWEEP_LOG_LEVEL, info")
    p.add_argument("--no-access-log", dest="access_log", action="store_false",
                   help="no log line per HTTP request")
    p.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve beyond loopback without GDN_SWEEP_API_TOKEN, on purpose "
                        "(refused otherwise; the dashboard shows a banner)")
    p.set_defaults(run=lambda a: serve(host=a.host, port=a.port, database_url=a.database_url,
                                       ray_address=a.ray_address, log_level=a.log_level,
                                       workers=a.workers, access_log=a.access_log,
                                       allow_unauthenticated=a.allow_unauthenticated))

    p = sub.add_parser("scheduler", help="run the scheduler alone (no HTTP): sweeps queued "
                       "in the database run here; for `serve` processes started with "
                       "GDN_SWEEP_RUN_SCHEDULER=false")
    p.add_argument("--db", dest="database_url", help=DB_HELP)
    p.add_argument("--ray-address", help="Ray cluster (default: $RAY_ADDRESS; empty: local)")
    p.add_argument("--log-level", choices=LOG_LEVELS, help="default $GDN_SWEEP_LOG_LEVEL, info")
    p.set_defaults(run=lambda a: scheduler(database_url=a.database_url,
                                           ray_address=a.ray_address, log_level=a.log_level))

    p = sub.add_parser("results", help="print succeeded trials from the database: a table "
                       "(one number format per column, memory in GiB) or --csv")
    p.add_argument("--db", dest="database_url", help=DB_HELP)
    p.add_argument("--kind", action="append", choices=TRIAL_KINDS,
                   help="measure (default) or plan (compile-only trials); repeat for both")
    p.add_argument("--preset", action="append")
    p.add_argument("--framework", action="append", choices=FRAMEWORKS)
    p.add_argument("--mode", action="append", choices=TRIAL_MODES,
                   help="a CP mode, or none (the one-chip baselines)")
    p.add_argument("--chips", action="extend", type=_int_list,
                   help="all chips of a trial's mesh; comma-separated or repeated: 2,4")
    p.add_argument("--dp", action="extend", type=_int_list,
                   help="data-parallel replicas (1: one CP group over every chip); "
                        "comma-separated or repeated: 1,2")
    p.add_argument("--seq-len-min", type=int)
    p.add_argument("--seq-len-max", type=int)
    p.add_argument("--accelerator", action="append", help="chip type: cpu, h100, v5p, …")
    p.add_argument("--dtype", action="append", choices=COMPUTE_DTYPES)
    p.add_argument("--param-sharding", action="append", choices=PARAM_SHARDINGS)
    p.add_argument("--remat", action="append", choices=REMATS)
    p.add_argument("--layers", action="append", choices=LAYERS,
                   help="the decoder: gdn_only or hybrid")
    p.add_argument("--attn-cp", action="append", choices=ATTN_CP_MODES,
                   help="the hybrid's attention CP mode")
    p.add_argument("--layout", action="append", choices=LAYOUTS)
    p.add_argument("--kernels", action="append", choices=KERNELS,
                   help="reference (this project's code) or fused (library kernels)")
    p.add_argument("--documents", action="append",
                   help="how sequences were packed: single, or uniform:LO-HI; repeat for "
                        "several")
    p.add_argument("--repeat", action="append", type=int,
                   help="run of a repeated grid point (0, 1, …)")
    p.add_argument("--sweep-id", type=int)
    p.add_argument("--sort", default="-tokens_per_s_per_chip",
                   help="comma-separated keys, '-' for descending (see GET /api/results)")
    p.add_argument("--limit", type=int, default=None,
                   help="rows to print (default 50; CSV: all)")
    p.add_argument("--csv", action="store_true", help="CSV on stdout")
    p.set_defaults(run=lambda a: results(
        database_url=a.database_url, csv=a.csv, kind=a.kind, preset=a.preset,
        framework=a.framework, mode=a.mode, chips=a.chips, dp=a.dp, seq_len_min=a.seq_len_min,
        seq_len_max=a.seq_len_max, accelerator=a.accelerator, dtype=a.dtype,
        param_sharding=a.param_sharding, remat=a.remat, layers=a.layers, attn_cp=a.attn_cp,
        layout=a.layout, kernels=a.kernels, documents=a.documents, repeat=a.repeat,
        sweep_id=a.sweep_id,
        sort=a.sort, limit=a.limit if a.limit is not None or a.csv else 50))

    p = sub.add_parser("db", help="database maintenance: `db upgrade` applies the Alembic "
                       "migrations")
    db_sub = p.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="apply the Alembic migrations")
    up.add_argument("--db", dest="database_url", help=DB_HELP)
    up.add_argument("--revision", default="head")
    up.set_defaults(run=lambda a: db_upgrade(database_url=a.database_url, revision=a.revision))

    from service.cli.plan import add_plan_parser
    from service.cli.regressions import add_regressions_parser
    from service.cli.schedule import add_schedule_parser

    add_plan_parser(sub, DB_HELP)
    add_schedule_parser(sub, DB_HELP)
    add_regressions_parser(sub, DB_HELP)


def _int_list(text: str) -> list[int]:
    """`2,4` (or `2`): the integers of a comma-separated option value."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers, e.g. 1,2") from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value
