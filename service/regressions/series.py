"""Series of runs from the results table: one series per trial key (its `/repeat=r` left out)
within a schedule, or within a set of sweeps a user names; one run per sweep, in the order the
sweeps were created.

A run's value for a metric is the median over the point's repeats in that sweep, its low and
high the repeats' extremes (for step time, the fastest and slowest measured step of any repeat;
tokens/s/chip follows the step's spread). Only succeeded measure trials count, and none that
ran a kernel through its interpreter (service/db/interpreted.py): its step time is the
interpreter's, and its memory the interpreter's buffers — no level to watch.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import statistics
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.interpreted import compiled_kernels
from service.db.models import Result, Schedule, Sweep, Trial

METRICS: dict[str, bool] = {
    "step_time_s": True,
    "tokens_per_s_per_chip": False,
    "peak_memory_bytes_per_chip": True,
}
"""The metrics watched, and whether a higher value is worse (a regression when it rises)."""
_REPEAT = re.compile(r"/repeat=\d+$")


@dataclasses.dataclass(frozen=True)
class Point:
    """One run's figure for one metric."""

    value: float
    low: float
    high: float


@dataclasses.dataclass(frozen=True)
class Run:
    """One sweep's trials of a series."""

    sweep_id: int
    sweep_name: str
    at: dt.datetime
    """When the sweep was created (for a schedule's sweep: just after its due time)."""
    trial_id: int
    """The trial of its first repeat (whose environment stands for the run)."""
    points: dict[str, Point]
    """metric → its figure; a metric the run did not measure is absent."""


@dataclasses.dataclass(frozen=True)
class Series:
    key: str
    """The trial key without `/repeat=r`."""
    schedule_id: int | None
    schedule_name: str | None
    runs: tuple[Run, ...]

    def values(self, metric: str) -> tuple[list[Run], list[Point]]:
        """The runs that measured `metric`, and their figures."""
        kept = [r for r in self.runs if metric in r.points]
        return kept, [r.points[metric] for r in kept]


def series_key(trial_key: str) -> str:
    """`trial_key` without its `/repeat=r`: the repeats of a point are one run."""
    return _REPEAT.sub("", trial_key)


_COLUMNS = (Result.trial_id, Result.sweep_id, Trial.key, Result.repeat, Result.step_time_s,
            Result.step_time_min_s, Result.step_time_max_s, Result.tokens_per_s_per_chip,
            Result.peak_memory_bytes_per_chip)


def load_series(*, session: Session, schedule_ids: Sequence[int] | None = None,
                sweep_ids: Sequence[int] | None = None,
                before_sweep_id: int | None = None) -> list[Series]:
    """The series of the sweeps that `schedule_ids` created (each schedule its own series) or
    of `sweep_ids` (one set), runs oldest first; `before_sweep_id`: only runs of sweeps
    created up to that one (the series as a given sweep left them)."""
    sweeps = select(Sweep.id, Sweep.name, Sweep.created_at, Sweep.schedule_id)
    if sweep_ids is not None:
        sweeps = sweeps.where(Sweep.id.in_(list(sweep_ids)))
    else:
        sweeps = sweeps.where(Sweep.schedule_id.in_(list(schedule_ids or ())))
    meta = {row.id: row for row in session.execute(sweeps)}
    if before_sweep_id is not None and before_sweep_id in meta:
        last = (meta[before_sweep_id].created_at, before_sweep_id)
        meta = {i: m for i, m in meta.items() if (m.created_at, i) <= last}
    if not meta:
        return []
    names = dict(session.execute(select(Schedule.id, Schedule.name).where(
        Schedule.id.in_({m.schedule_id for m in meta.values()} - {None}))).all())
    rows = session.execute(select(*_COLUMNS).join(Trial, Trial.id == Result.trial_id).where(
        Result.sweep_id.in_(list(meta)), Result.status == "succeeded",
        Result.kind == "measure", compiled_kernels())).all()
    grouped: dict[tuple, dict[int, list]] = {}
    for row in rows:
        group = None if sweep_ids is not None else meta[row.sweep_id].schedule_id
        grouped.setdefault((group, series_key(row.key)), {}).setdefault(row.sweep_id,
                                                                       []).append(row)
    series = []
    for (schedule_id, key), by_sweep in sorted(grouped.items(), key=lambda kv: (
            kv[0][0] or 0, kv[0][1])):
        order = sorted(by_sweep, key=lambda s: (_utc(meta[s].created_at), s))
        runs = tuple(Run(sweep_id=s, sweep_name=meta[s].name, at=_utc(meta[s].created_at),
                         trial_id=min(by_sweep[s], key=lambda r: r.repeat).trial_id,
                         points=_points(by_sweep[s])) for s in order)
        series.append(Series(key=key, schedule_id=schedule_id,
                             schedule_name=names.get(schedule_id), runs=runs))
    return series


def _points(rows: list) -> dict[str, Point]:
    """The run's figure per metric, from its repeats' rows (module docstring)."""
    points = {}
    steps = [r for r in rows if r.step_time_s]
    if steps:
        points["step_time_s"] = Point(
            statistics.median(r.step_time_s for r in steps),
            min(r.step_time_min_s or r.step_time_s for r in steps),
            max(r.step_time_max_s or r.step_time_s for r in steps))
    tokens = [r for r in rows if r.tokens_per_s_per_chip]
    if tokens:  # tokens/s ∝ 1 / step time: the slowest step is the lowest rate
        points["tokens_per_s_per_chip"] = Point(
            statistics.median(r.tokens_per_s_per_chip for r in tokens),
            min(r.tokens_per_s_per_chip * _ratio(r.step_time_s, r.step_time_max_s)
                for r in tokens),
            max(r.tokens_per_s_per_chip * _ratio(r.step_time_s, r.step_time_min_s)
                for r in tokens))
    memory = [r.peak_memory_bytes_per_chip for r in rows if r.peak_memory_bytes_per_chip]
    if memory:
        points["peak_memory_bytes_per_chip"] = Point(float(statistics.median(memory)),
                                                     float(min(memory)), float(max(memory)))
    return points


def _ratio(step: float | None, bound: float | None) -> float:
    return step / bound if step and bound else 1.0


def _utc(value: dt.datetime) -> dt.datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
