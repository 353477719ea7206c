"""Schedules (POST/GET/PATCH/DELETE /api/schedules) and the regressions of their sweeps (GET
/api/regressions, `gdn-sweep regressions`, the webhook's body)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, HttpUrl, StrictBool,
                      UrlConstraints)

from service.core.cron import check_cron, check_timezone
from service.db.crud import ScheduleActivity, stored_spec
from service.db.models import Schedule, ScheduleRun, ScheduleRunOutcome
from service.schemas.utc import UTCDatetime
from workers.sweep_spec import Name, PlainText, SweepSpec

CronText = Annotated[PlainText, Field(min_length=1, max_length=200,
                                      description="five-field cron expression (croniter), e.g. "
                                                  "'0 2 * * *'"),
                     AfterValidator(check_cron)]
TimezoneText = Annotated[PlainText, Field(min_length=1, max_length=64,
                                          description="IANA time zone name, e.g. Europe/Berlin"),
                         AfterValidator(check_timezone)]


WebhookUrl = Annotated[HttpUrl, UrlConstraints(max_length=2000),
                      Field(description="http(s) URL POSTed a JSON summary when a sweep of the "
                                        "schedule opens new regressions")]
"""pydantic's HttpUrl: http or https with a host; anything else is a 422 naming the scheme."""


class ScheduleCreate(BaseModel):
    """Body of POST /api/schedules: a sweep (the body of POST /api/sweeps) run on a cron
    expression in a time zone."""

    model_config = ConfigDict(extra="forbid")
    name: Name
    cron: CronText
    timezone: TimezoneText = "UTC"
    spec: SweepSpec
    paused: StrictBool = False
    allow_overlap: StrictBool = False
    """False: a tick while this schedule's previous sweep is queued, running or cancelling is
    recorded skipped_overlap and creates no sweep."""
    webhook_url: WebhookUrl | None = None

    def columns(self) -> dict[str, Any]:
        """crud.create_schedule's keyword arguments (the webhook URL as text)."""
        return dict(name=self.name, cron=self.cron, timezone=self.timezone, spec=self.spec,
                    paused=self.paused, allow_overlap=self.allow_overlap,
                    webhook_url=None if self.webhook_url is None else str(self.webhook_url))


class ScheduleUpdate(BaseModel):
    """Body of PATCH /api/schedules/{id}: the fields to change (absent or null: unchanged)."""

    model_config = ConfigDict(extra="forbid")
    name: Name | None = None
    cron: CronText | None = None
    timezone: TimezoneText | None = None
    spec: SweepSpec | None = None
    paused: StrictBool | None = None
    allow_overlap: StrictBool | None = None
    webhook_url: WebhookUrl | Literal[""] | None = None
    """"": remove the webhook."""

    def changes(self) -> dict[str, Any]:
        """crud.update_schedule's `changes`: the fields given and not null, as column values
        (the spec as JSON; the webhook URL as text, None where "" removes it)."""
        changes = {k: v for k, v in self.model_dump(exclude_unset=True).items()
                   if v is not None}
        if "spec" in changes:
            changes["spec"] = self.spec.model_dump(mode="json")
        if "webhook_url" in changes:
            changes["webhook_url"] = str(changes["webhook_url"]) or None
        return changes


class ScheduleRunPublic(BaseModel):
    """One due time a schedule fired."""

    model_config = ConfigDict(from_attributes=True)  # from its row (models.ScheduleRun)
    due_at: UTCDatetime
    sweep_id: int | None
    """The sweep it created (None when skipped or failed, or once that sweep is gone)."""
    outcome: ScheduleRunOutcome
    error: str | None = None
    """outcome failed: why the stored spec made no sweep."""
    created_at: UTCDatetime


class SchedulePublic(BaseModel):
    id: int
    name: str
    cron: str
    timezone: str
    spec: SweepSpec
    paused: bool
    allow_overlap: bool
    next_run_at: UTCDatetime | None
    """The next due time (UTC); None while paused."""
    last_run_at: UTCDatetime | None
    """Due time of the latest tick fired (any outcome); None if never."""
    created_at: UTCDatetime
    updated_at: UTCDatetime
    sweeps_created: int = 0
    """Sweeps this schedule has created in all."""
    webhook_url: str | None = None
    webhook_status: Literal["delivered", "failed"] | None = None
    """The latest webhook delivery (None: none yet): failed after every retry, or delivered."""
    webhook_error: str | None = None
    """Why the latest delivery failed."""
    webhook_at: UTCDatetime | None = None
    """When the latest delivery ended."""
    runs: list[ScheduleRunPublic]
    """The latest ticks fired, newest first (at most 20)."""

    @classmethod
    def from_row(cls, s: Schedule, *, runs: Sequence[ScheduleRun],
                 sweeps_created: int) -> SchedulePublic:
        """The schedule's row with its latest runs and its sweep count."""
        return cls(
            id=s.id, name=s.name, cron=s.cron, timezone=s.timezone, spec=stored_spec(s.spec),
            paused=s.paused, allow_overlap=s.allow_overlap, next_run_at=s.next_run_at,
            last_run_at=s.last_run_at, created_at=s.created_at, updated_at=s.updated_at,
            sweeps_created=sweeps_created, webhook_url=s.webhook_url,
            webhook_status=s.webhook_status, webhook_error=s.webhook_error,
            webhook_at=s.webhook_at, runs=[ScheduleRunPublic.model_validate(r) for r in runs])

    @classmethod
    def from_rows(cls, schedules: Sequence[Schedule],
                  activity: ScheduleActivity) -> list[SchedulePublic]:
        """SchedulePublic of each of a page of schedules, with crud.schedule_activity's."""
        return [cls.from_row(s, runs=activity.runs[s.id],
                             sweeps_created=activity.sweeps_created[s.id]) for s in schedules]


class SchedulesPublic(BaseModel):
    data: list[SchedulePublic]
    count: int


# ----------------------------------------------------------- regressions of scheduled sweeps

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
