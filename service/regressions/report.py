"""Regressions over series: each series' shifts per metric (detect.py), the open regression of
each (its latest shift, when that is a regression: a later improvement supersedes it), the
improvements, worst first, with their environment diff and plot points.

Computed on read, not stored: a report is a pure function of the results, so it never goes
stale when results arrive late (a spool replay, a resumed sweep) or when the detector's
constants change, and it needs no backfill; one schedule's few thousand rows take
milliseconds. GET /api/regressions caches the answer per process under the results' counter
(service/db/read_cache.py). What *is* stored is what was alerted (alerts.py), so a webhook
fires once per regression.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Schedule, Sweep
from service.regressions.detect import Shift, detect_shifts
from service.regressions.environment import environment_diff, environment_of_result
from service.schemas.schedules import RegressionsPublic, RunRef, SeriesPoint, ShiftPublic
from service.regressions.series import METRICS, Run, Series, load_series


def latest_shift(series: Series, metric: str, *, upto: int | None = None
                 ) -> tuple[Shift, list[Run]] | None:
    """The latest shift of `metric` in `series` (its first `upto` runs only, if given), with
    the runs that measured it; None without one."""
    runs, points = series.values(metric)
    if upto is not None:
        runs, points = runs[:upto], points[:upto]
    shifts = detect_shifts([p.value for p in points], lows=[p.low for p in points],
                           highs=[p.high for p in points])
    return (shifts[-1], runs) if shifts else None


def is_regression(metric: str, shift: Shift) -> bool:
    return (shift.after > shift.before) == METRICS[metric]


def series_shifts(session: Session, series: Series, *, with_points: bool = True
                  ) -> list[ShiftPublic]:
    """The latest shift of each metric of `series` (regression or improvement); `new` when the
    series without its latest run does not show it."""
    found = []
    for metric in METRICS:
        latest = latest_shift(series, metric)
        if latest is None:
            continue
        shift, runs = latest
        before = latest_shift(series, metric, upto=len(runs) - 1)
        # seen before the latest run: the same move, at its run or one beside it (a new run
        # can move where the level is judged to start by one; it is no new regression)
        seen = before is not None and abs(before[0].index - shift.index) <= 1 and \
            (before[0].after > before[0].before) == (shift.after > shift.before)
        found.append(_public(session, series, metric, shift, runs, new=not seen,
                             with_points=with_points))
    return found


class ScopeError(ValueError):
    """A schedule name or sweep id that names nothing; str() says what is accepted."""


def resolve_scope(*, session: Session, schedule: str | None = None,
                  sweep_ids: Sequence[int] = ()) -> tuple[list[int] | None, list[int] | None]:
    """(schedule ids, sweep ids) for a report: the schedules named `schedule` (several may
    share a name), or the sweeps `sweep_ids` as one set, or every schedule. ScopeError for a
    name or id that matches nothing, or both given."""
    if schedule is not None and sweep_ids:
        raise ScopeError("give schedule or sweep_id, not both: a series is a trial key within "
                         "one schedule, or within the sweeps named")
    if sweep_ids:
        found = set(session.scalars(select(Sweep.id).where(Sweep.id.in_(list(sweep_ids)))))
        missing = sorted(set(sweep_ids) - found)
        if missing:
            raise ScopeError(f"sweep_id {', '.join(map(str, missing))}: no such sweep; give "
                             f"ids of existing sweeps (GET /api/sweeps)")
        return None, sorted(found)
    query = select(Schedule.id, Schedule.name).order_by(Schedule.id)
    rows = session.execute(query).all()
    if schedule is None:
        return [r.id for r in rows], None
    ids = [r.id for r in rows if r.name == schedule]
    if not ids:
        names = sorted({r.name for r in rows})
        known = ", ".join(repr(n) for n in names[:20]) or "none saved yet"
        raise ScopeError(f"schedule {schedule!r} names no schedule; known: {known}")
    return ids, None


def regressions_report(*, session: Session, schedule_ids: Sequence[int] | None = None,
                       sweep_ids: Sequence[int] | None = None,
                       metrics: Sequence[str] = ()) -> RegressionsPublic:
    """Open regressions (worst first) and improvements of the series of `schedule_ids`, or of
    the sweeps `sweep_ids`; only `metrics` if given."""
    all_series = load_series(session=session, schedule_ids=schedule_ids, sweep_ids=sweep_ids)
    shifts = [s for series in all_series for s in series_shifts(session, series)
              if not metrics or s.metric in metrics]
    worst_first = sorted(shifts, key=lambda s: (-_log_size(s), s.series, s.metric))
    open_ = [s for s in worst_first if s.kind == "regression"]
    return RegressionsPublic(data=open_, count=len(open_), new=sum(s.new for s in open_),
                             improvements=[s for s in worst_first if s.kind == "improvement"],
                             series=len(all_series))


def _log_size(shift: ShiftPublic) -> float:
    return abs(math.log(shift.after / shift.before))


def _ref(run: Run) -> RunRef:
    return RunRef(sweep_id=run.sweep_id, sweep_name=run.sweep_name, at=run.at)


def _public(session: Session, series: Series, metric: str, shift: Shift, runs: list[Run], *,
            new: bool, with_points: bool) -> ShiftPublic:
    first, last_before = runs[shift.index], runs[shift.index - 1]
    diff = environment_diff(environment_of_result(session, last_before.trial_id),
                            environment_of_result(session, first.trial_id))
    points = [SeriesPoint(**_ref(r).model_dump(), value=r.points[metric].value,
                          low=r.points[metric].low, high=r.points[metric].high)
              for r in runs] if with_points else []
    return ShiftPublic(
        schedule_id=series.schedule_id, schedule_name=series.schedule_name, series=series.key,
        metric=metric, kind="regression" if is_regression(metric, shift) else "improvement",
        before=shift.before, after=shift.after, relative_change=shift.relative,
        spread=shift.spread, first_run=_ref(first), last_run_before=_ref(last_before),
        runs_after=len(runs) - shift.index, new=new, environment_diff=diff, points=points)
