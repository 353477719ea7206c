"""API schemas, named by role. The request body of POST /api/sweeps is the workers' SweepSpec."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, HttpUrl, StrictBool,
                      TypeAdapter, UrlConstraints, model_validator)

from gdn_core.config import LAYERS
from gdn_core.cp_layout import LAYOUTS
from gdn_core.cp_modes import ATTN_CP_MODES
from gdn_core.kernels import DEFAULT_KERNELS, KERNELS
from gdn_core.packing import SINGLE_DOCUMENT
from service.core.cron import check_cron, check_timezone
from service.core.environment_diff import EnvironmentChange
from service.db.interpreted import ran_interpreted
from workers.result import TrialMetrics
from workers.sweep_spec import Name, PlainText, SweepSpec


def _as_utc(value: dt.datetime) -> dt.datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value


UTCDatetime = Annotated[dt.datetime, AfterValidator(_as_utc)]

SweepCreate = SweepSpec
"""Body of POST /api/sweeps: the one sweep schema shared with YAML files and `ray submit`."""


class SweepCreated(BaseModel):
    id: int
    name: str
    status: str
    trials: int
    """Trials in the grid, skipped ones included (SweepSpec.grid_size: the one-chip baseline
    counted once, not per mode; every point × repeats)."""
    skipped: int
    """Grid points a mode cannot serve: recorded as skipped with the reason, never run."""


class SweepPublic(BaseModel):
    id: int
    name: str
    status: str
    error: str | None
    created_at: UTCDatetime
    started_at: UTCDatetime | None
    finished_at: UTCDatetime | None
    trials_total: int
    trials_skipped: int
    trials_done: int
    """Trials with a final status (succeeded, failed, oom, timeout, skipped, cancelled)."""
    counts: dict[str, int]
    """Trials per status, every status listed (zeros included)."""
    spec: SweepSpec
    chip_memory_bytes: int | None = None
    """Memory of one chip of this sweep's accelerator (host RAM for CPU chips), for plots."""
    chip_memory_label: str | None = None
    queue_position: int | None = None
    """A queued sweep's place in the queue, 1 = the next the scheduler takes (oldest first);
    None unless queued."""
    schedule_id: int | None = None
    """The schedule that created it (None: submitted by hand, or its schedule was deleted)."""


class SweepsPublic(BaseModel):
    data: list[SweepPublic]
    count: int


class AttemptPublic(BaseModel):
    """One attempt of a trial (a row of trial_attempts)."""

    attempt: int
    status: str
    reason: str | None = None
    hosts: list[str] = []
    started_at: UTCDatetime | None = None
    finished_at: UTCDatetime | None = None


class ProfilePublic(BaseModel):
    """A profiled trial's extra step (SweepSpec.profile): where its trace is served, and what
    it says. The step ran after the measured ones: no metric includes it."""

    url: str | None = None
    """GET it for the trace file (None when the profiler failed: see error)."""
    bytes: int | None = None
    format: str
    """chrome_trace_json_gz (torch: Perfetto / chrome://tracing / TensorBoard) or
    xprof_run_tar_gz (JAX: a TensorBoard profile run; `xprof --logdir` after unpacking)."""
    summary: dict = {}
    """wall_s, busy_s, idle_s, compute_s, collective_s (seconds of the profiled step) and
    top_ops [{name, category, self_s, count}] by self time (workers.profile_summary)."""
    error: str | None = None
    status: Literal["stored", "failed", "skipped"] = "stored"
    """stored; failed (the profiler failed); skipped (taken, but the artifact directory had
    no room within its retention limits: error says which)."""


