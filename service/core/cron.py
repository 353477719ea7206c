"""Cron expressions in an IANA time zone (croniter + zoneinfo): checking them, the next due
time after an instant, the latest due time at or before one.

Instants in and out are aware UTC datetimes; a cron expression names local wall-clock times of
its zone. Daylight-saving changes (croniter walks the zone's own offsets):
- a local time in the spring-forward gap does not exist: its tick comes at the first time
  after the gap (a `30 2 * * *` job in Europe/Berlin fires at 03:00 CEST that day), once;
- a local time in the autumn fold exists twice: a job with fixed hours fires at the first of the
  two only (a nightly job runs once a night); a job whose hour field is `*` fires at both, as
  the hours really pass.
"""

from __future__ import annotations

import datetime as dt
import functools
import zoneinfo

from croniter import croniter

CRON_FORM = ("five fields, minute hour day-of-month month day-of-week, e.g. '0 2 * * *' "
             "(02:00 every day) or '*/15 * * * *' (every 15 minutes)")
TIMEZONE_FORM = "an IANA time zone name such as UTC, Europe/Berlin or America/New_York"
_MAX_STEPS = 1000
"""Ticks one search may pass over (skipped fold repeats, zones with odd transitions)."""


@functools.cache
def known_timezones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def check_timezone(name: str) -> str:
    """`name` if it is an IANA time zone this host knows (ValueError naming it otherwise)."""
    if name not in known_timezones():
        raise ValueError(f"unknown time zone {name!r}; use {TIMEZONE_FORM}")
    return name


def check_cron(expr: str) -> str:
    """`expr` with its fields separated by single spaces, if it is a five-field cron expression
    croniter reads and that is ever due (ValueError naming it and the accepted form)."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"cron {expr!r} has {len(fields)} field(s); use {CRON_FORM}")
    normal = " ".join(fields)
    try:
        valid = croniter.is_valid(normal)
    except Exception:  # noqa: BLE001 - croniter raises assorted errors on odd input
        valid = False
    if not valid:
        raise ValueError(f"cron {expr!r} is not a cron expression croniter reads; use "
                         f"{CRON_FORM}")
    try:
        next_due(normal, "UTC", dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    except Exception as err:  # noqa: BLE001 - e.g. '0 0 31 2 *' (CroniterBadDateError)
        raise ValueError(f"cron {expr!r} is never due ({err}); use {CRON_FORM}") from None
    return normal


def next_due(cron: str, timezone: str, after: dt.datetime) -> dt.datetime:
    """The first due time of `cron` in `timezone` strictly after `after` (UTC)."""
    zone = zoneinfo.ZoneInfo(timezone)
    ticks = croniter(cron, after.astimezone(zone))
    for _ in range(_MAX_STEPS):
        due = ticks.get_next(dt.datetime).astimezone(dt.UTC)
        if due > after and not _skipped_repeat(cron, due, zone):
            return due
    raise ValueError(f"cron {cron!r} has no due time after {after.isoformat()}")


def latest_due(cron: str, timezone: str, at: dt.datetime) -> dt.datetime:
    """The last due time of `cron` in `timezone` at or before `at` (UTC)."""
    zone = zoneinfo.ZoneInfo(timezone)
    # ticks are whole minutes: from the next whole second back, `at` itself counts
    start = at.replace(microsecond=0) + dt.timedelta(seconds=1)
    ticks = croniter(cron, start.astimezone(zone))
    for _ in range(_MAX_STEPS):
        due = ticks.get_prev(dt.datetime).astimezone(dt.UTC)
        if due <= at and not _skipped_repeat(cron, due, zone):
            return due
    raise ValueError(f"cron {cron!r} has no due time before {at.isoformat()}")


def local_time(instant: dt.datetime, timezone: str) -> dt.datetime:
    return instant.astimezone(zoneinfo.ZoneInfo(timezone))


def _skipped_repeat(cron: str, due: dt.datetime, zone: zoneinfo.ZoneInfo) -> bool:
    """Whether `due` is the second pass of a local time the autumn fold repeats, for a job with
    fixed hours (those fire once a night; see the module docstring)."""
    local = due.astimezone(zone)
    if local.fold == 0 or local.replace(fold=0).utcoffset() == local.utcoffset():
        return False
    return not _every_hour(cron)


@functools.lru_cache(maxsize=256)
def _every_hour(cron: str) -> bool:
    hours = croniter(cron).expanded[1]
    return hours == ["*"] or len(set(hours)) == 24
