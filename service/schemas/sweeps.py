"""POST /api/sweeps, GET /api/sweeps[/{id}], POST /api/sweeps/{id}/cancel. The request body is
the workers' SweepSpec: the one sweep schema shared with YAML files and `ray submit`."""

from __future__ import annotations

from pydantic import BaseModel

from service.db.crud import stored_spec
from service.db.models import Sweep
from service.schemas.utc import UTCDatetime
from workers.result import FINAL_STATUSES
from workers.sweep_spec import SweepSpec

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

    @classmethod
    def from_row(cls, sweep: Sweep) -> SweepCreated:
        """The 201 body of a sweep just queued. Status is the one every sweep is created with,
        so that a replay of its Idempotency-Key answers exactly what the first request did."""
        return cls(id=sweep.id, name=sweep.name, status="queued", trials=sweep.trials_total,
                   skipped=sweep.trials_skipped)


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

    @classmethod
    def from_row(cls, sweep: Sweep, *, counts: dict[str, int],
                 queue_position: int | None) -> SweepPublic:
        """The sweep's row with its trials per status (crud.status_counts) and its place in
        the queue (crud.queue_position)."""
        from service.core.chip_memory import chip_memory  # reads the host's RAM: on use only

        spec = stored_spec(sweep.spec)
        memory, label = chip_memory(spec.accelerator.kind, spec.accelerator.type)
        return cls(
            id=sweep.id, name=sweep.name, status=sweep.status, error=sweep.error,
            created_at=sweep.created_at, started_at=sweep.started_at,
            finished_at=sweep.finished_at, trials_total=sweep.trials_total,
            trials_skipped=sweep.trials_skipped,
            trials_done=sum(n for s, n in counts.items() if s in FINAL_STATUSES),
            counts=counts, spec=spec, chip_memory_bytes=memory, chip_memory_label=label,
            queue_position=queue_position, schedule_id=sweep.schedule_id)


class SweepsPublic(BaseModel):
    data: list[SweepPublic]
    count: int
