"""Database rows (SQLAlchemy 2 `Mapped[]`): sweeps, their trials, and one result per trial.

A trial row exists from the moment its sweep is accepted (status pending); `results` gets
exactly one row when the trial ends with any final status. `results.trial_id` is the primary
key, so a second result for the same trial is impossible; `uq_trials_sweep_key` refuses a
second row for the same grid point of a sweep. The capacity-planning views are created by
the migrations (see service/README.md).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

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
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


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

    trials: Mapped[list[Trial]] = relationship(back_populates="sweep", passive_deletes=True)


class Trial(Base):
    """One grid point of a sweep: the work queue (spec and lifecycle status)."""

    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint("sweep_id", "key", name="uq_trials_sweep_key"),
        Index("ix_trials_sweep_status", "sweep_id", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))
    framework: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    chips: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int] = mapped_column(Integer)
    preset: Mapped[str] = mapped_column(String(64))
    num_layers: Mapped[int] = mapped_column(Integer)
    vocab_size: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    param_sharding: Mapped[str] = mapped_column(String(16), default="replicated")
    remat: Mapped[str] = mapped_column(String(8), default="none")
    steps: Mapped[int] = mapped_column(Integer)
    warmup_steps: Mapped[int] = mapped_column(Integer)
    accelerator_kind: Mapped[str] = mapped_column(String(8))
    accelerator_type: Mapped[str] = mapped_column(String(32))
    verify: Mapped[bool] = mapped_column(Boolean)
    timeout_s: Mapped[float] = mapped_column(Float)
    skip_reason: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))

    sweep: Mapped[Sweep] = relationship(back_populates="trials")
    result: Mapped[Result | None] = relationship(back_populates="trial", uselist=False,
                                                 passive_deletes=True)


class Result(Base):
    """What a finished trial produced (any final status): the fact table planners query.

    Immutable once written, and self-contained: the trial's grid coordinates are copied in
    (`FACT_COLUMNS`), so GET /api/results and the planning views filter, sort and count one
    table with its own indexes. Metric names as in ARCHITECTURE.md.
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
    framework: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    chips: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int] = mapped_column(Integer)
    preset: Mapped[str] = mapped_column(String(64))
    num_layers: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    param_sharding: Mapped[str] = mapped_column(String(16), default="replicated")
    remat: Mapped[str] = mapped_column(String(8), default="none")
    accelerator_kind: Mapped[str] = mapped_column(String(8))
    accelerator_type: Mapped[str] = mapped_column(String(32))
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
    mfu: Mapped[float | None] = mapped_column(Float)
    hfu: Mapped[float | None] = mapped_column(Float)
    peak_memory_bytes_per_chip: Mapped[int | None] = mapped_column(BigInteger)
    memory_source: Mapped[str | None] = mapped_column(Text)
    comm_bytes_per_step_per_chip: Mapped[int | None] = mapped_column(BigInteger)
    cp_comm_bytes_per_step_per_chip: Mapped[int | None] = mapped_column(BigInteger)
    grad_sync_bytes_per_step_per_chip: Mapped[int | None] = mapped_column(BigInteger)
    loss_first: Mapped[float | None] = mapped_column(Float)
    loss_last: Mapped[float | None] = mapped_column(Float)
    max_rel_err: Mapped[float | None] = mapped_column(Float)

    trial: Mapped[Trial] = relationship(back_populates="result")


METRIC_COLUMNS: tuple[str, ...] = (
    "step_time_s", "tokens_per_s_per_chip", "model_flops_per_step", "maxtext_flops_per_step",
    "hardware_flops_per_step", "peak_flops_per_chip", "peak_flops_source", "mfu", "hfu",
    "peak_memory_bytes_per_chip", "memory_source", "comm_bytes_per_step_per_chip",
    "cp_comm_bytes_per_step_per_chip", "grad_sync_bytes_per_step_per_chip", "loss_first",
    "loss_last", "max_rel_err")
"""Result columns filled from workers.result.TrialMetrics (same names)."""

FACT_COLUMNS: tuple[str, ...] = (
    "sweep_id", "framework", "mode", "chips", "seq_len", "batch_size", "preset", "num_layers",
    "dtype", "param_sharding", "remat", "accelerator_kind", "accelerator_type")
"""Trial columns copied into its result row."""


def result_for(trial: Trial, **outcome) -> Result:
    """A result row for `trial` with its grid coordinates copied in, plus `outcome`."""
    outcome.setdefault("attempts", 0)
    outcome.setdefault("hosts", [])
    outcome.setdefault("versions", {})
    return Result(trial_id=trial.id, **{c: getattr(trial, c) for c in FACT_COLUMNS}, **outcome)
