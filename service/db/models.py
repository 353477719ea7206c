"""Database rows (SQLAlchemy 2 `Mapped[]`): sweeps, their trials, one result per trial, and
the attempts behind each result.

A trial row exists from the moment its sweep is accepted (status pending); `results` gets
exactly one row when the trial ends with any final status, and `trial_attempts` one row per
attempt it took, written in the same transaction. `results.trial_id` is the primary key, so a
second result for the same trial is impossible; `uq_trials_sweep_key` refuses a second row
for the same grid point of a sweep. The capacity-planning views are created by the migrations
(see service/README.md).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, get_args

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from workers.result import TrialMetrics
from workers.grid import TrialSpec


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    pass


SWEEP_STATUSES: tuple[str, ...] = ("queued", "running", "cancelling", "finished", "cancelled",
                                   "failed")
"""queued → running → finished; cancel: → cancelling → cancelled; driver crash: failed."""
FINAL_SWEEP_STATUSES: frozenset[str] = frozenset({"finished", "cancelled", "failed"})


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    trials_total: Mapped[int] = mapped_column(Integer)
    trials_skipped: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    runner: Mapped[str | None] = mapped_column(String(128))
    """Who runs it: the service's scheduler id, or cli:<host>:<pid> for `gdn-sweep run`."""
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """Renewed by the runner while it runs; a stale one lets another runner take over."""
    schedule_id: Mapped[int | None] = mapped_column(
        ForeignKey("schedules.id", ondelete="SET NULL", name="fk_sweeps_schedule_id"),
        index=True)
    """The schedule that created this sweep (None for sweeps submitted by hand, and once the
    schedule is deleted)."""

    trials: Mapped[list[Trial]] = relationship(back_populates="sweep", passive_deletes=True)


class GridPoint:
    """The grid coordinates and step settings of a trial: one definition, mapped into both the
    trial row and its result row (which copies them in: FACT_COLUMNS), so the two tables hold
    the same columns of the same types."""

    kind: Mapped[str] = mapped_column(String(8), default="measure",
                                      server_default=text("'measure'"))
    """'measure' (run and timed) or 'plan' (the JAX step compiled for its chips, not run)."""
    framework: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    chips: Mapped[int] = mapped_column(Integer)
    """All chips of the trial's mesh: dp replicas × chips / dp CP chips."""
    dp: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    """Data-parallel replicas (divides chips); 1: the whole mesh is one CP group."""
    seq_len: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int] = mapped_column(Integer)
    """Sequences per replica: the step's global batch is dp × batch_size."""
    preset: Mapped[str] = mapped_column(String(64))
    num_layers: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    param_sharding: Mapped[str] = mapped_column(String(16), default="replicated")
    remat: Mapped[str] = mapped_column(String(8), default="none")
    layers: Mapped[str] = mapped_column(String(16), default="gdn_only",
                                        server_default=text("'gdn_only'"))
    """The decoder it trains: gdn_only (every layer GDN) or hybrid (GDN + gated attention)."""
    attn_cp: Mapped[str | None] = mapped_column(String(16))
    """The attention layers' CP mode (hybrid, chips > 1); NULL: no attention CP."""
    layout: Mapped[str] = mapped_column(String(16), default="contiguous",
                                        server_default=text("'contiguous'"))
    kernels: Mapped[str] = mapped_column(String(16), default="reference",
                                         server_default=text("'reference'"))
    """reference (this project's code) or fused (library kernels; gdn_core.kernels)."""
    documents: Mapped[str] = mapped_column(String(40), default="single",
                                           server_default=text("'single'"))
    """How each sequence is packed: single, or uniform:LO-HI (gdn_core.packing)."""
    accelerator_kind: Mapped[str] = mapped_column(String(8))
    accelerator_type: Mapped[str] = mapped_column(String(32))
    repeat: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    """Which run of its grid point (0 … SweepSpec.repeats − 1)."""