class _TrialOutcome(BaseModel):
    """A trial as its row holds it, and its result's outcome: TrialPublic less the metrics."""

    id: int
    sweep_id: int
    key: str
    kind: str = "measure"
    """measure (run and timed) or plan (the JAX step compiled for the chips, not run: XLA's
    memory estimate, compiled FLOPs and collective bytes; no step time, MFU or peak)."""
    framework: str
    mode: str
    """A CP mode, or "none": the one-chip baseline (chips=1) every mode's rows refer to."""
    chips: int
    """All chips of the trial's mesh: dp replicas × chips / dp CP chips."""
    dp: int = 1
    """Data-parallel replicas; each holds chips / dp chips that split its sequences (CP)."""
    seq_len: int
    repeat: int = 0
    """Which run of its grid point (0 … the sweep's repeats − 1)."""
    baseline_key: str | None = None
    """chips > 1: key of the one-chip trial of the same framework, seq_len, settings, repeat."""
    baseline_trial_id: int | None = None
    speedup_vs_one_chip: float | None = None
    """tokens/s of the whole trial ÷ tokens/s of its one-chip baseline (both succeeded)."""
    scaling_efficiency: float | None = None
    """tokens/s/chip ÷ the baseline's tokens/s/chip: 1 is perfect scaling."""
    batch_size: int
    """batch_size per replica: the sequences one data-parallel replica trains each step."""
    global_batch_size: int = 0
    """Sequences per step over all replicas: dp × batch_size (derived, never stored)."""
    preset: str
    num_layers: int
    vocab_size: int
    dtype: str
    param_sharding: str
    remat: str
    layers: str = "gdn_only"
    """The decoder it trained: gdn_only (every layer GDN) or hybrid (GDN + gated attention)."""
    attn_cp: str | None = None
    """The hybrid's attention CP mode; None: no attention layers, or one chip."""
    layout: str = "contiguous"
    """Which tokens each chip held: contiguous or zigzag."""
    kernels: str = DEFAULT_KERNELS
    """reference (this project's code) or fused (library kernels); what they resolved to is
    in gdn_kernel and attention_kernel."""
    documents: str = SINGLE_DOCUMENT
    """How each sequence was packed: single, or uniform:LO-HI (documents of LO … HI tokens;
    attention and the GDN state restart at each boundary). Model FLOPs and MFU count
    attention per document."""
    interpreted: bool = False
    """A kernel ran through its interpreter (its name ends " (interpreted)"; derived, never
    stored): a correctness run, whose step time, tokens/s/chip, MFU and HFU are no speed."""
    steps: int
    warmup_steps: int
    accelerator: str
    """Chip type (cpu, h100, v5p, …)."""
    accelerator_kind: str
    verify: bool
    timeout_s: float
    status: str
    error: str | None = None
    attempts: int | None = None
    attempt_history: list[AttemptPublic] = []
    """Every attempt in order (empty until the trial ends, and for results stored before the
    history was kept); the last one is the outcome."""
    hosts: list[str] | None = None
    versions: dict[str, str] | None = None
    environment_id: int | None = None
    """The environment it measured in (GET /api/environments/{id}); None before it ran, for
    trials no worker process ran, and for results stored before environments were kept."""
    profile: ProfilePublic | None = None
    """Set when the trial ran with profile: true (None otherwise)."""
    created_at: UTCDatetime
    started_at: UTCDatetime | None = None
    finished_at: UTCDatetime | None = None

    @model_validator(mode="after")
    def _global_batch_of_every_replica(self) -> "_TrialOutcome":
        self.global_batch_size = self.dp * self.batch_size
        return self


class TrialPublic(TrialMetrics, _TrialOutcome):
    """A trial and its outcome, then its metrics: every field of TrialMetrics (workers/result.py,
    the one list of metrics). Pydantic takes the last base's fields first, so JSON objects and
    CSV rows start with the trial's."""

    model_config = ConfigDict(extra="ignore")  # TrialMetrics forbids extras; rows carry joins

    @model_validator(mode="after")
    def _interpreted_from_kernel_names(self) -> "TrialPublic":
        self.interpreted = ran_interpreted(self.gdn_kernel, self.attention_kernel)
        return self


_TRIALS = TypeAdapter(list[TrialPublic])


def _profile(data: dict) -> dict | None:
    """ProfilePublic's fields from a row's profile_* columns (popped), or None."""
    fmt, path = data.pop("profile_format", None), data.pop("profile_path", None)
    values = dict(format=fmt, bytes=data.pop("profile_bytes", None),
                  summary=data.pop("profile_summary", None) or {},
                  error=data.pop("profile_error", None),
                  status=data.pop("profile_status", None) or ("stored" if path else "failed"),
                  url=None if path is None else f"/api/trials/{data['id']}/profile")
    return None if fmt is None else values


