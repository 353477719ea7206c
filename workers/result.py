"""What a trial produced: its status and the metrics of ARCHITECTURE.md."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .spec import TrialSpec

TrialStatus = Literal["pending", "running", "succeeded", "failed", "oom", "timeout", "skipped",
                      "cancelled"]
TRIAL_STATUSES: tuple[str, ...] = ("pending", "running", "succeeded", "failed", "oom", "timeout",
                                   "skipped", "cancelled")
FINAL_STATUSES: frozenset[str] = frozenset(
    {"succeeded", "failed", "oom", "timeout", "skipped", "cancelled"})


class TrialMetrics(BaseModel):
    """Measured figures of a finished trial (names and meaning as in ARCHITECTURE.md)."""

    model_config = ConfigDict(extra="forbid")
    step_time_s: float | None = None
    tokens_per_s_per_chip: float | None = None
    model_flops_per_step: float | None = None
    maxtext_flops_per_step: float | None = None
    hardware_flops_per_step: float | None = None
    peak_flops_per_chip: float | None = None
    peak_flops_source: str | None = None
    mfu: float | None = None
    hfu: float | None = None
    peak_memory_bytes_per_chip: int | None = None
    memory_source: str | None = None
    comm_bytes_per_step_per_chip: int | None = None
    """Everything a chip received per step: the two parts below (max over chips of each sum)."""
    cp_comm_bytes_per_step_per_chip: int | None = None
    """The CP mode's exchanges and the conv halo (max over chips)."""
    grad_sync_bytes_per_step_per_chip: int | None = None
    """Gradient all-reduce / reduce-scatter and weight all-gathers (zero1, fsdp), max over chips."""
    loss_first: float | None = None
    loss_last: float | None = None
    max_rel_err: float | None = None


class TrialResult(BaseModel):
    """A trial's outcome, handed to the sink when it ends (whatever the status)."""

    model_config = ConfigDict(extra="forbid")
    trial: TrialSpec
    status: TrialStatus
    error: str | None = None
    metrics: TrialMetrics = TrialMetrics()
    attempts: int = 0
    hosts: list[str] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict)
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
