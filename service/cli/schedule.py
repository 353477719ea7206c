"""`gdn-sweep schedule add|list|show|pause|resume|delete`: schedules in the database, written
directly with the API's crud (a running service fires them; no HTTP involved).

Bad input (cron, time zone, sweep file, unknown id) is one line on stderr, exit 2, nothing
written; an unreachable database is one line, exit 1 (so is a SQLite file that does not
exist, except for `add`, which creates the database: service/cli/database.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from service.cli.database import database_command, database_session, database_to_read
from service.core.exit_codes import EXIT_BAD_INPUT


class ScheduleInputError(ValueError):
    """Input the command refuses; str() is the one line to print."""


def add_schedule_parser(sub, db_help: str) -> None:
    p = sub.add_parser("schedule", help="sweeps on a cron schedule: add, list, show, pause, "
                       "resume, delete (fired by every running service or scheduler)")
    actions = p.add_subparsers(dest="schedule_command", required=True)
    add = actions.add_parser("add", help="save a sweep YAML as a schedule")
    add.add_argument("sweep", help="sweep YAML (the body of POST /api/sweeps)")
    add.add_argument("--name", required=True, help="the schedule's name")
    add.add_argument("--cron", required=True,
                     help="five-field cron expression, e.g. '0 2 * * *' (02:00 daily)")
    add.add_argument("--timezone", default="UTC",
                     help="IANA time zone the cron expression is read in (default UTC)")
    add.add_argument("--paused", action="store_true", help="save it paused")
    add.add_argument("--allow-overlap", action="store_true",
                     help="queue a sweep on every tick even while the previous one runs")
    add.add_argument("--webhook", metavar="URL",
                     help="http(s) URL POSTed a JSON summary when a sweep opens new regressions")
    add.set_defaults(action=_add)
    for name, action, text in (("list", _list, "every schedule, newest first"),
                               ("show", _show, "one schedule and its latest ticks"),
                               ("pause", _pause, "stop firing until resumed"),
                               ("resume", _resume, "fire again from the next due time"),
                               ("delete", _delete, "delete it (its sweeps stay)")):
        q = actions.add_parser(name, help=text)
        if name != "list":
            q.add_argument("schedule_id", type=int, metavar="ID")
        q.set_defaults(action=action)
    for q in (add, *(actions.choices[n] for n in ("list", "show", "pause", "resume",
                                                   "delete"))):
        q.add_argument("--db", dest="database_url", help=db_help)
    p.set_defaults(run=run_schedule)


def run_schedule(args: argparse.Namespace, out: TextIO | None = None,
                 err: TextIO | None = None) -> int:
    """Run the chosen action; one line on `err` and a non-zero exit for any refusal."""
    from service.core.config import Settings

    out, err = out or sys.stdout, err or sys.stderr

    def act() -> int:
        url = args.database_url
        if args.action is not _add:  # only add creates a database; the rest read one
            url = database_to_read(url, err=err)
        settings = Settings(**({"database_url": url} if url else {}))
        try:
            return args.action(args, settings, out)
        except ScheduleInputError as refused:
            print(refused, file=err)
            return EXIT_BAD_INPUT

    return database_command(act, err=err)


def _one_line(text: str) -> str:
    """A message of several lines as one: `file: not a valid sweep: a: …; b: …`."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        lines[:2] = [f"{lines[0]} {lines[1]}"]
    return "; ".join(lines)


def _schedule_create(args, grid_cap: int):
    """The ScheduleCreate of `add`'s arguments, checked as POST /api/schedules checks one."""
    from pydantic import ValidationError

    from service.core.cron import check_cron, check_timezone
    from service.schemas.schedules import ScheduleCreate
    from service.runs.admission import validation_text
    from service.runs.sweep_file import SweepFileError, load_spec

    try:
        check_cron(args.cron)
        check_timezone(args.timezone)
        spec = load_spec(args.sweep, grid_cap=grid_cap)
        return ScheduleCreate(name=args.name, cron=args.cron, timezone=args.timezone,
                              spec=spec, paused=args.paused, allow_overlap=args.allow_overlap,
                              webhook_url=args.webhook)
    except ValidationError as err:
        raise ScheduleInputError(_one_line(validation_text(err))) from None
    except (SweepFileError, ValueError) as err:
        raise ScheduleInputError(_one_line(str(err))) from None


