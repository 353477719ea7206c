"""API schemas, named by role. The request body of POST /api/sweeps is the workers' SweepSpec."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, TypeAdapter

from workers.spec import SweepSpec


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
    """Trials in the grid, skipped ones included."""
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


class SweepsPublic(BaseModel):
    data: list[SweepPublic]
    count: int


class TrialPublic(BaseModel):
    id: int
    sweep_id: int
    key: str
    framework: str
    mode: str
    chips: int
    seq_len: int
    batch_size: int
    preset: str
    num_layers: int
    vocab_size: int
    dtype: str
    param_sharding: str
    remat: str
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
    hosts: list[str] | None = None
    versions: dict[str, str] | None = None
    created_at: UTCDatetime
    started_at: UTCDatetime | None = None
    finished_at: UTCDatetime | None = None
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
    """CP exchanges + weight sync: the two columns below."""
    cp_comm_bytes_per_step_per_chip: int | None = None
    grad_sync_bytes_per_step_per_chip: int | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    max_rel_err: float | None = None


_TRIALS = TypeAdapter(list[TrialPublic])


def trials_from_mappings(rows) -> list[TrialPublic]:
    """TrialPublic from rows of `crud.public_trial_columns()` (or equivalent dicts)."""
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
        out.append(data)
    return _TRIALS.validate_python(out)


class TrialsPublic(BaseModel):
    data: list[TrialPublic]
    count: int


class ComponentHealth(BaseModel):
    ok: bool | None
    """True reachable, False not, None not used by this process."""
    detail: str


class HealthPublic(BaseModel):
    status: Literal["ok", "unavailable"]
    database: ComponentHealth
    ray: ComponentHealth


class OptionsPublic(BaseModel):
    """What the create-sweep form offers (the same closed sets the API validates against)."""

    frameworks: list[str]
    modes: list[str]
    presets: list[str]
    dtypes: list[str]
    param_shardings: list[str]
    remats: list[str]
    accelerator_kinds: list[str]
    accelerator_types: list[str]
    trial_statuses: list[str]
    result_sort_fields: list[str]
    grid_cap: int
    auth_required: bool
