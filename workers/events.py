"""Progress events the sweep driver streams to its caller's `on_event` callback.

Frozen and picklable: the REST service forwards them, the CLI prints them, tests react to
them (e.g. kill a rank by the pid a TrialStarted reports).
"""

from __future__ import annotations

import dataclasses

from .grid import TrialSpec
from .process_probe import WorkerInfo
from .result import TrialResult


@dataclasses.dataclass(frozen=True, slots=True)
class TrialStarted:
    """A trial attempt is running on these processes (torch ranks / JAX processes, in order)."""

    trial: TrialSpec
    attempt: int
    workers: tuple[WorkerInfo, ...]
    reused_workers: bool
    """True when a warm group of the same shape ran it (no placement, no actor start)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TrialRetrying:
    """An attempt died with its actor or node; another attempt follows."""

    trial: TrialSpec
    attempt: int
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class TrialFinished:
    """A trial reached a final status (also for skipped and cancelled trials)."""

    result: TrialResult
    done: int
    """Trials of this run finished so far, this one included."""
    total: int
    """Trials this run handles (the grid minus those the sink had already finished)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SweepFinished:
    """Every trial of the run has a result; counts by status."""

    name: str
    counts: dict[str, int]
    already_finished: int
    """Trials skipped because the sink had them (resume)."""


SweepEvent = TrialStarted | TrialRetrying | TrialFinished | SweepFinished

__all__ = ["SweepEvent", "SweepFinished", "TrialFinished", "TrialRetrying", "TrialStarted"]