def _add(args, settings, out: TextIO) -> int:
    from service.db import crud

    schedule_in = _schedule_create(args, settings.grid_cap)  # before touching the database
    with database_session(settings.database_url) as session:
        schedule = crud.create_schedule(session=session, **schedule_in.columns())
        (shown,) = _public(session, [schedule])
    print(f"schedule {shown.id} saved: {shown.name!r} {shown.cron} ({shown.timezone}), next run "
          f"{_when(shown.next_run_at, shown.timezone)}", file=out)
    return 0


def _public(session, schedules) -> list:
    """SchedulePublic of each of `schedules`, with its latest runs and sweep count."""
    from service.db import crud
    from service.schemas.schedules import SchedulePublic

    activity = crud.schedule_activity(session=session, schedule_ids=[s.id for s in schedules])
    return SchedulePublic.from_rows(schedules, activity)


def _get(session, schedule_id: int):
    from service.db import crud

    schedule = crud.get_schedule(session=session, schedule_id=schedule_id)
    if schedule is None:
        raise ScheduleInputError(f"schedule {schedule_id} not found (see `gdn-sweep schedule "
                                 "list`)")
    return schedule


def _when(instant, timezone: str) -> str:
    from service.core.cron import local_time

    if instant is None:
        return "-"
    return local_time(instant, timezone).strftime("%Y-%m-%d %H:%M %Z")


def _list(args, settings, out: TextIO) -> int:
    from service.db import crud

    with database_session(settings.database_url) as session:
        schedules, count = crud.list_schedules(session=session)
        shown = _public(session, schedules)
    rows = [("id", "name", "cron", "tz", "paused", "next run", "last run", "sweeps")]
    rows += [(str(s.id), s.name, s.cron, s.timezone, "yes" if s.paused else "no",
              _when(s.next_run_at, s.timezone), _when(s.last_run_at, s.timezone),
              str(s.sweeps_created)) for s in shown]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), file=out)
    print(f"{count} schedule(s)", file=out)
    return 0


def _show(args, settings, out: TextIO) -> int:
    with database_session(settings.database_url) as session:
        (s,) = _public(session, [_get(session, args.schedule_id)])
    print(f"schedule {s.id}: {s.name!r}\n  cron {s.cron} ({s.timezone}), "
          f"{'paused' if s.paused else 'active'}, overlap "
          f"{'allowed' if s.allow_overlap else 'skipped'}\n  next run "
          f"{_when(s.next_run_at, s.timezone)}, last run {_when(s.last_run_at, s.timezone)}, "
          f"{s.sweeps_created} sweep(s) created\n  sweep: {s.spec.name!r}, "
          f"{s.spec.grid_size} trial(s)", file=out)
    if s.webhook_url is not None:
        last = ("no delivery yet" if s.webhook_status is None else
                f"last delivery {s.webhook_status} {s.webhook_at:%Y-%m-%d %H:%M} UTC"
                + (f": {s.webhook_error}" if s.webhook_error else ""))
        print(f"  webhook {s.webhook_url} ({last})", file=out)
    for run in s.runs:
        what = f"sweep {run.sweep_id}" if run.sweep_id is not None else run.error or ""
        print(f"  {_when(run.due_at, s.timezone)}  {run.outcome}  {what}".rstrip(), file=out)
    return 0


def _set_paused(args, settings, out: TextIO, paused: bool) -> int:
    from service.db import crud

    with database_session(settings.database_url) as session:
        schedule = crud.update_schedule(session=session,
                                        schedule=_get(session, args.schedule_id),
                                        changes={"paused": paused})
    state = ("paused" if paused else
             f"active, next run {_when(schedule.next_run_at, schedule.timezone)}")
    print(f"schedule {schedule.id} {state}", file=out)
    return 0


def _pause(args, settings, out: TextIO) -> int:
    return _set_paused(args, settings, out, True)


def _resume(args, settings, out: TextIO) -> int:
    return _set_paused(args, settings, out, False)


def _delete(args, settings, out: TextIO) -> int:
    from service.db import crud

    with database_session(settings.database_url) as session:
        crud.delete_schedule(session=session, schedule=_get(session, args.schedule_id))
    print(f"schedule {args.schedule_id} deleted (the sweeps it created stay)", file=out)
    return 0