class Trial(GridPoint, Base):
    """One grid point of a sweep: the work queue (spec and lifecycle status)."""

    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint("sweep_id", "key", name="uq_trials_sweep_key"),
        Index("ix_trials_sweep_status", "sweep_id", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))
    vocab_size: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    warmup_steps: Mapped[int] = mapped_column(Integer)
    verify: Mapped[bool] = mapped_column(Boolean)
    timeout_s: Mapped[float] = mapped_column(Float)
    skip_reason: Mapped[str | None] = mapped_column(Text)
    baseline_key: Mapped[str | None] = mapped_column(String(200))
    """chips > 1: key (same sweep) of the one-chip trial this one's speed-up is relative to."""
    status: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))

    sweep: Mapped[Sweep] = relationship(back_populates="trials")
    result: Mapped[Result | None] = relationship(back_populates="trial", uselist=False,
                                                 passive_deletes=True)


class Result(GridPoint, Base):
    """What a finished trial produced (any final status): the fact table planners query.

    Immutable once written, and self-contained: the trial's grid coordinates are copied in
    (`FACT_COLUMNS`), so GET /api/results and the planning views filter, sort and count one
    table with its own indexes. Metric names as in docs/architecture.md.
    """

    __tablename__ = "results"
    __table_args__ = (
        # status='succeeded' plus any of the filters; the trailing columns let COUNT(*) be
        # answered from an index alone.
        Index("ix_results_status_preset_accelerator", "status", "preset", "accelerator_type",
              "seq_len", "mode", "chips", "framework", "dtype"),
        Index("ix_results_status_mode_chips", "status", "mode", "chips", "seq_len", "framework",
              "dtype"),
        Index("ix_results_status_framework", "status", "framework", "dtype", "mode"),
        # top-N without filters: walk the index in order, stop after one page.
        Index("ix_results_status_tokens", "status", "tokens_per_s_per_chip", "trial_id"),
        Index("ix_results_status_mfu", "status", "mfu", "trial_id"),
        Index("ix_results_sweep_id", "sweep_id"),
    )

    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"),
                                          primary_key=True, autoincrement=False)
    """One result per trial: the trial's id is the key (and SQLite clusters rows by it)."""
    sweep_id: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    hosts: Mapped[list[str]] = mapped_column(JSON, default=list)
    versions: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    step_time_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s_per_chip: Mapped[float | None] = mapped_column(Float)
    model_flops_per_step: Mapped[float | None] = mapped_column(Float)
    maxtext_flops_per_step: Mapped[float | None] = mapped_column(Float)
    hardware_flops_per_step: Mapped[float | None] = mapped_column(Float)
    peak_flops_per_chip: Mapped[float | None] = mapped_column(Float)
    peak_flops_source: Mapped[str | None] = mapped_column(Text)
    peak_flops_dtype: Mapped[str | None] = mapped_column(String(16))
    device_name: Mapped[str | None] = mapped_column(Text)
    gdn_kernel: Mapped[str | None] = mapped_column(Text)
    attention_kernel: Mapped[str | None] = mapped_column(Text)
    """What the trial's `kernels` resolved to on its workers, with versions (succeeded trials;
    attention_kernel NULL without attention layers)."""
    measured_steps: Mapped[int | None] = mapped_column(Integer)
    step_time_min_s: Mapped[float | None] = mapped_column(Float)
    step_time_max_s: Mapped[float | None] = mapped_column(Float)
    compile_time_s: Mapped[float | None] = mapped_column(Float)
    mfu: Mapped[float | None] = mapped_column(Float)
    hfu: Mapped[float | None] = mapped_column(Float)
    peak_memory_bytes_per_chip: Mapped[int | None] = mapped_column(BigInteger)
    """Measured only: the device allocator's peak (GPU/TPU) or the process RSS high-water mark
    (CPU hosts); memory_source says which."""
    memory_source: Mapped[str | None] = mapped_column(Text)
    estimated_memory_bytes_per_chip: Mapped[int | None] = mapped_column(BigInteger)
    """XLA's compile-time memory analysis (JAX): an estimate, never in peak_memory's place."""
    estimated_memory_source: Mapped[str | None] = mapped_column(Text)
    predicted_memory_bytes_per_chip: Mapped[int | None] = mapped_column(BigInteger)
    """gdn_core's analytic memory predictor for the trial's shape and step settings."""
    comm_bytes_per_step_per_chip: Mapped[int | None] = mapped_column(BigInteger)
    cp_comm_bytes_per_step_per_chip: Mapped[int | None] = mapped_column(BigInteger)
    grad_sync_bytes_per_step_per_chip: Mapped[int | None] = mapped_column(BigInteger)
    compiled_flops_per_step_per_chip: Mapped[float | None] = mapped_column(Float)
    """Matmul FLOPs of the compiled per-chip program, loop trips counted (plan trials)."""
    loss_first: Mapped[float | None] = mapped_column(Float)
    loss_last: Mapped[float | None] = mapped_column(Float)
    max_rel_err: Mapped[float | None] = mapped_column(Float)
    verified_seq_len: Mapped[int | None] = mapped_column(Integer)
    environment_id: Mapped[int | None] = mapped_column(
        ForeignKey("environments.id", name="fk_results_environment_id"), index=True)
    """What the trial measured in (environments); NULL for results stored before migration
    0012 and for trials no worker process ran."""
    profile_format: Mapped[str | None] = mapped_column(String(32))
    """Set when the trial was profiled (workers.result.TrialProfile): one extra step after the
    measured ones, in no metric here. chrome_trace_json_gz (torch) or xprof_run_tar_gz (JAX)."""
    profile_path: Mapped[str | None] = mapped_column(String(500))
    """The trace file, relative to Settings.artifact_dir (NULL when the profiler failed)."""
    profile_bytes: Mapped[int | None] = mapped_column(BigInteger)
    profile_summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Top ops by self time; compute, collective and idle seconds of the profiled step."""
    profile_error: Mapped[str | None] = mapped_column(Text)
    profile_status: Mapped[str | None] = mapped_column(String(16))
    """stored, failed or skipped (no room under the artifact directory: profile_error says)."""

    trial: Mapped[Trial] = relationship(back_populates="result")


class Environment(Base):
    """One distinct environment trials measured in (workers.environment), stored once: the
    SHA-256 of its canonical JSON is unique, so trials that share it share the row, however
    many write it at once (service/db/environments.py)."""

    __tablename__ = "environments"
    __table_args__ = (UniqueConstraint("content_hash", name="uq_environments_content_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(64))
    """SHA-256 (hex) of the body as JSON with sorted keys and no spaces."""
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TrialAttempt(Base):
    """One attempt of a trial (workers.result.AttemptRecord): why it ended and where it ran,
    so a trial that succeeded on attempt 2 keeps attempt 1's reason. Written with the result,
    in the same transaction; immutable like it."""

    __tablename__ = "trial_attempts"

    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"),
                                          primary_key=True, autoincrement=False)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    """1, 2, … in the order they ran."""
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    hosts: Mapped[list[str]] = mapped_column(JSON, default=list)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class IdempotencyKey(Base):
    """An `Idempotency-Key` a POST /api/sweeps came with: the sweep it created and the hash of
    its validated spec. Written in the sweep's transaction; the key being the primary key, of
    two concurrent requests with one key only the first to commit creates a sweep."""

    __tablename__ = "idempotency_keys"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    """SHA-256 (hex) of the spec as JSON with sorted keys (crud.spec_hash)."""
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    sweep: Mapped[Sweep] = relationship()


class Schedule(Base):
    """A saved sweep definition run on a cron expression in an IANA time zone
    (service/runs/schedule_firing.py fires it). `next_run_at` is the next due time (UTC), None
    while paused; `last_run_at` the due time of the latest tick it fired, whatever its
    outcome."""

    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    cron: Mapped[str] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    allow_overlap: Mapped[bool] = mapped_column(Boolean, default=False)
    """False: a tick while the schedule's previous sweep is queued or running is skipped."""
    next_run_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    last_run_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    webhook_url: Mapped[str | None] = mapped_column(String(2000))
    """http(s) URL POSTed a summary when one of its sweeps opens new regressions."""
    webhook_status: Mapped[str | None] = mapped_column(String(16))
    """The latest delivery: delivered or failed (None: none yet)."""
    webhook_error: Mapped[str | None] = mapped_column(Text)
    webhook_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