def trials_from_mappings(rows, attempts: dict[int, list] | None = None) -> list[TrialPublic]:
    """TrialPublic from rows of `crud.public_trial_columns()` (or equivalent dicts), with
    each trial's attempts from `attempts` (trial id → AttemptPublic-shaped rows)."""
    out = []
    for row in rows:
        data = dict(row)
        data["accelerator"] = data.pop("accelerator_type")
        skip_reason = data.pop("skip_reason", None)
        started = data.pop("result_started_at", None)
        if started is not None:
            data["started_at"] = started
        if data.get("error") is None and data["status"] == "skipped":
            data["error"] = skip_reason
        baseline = data.pop("baseline_tokens_per_s_per_chip", None)
        mine = data.get("tokens_per_s_per_chip")
        if (baseline and mine is not None and data["status"] == "succeeded"
                and not ran_interpreted(data.get("gdn_kernel"), data.get("attention_kernel"))):
            data["scaling_efficiency"] = mine / baseline
            data["speedup_vs_one_chip"] = mine * data["chips"] / baseline
        data["attempt_history"] = (attempts or {}).get(data["id"], [])
        data["profile"] = _profile(data)
        out.append(data)
    return _TRIALS.validate_python(out)


class TrialDetailPublic(TrialPublic):
    """GET /api/trials/{id}: the trial, its metrics, and its environment's body."""

    environment: dict[str, Any] | None = None
    """What the trial measured in (workers.environment: python, packages, project, runtime,
    accelerator, source); None when environment_id is."""


class EnvironmentPublic(BaseModel):
    """GET /api/environments/{id}: one distinct environment, as stored once."""

    id: int
    content_hash: str
    body: dict[str, Any]
    created_at: UTCDatetime


class TrialEnvironmentRef(BaseModel):
    trial_id: int
    environment_id: int


class EnvironmentDiffPublic(BaseModel):
    """GET /api/environments/diff?a=&b=: what changed from trial a's environment to b's."""

    a: TrialEnvironmentRef
    b: TrialEnvironmentRef
    same: bool
    """Both trials measured in one stored environment (then `changes` is empty)."""
    changes: list[EnvironmentChange]
    """Leaves that differ, by dotted key (service.core.environment_diff)."""


class TrialsPublic(BaseModel):
    data: list[TrialPublic]
    count: int


class ComponentHealth(BaseModel):
    ok: bool | None
    """True reachable, False not, None not used by this process (or not connected yet)."""
    detail: str
    """"reachable" / "unreachable (ErrorClass)", the database prefixed with its backend
    (sqlite, postgresql); never an address, path or driver message (those are logged)."""


class HealthPublic(BaseModel):
    """GET /api/health/ready (and /api/health): whether this process can serve sweeps."""

    status: Literal["ok", "unavailable"]
    database: ComponentHealth
    ray: ComponentHealth


class LivenessPublic(BaseModel):
    """GET /api/health/live: the process serves requests."""

    status: Literal["ok"]


class OptionsPublic(BaseModel):
    """What the create-sweep form offers (the same closed sets the API validates against)."""

    kinds: list[str]
    """Trial kinds: measure (run and timed), plan (the JAX step compiled, not run)."""
    frameworks: list[str]
    modes: list[str]
    """CP modes a sweep may ask for."""
    trial_modes: list[str]
    """Modes a trial (and the results filter) may have: the CP modes and "none" (one chip)."""
    presets: list[str]
    dtypes: list[str]
    param_shardings: list[str]
    remats: list[str]
    layers: list[str] = list(LAYERS)
    """Decoders: gdn_only (every layer GDN), hybrid (GDN + gated full attention)."""
    attn_cps: list[str] = list(ATTN_CP_MODES)
    """CP modes of the hybrid's attention layers."""
    layouts: list[str] = list(LAYOUTS)
    """Sequence layouts over the chips."""
    kernels: list[str] = list(KERNELS)
    """Implementations: reference (this project's code), fused (library kernels)."""
    accelerator_kinds: list[str]
    accelerator_types: list[str]
    trial_statuses: list[str]
    result_sort_fields: list[str]
    grid_cap: int
    auth_required: bool
    """Mutating calls need the bearer token."""
    reads_need_token: bool = False
    """Every /api call needs it (GDN_SWEEP_TOKEN_FOR_READS)."""
    open_to_network: bool = False
    """Served beyond loopback with no token (`serve --allow-unauthenticated`): the dashboard
    shows a banner."""


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


class ScheduleRunPublic(BaseModel):
    """One due time a schedule fired."""

    due_at: UTCDatetime
    sweep_id: int | None
    """The sweep it created (None when skipped or failed, or once that sweep is gone)."""
    outcome: Literal["created", "skipped_overlap", "failed"]
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


class SchedulesPublic(BaseModel):
    data: list[SchedulePublic]
    count: int
