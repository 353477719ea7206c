"""`gdn-sweep regressions [--schedule NAME | --sweep-id N ...] [--json]`: the open regressions
GET /api/regressions answers, worst first, read from the database directly.

Exit status, for cron: 0 none is new, 3 a new regression is open (first seen with its series'
latest run), 2 bad input (a schedule or sweep that does not exist), 1 database unreachable
(or a SQLite file that does not exist: nothing is created; service/cli/database.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from service.core.exit_codes import EXIT_BAD_INPUT

EXIT_NEW_REGRESSION = 3
_UNITS = {"step_time_s": "s", "tokens_per_s_per_chip": "tokens/s/chip",
          "peak_memory_bytes_per_chip": "B"}


def add_regressions_parser(sub, db_help: str) -> None:
    p = sub.add_parser("regressions", help="open regressions of scheduled sweeps, worst first; "
                       f"exit {EXIT_NEW_REGRESSION} when a new one is open (for cron)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--schedule", metavar="NAME", help="only this schedule's series")
    scope.add_argument("--sweep-id", type=int, action="append", metavar="N",
                       help="the series of these sweeps instead (repeat it)")
    p.add_argument("--json", action="store_true", help="GET /api/regressions' JSON")
    p.add_argument("--db", dest="database_url", help=db_help)
    p.set_defaults(run=run_regressions)


def run_regressions(args: argparse.Namespace, out: TextIO | None = None,
                    err: TextIO | None = None) -> int:
    from service.cli.database import database_command, database_session, database_to_read
    from service.regressions.report import ScopeError, regressions_report, resolve_scope

    out, err = out or sys.stdout, err or sys.stderr

    def report_regressions() -> int:
        with database_session(database_to_read(args.database_url, err=err)) as session:
            try:
                schedule_ids, sweep_ids = resolve_scope(
                    session=session, schedule=args.schedule, sweep_ids=args.sweep_id or ())
            except ScopeError as refused:
                print(refused, file=err)
                return EXIT_BAD_INPUT
            report = regressions_report(session=session, schedule_ids=schedule_ids,
                                        sweep_ids=sweep_ids)
        if args.json:
            print(report.model_dump_json(indent=2), file=out)
        else:
            _print_report(report, out)
        return EXIT_NEW_REGRESSION if report.new else 0

    return database_command(report_regressions, err=err)


def _print_report(report, out: TextIO) -> None:
    rows = [("", "change", "metric", "before → after", "from run", "series", "schedule",
             "environment")]
    for s in report.data:
        rows.append(("NEW" if s.new else "", f"{s.relative_change:+.1%}", s.metric,
                     f"{_figure(s.before, s.metric)} → {_figure(s.after, s.metric)}",
                     f"sweep {s.first_run.sweep_id} ({s.first_run.at:%Y-%m-%d %H:%M} UTC, "
                     f"{s.runs_after} run(s))", s.series, s.schedule_name or "-",
                     _diff_text(s.environment_diff)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    if report.data:
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)
    print(f"{report.count} open regression(s), {report.new} new; {len(report.improvements)} "
          f"improvement(s); {report.series} series", file=out)


def _figure(value: float, metric: str) -> str:
    return f"{value:.4g} {_UNITS[metric]}"


def _diff_text(diff: dict | None) -> str:
    """What changed in the environment, or why it is not known."""
    if diff is None:
        return "not recorded"
    return "; ".join(f"{k}: {v['before']} → {v['after']}" for k, v in diff.items()) or "same"