ScheduleRunOutcome = Literal["created", "skipped_overlap", "failed"]
SCHEDULE_RUN_OUTCOMES: tuple[str, ...] = get_args(ScheduleRunOutcome)
"""created: a sweep was queued; skipped_overlap: the previous sweep was still queued or
running; failed: the stored spec could not make a sweep any more (the error says why)."""


class ScheduleRun(Base):
    """One due time of a schedule, claimed once: the primary key (schedule_id, due_at) lets
    exactly one process fire it, in the same transaction as the sweep it creates."""

    __tablename__ = "schedule_runs"

    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"),
                                             primary_key=True, autoincrement=False)
    due_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"))
    outcome: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


ALERT_STATUSES: tuple[str, ...] = ("pending", "delivered", "failed")


class RegressionAlert(Base):
    """A regression a schedule's webhook was sent (or is being sent): the unique key (schedule,
    series, metric, first run) makes each regression alerted once, whichever process finishes
    the sweep (service/regressions/alerts.py)."""

    __tablename__ = "regression_alerts"
    __table_args__ = (UniqueConstraint("schedule_id", "series", "metric", "first_sweep_id",
                                       name="uq_regression_alerts_regression"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    series: Mapped[str] = mapped_column(String(200))
    metric: Mapped[str] = mapped_column(String(32))
    first_sweep_id: Mapped[int] = mapped_column(Integer)
    """The first run at the new level (a sweep id, kept when the sweep is deleted)."""
    sweep_id: Mapped[int] = mapped_column(Integer)
    """The sweep whose end opened it."""
    relative_change: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class CacheVersion(Base):
    """A counter per cached read that a trigger (migration 0005) bumps in the transaction that
    changes what the read shows: `results` with every write of a succeeded result. A response
    is cached under the version read before its query, so it is served only while nothing it
    shows has changed (service/db/read_cache.py)."""

    __tablename__ = "cache_versions"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger)


METRIC_COLUMNS: tuple[str, ...] = tuple(TrialMetrics.model_fields)
"""Result columns filled from workers.result.TrialMetrics, the one list of metrics (same names;
tests/service/test_models.py checks that Result has each, nullable, of the field's type)."""

FACT_COLUMNS: tuple[str, ...] = ("sweep_id", *GridPoint.__annotations__)
"""Trial columns copied into its result row: its sweep and its GridPoint columns."""

TRIAL_SPEC_ONLY: frozenset[str] = frozenset({"repeats", "profile", "admit_over_memory"})
"""workers.grid.TrialSpec fields that are no trial column (the sweep's spec holds them)."""
PROFILE_COLUMNS: tuple[str, ...] = ("profile_path", "profile_bytes", "profile_format",
                                    "profile_summary", "profile_error", "profile_status")
"""Result columns of a profiled trial (workers.result.TrialProfile's fields, prefixed)."""


def trial_values(*, sweep_id: int, spec: TrialSpec, status: str,
                 created_at: dt.datetime) -> dict[str, Any]:
    """The column values of the trial row of a workers.grid.TrialSpec (its key, grid
    coordinates and settings): trial_row's, and a bulk insert's (service/bench)."""
    return dict(sweep_id=sweep_id, key=spec.key, status=status, created_at=created_at,
                **spec.model_dump(exclude=TRIAL_SPEC_ONLY))


def trial_row(*, sweep_id: int, spec: TrialSpec, status: str,
              created_at: dt.datetime) -> Trial:
    """A trial row for a workers.grid.TrialSpec (its key, grid coordinates and settings)."""
    return Trial(**trial_values(sweep_id=sweep_id, spec=spec, status=status,
                                created_at=created_at))


def trial_spec(row: Trial, *, repeats: int, profile: bool = False,
               admit_over_memory: bool = False) -> TrialSpec:
    """The TrialSpec `row` was written from (trial_row's inverse), given its sweep's `repeats`
    (1 for plans), `profile` (measured trials only) and `admit_over_memory`, the fields no
    trial column holds. ValueError if the fields no longer make the row's key: results find
    their row by key."""
    spec = TrialSpec(repeats=repeats, profile=profile and row.kind == "measure",
                     admit_over_memory=admit_over_memory,
                     **{name: getattr(row, name)
                                         for name in TrialSpec.model_fields
                                         if name not in TRIAL_SPEC_ONLY})
    if spec.key != row.key:
        raise ValueError(f"trial {row.id} ({row.key!r}): its columns make the key "
                         f"{spec.key!r}; it cannot be run by this version")
    return spec


def result_for(trial: Trial, **outcome) -> Result:
    """A result row for `trial` with its grid coordinates copied in, plus `outcome`."""
    outcome.setdefault("attempts", 0)
    outcome.setdefault("hosts", [])
    outcome.setdefault("versions", {})
    return Result(trial_id=trial.id, **{c: getattr(trial, c) for c in FACT_COLUMNS}, **outcome)
