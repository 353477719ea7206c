"""Public shapes of GET /api/regressions, `gdn-sweep regressions` and the webhook's body."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from service.db.schemas import UTCDatetime

Metric = Literal["step_time_s", "tokens_per_s_per_chip", "peak_memory_bytes_per_chip"]


class RunRef(BaseModel):
    """One run of a series: the sweep it belongs to."""

    sweep_id: int
    sweep_name: str
    at: UTCDatetime
    """When the sweep was created."""


class SeriesPoint(RunRef):
    value: float
    low: float
    """The run's repeats' lowest figure (step time: its fastest measured step)."""
    high: float


class ShiftPublic(BaseModel):
    """A level shift of one metric of one series: a regression (slower step, fewer tokens/s,
    more memory) or an improvement."""

    schedule_id: int | None
    schedule_name: str | None
    """The schedule whose sweeps make the series (None: a set of sweeps named by id)."""
    series: str
    """The trial key (without `/repeat=r`)."""
    metric: Metric
    kind: Literal["regression", "improvement"]
    before: float
    """Median of the level before the shift (the metric's unit)."""
    after: float
    """Median of the level from the first run after it on."""
    relative_change: float
    """after / before − 1 (0.25: 25% higher)."""
    spread: float
    """The series' run-to-run spread the shift was judged against, relative."""
    first_run: RunRef
    """The first run at the new level."""
    last_run_before: RunRef
    runs_after: int
    """Runs at the new level so far."""
    new: bool
    """First seen with the series' latest run: its runs before that show no shift the same way
    at this run or one beside it."""
    environment_diff: dict[str, dict[str, Any]] | None
    """What changed in the environment between last_run_before and first_run ({name:
    {before, after}}); null while results record no environment."""
    points: list[SeriesPoint] = []
    """The series (the plot); left out of the webhook's body."""


class RegressionsPublic(BaseModel):
    data: list[ShiftPublic]
    """Open regressions, worst first (largest |ln(after / before)|)."""
    count: int
    new: int
    """How many of them are new."""
    improvements: list[ShiftPublic]
    """The latest shift of each series and metric that is an improvement (reported, never
    alerted), largest first."""
    series: int
    """Series examined."""
