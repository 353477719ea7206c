"""GET /api/results: the filters, the sort keys, the query, and the CSV rendering."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    field_validator,
    model_validator,
)
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gdn_core.config import Layers
from gdn_core.cp_layout import Layout
from gdn_core.cp_modes import AttnCPMode
from gdn_core.kernels import Kernels
from gdn_core.train_config import ParamSharding, Remat
from service.db.bounds import DB_INT_MAX, DbInt
from service.db.crud import public_trials
from service.db.models import Result
from service.db.schemas import TrialPublic
from workers.grid import TrialMode
from workers.sweep_spec import (AcceleratorKind, Documents, DType, Framework, TrialKind,
                                check_plain_text)

SORT_FIELDS = {
    "tokens_per_s_per_chip": Result.tokens_per_s_per_chip, "mfu": Result.mfu,
    "hfu": Result.hfu, "step_time_s": Result.step_time_s,
    "step_time_max_s": Result.step_time_max_s, "compile_time_s": Result.compile_time_s,
    "peak_memory_bytes_per_chip": Result.peak_memory_bytes_per_chip,
    "estimated_memory_bytes_per_chip": Result.estimated_memory_bytes_per_chip,
    "predicted_memory_bytes_per_chip": Result.predicted_memory_bytes_per_chip,
    "comm_bytes_per_step_per_chip": Result.comm_bytes_per_step_per_chip,
    "cp_comm_bytes_per_step_per_chip": Result.cp_comm_bytes_per_step_per_chip,
    "grad_sync_bytes_per_step_per_chip": Result.grad_sync_bytes_per_step_per_chip,
    "finished_at": Result.finished_at, "seq_len": Result.seq_len, "chips": Result.chips,
    "dp": Result.dp,
    "mode": Result.mode, "framework": Result.framework, "preset": Result.preset,
    "layers": Result.layers, "attn_cp": Result.attn_cp, "layout": Result.layout,
    "kernels": Result.kernels, "documents": Result.documents,
    "sweep_id": Result.sweep_id, "repeat": Result.repeat, "id": Result.trial_id,
}
"""Accepted `sort` keys (comma-separated; a leading '-' sorts descending)."""

ResultStatus = Literal["succeeded", "failed", "oom", "timeout", "skipped", "cancelled"]
"""A finished trial's outcome (its `results` row)."""

JSON_PAGE = 100

FilterText = Annotated[StrictStr, Field(max_length=200), BeforeValidator(check_plain_text)]
"""A text filter value: no control characters (PostgreSQL refuses NUL) or lone surrogates."""


class ResultFilters(BaseModel):
    """Query parameters of GET /api/results (repeat a list parameter to match any of them)."""

    model_config = ConfigDict(extra="forbid")
    status: list[ResultStatus] = Field(default=["succeeded"], min_length=1, description=(
        "the outcome: succeeded (the default), failed, oom, timeout, skipped or cancelled "
        "(why in `error`: the skip reason or the failure); repeat for several"))
    kind: list[TrialKind] = Field(default=["measure"], description="measure (the default) or "
                                  "plan (compile-only: no throughput); repeat for both")
    preset: list[FilterText] = []
    framework: list[Framework] = []
    mode: list[TrialMode] = Field(default=[], description="a CP mode, or none: one-chip "
                                  "baselines")
    chips: list[DbInt] = Field(default=[], description="all chips of a trial's mesh "
                               "(dp replicas × CP chips)")
    dp: list[DbInt] = Field(default=[], description="data-parallel replicas (1: one CP group "
                            "over every chip)")
    seq_len_min: DbInt | None = Field(default=None, ge=1)
    seq_len_max: DbInt | None = Field(default=None, ge=1)
    accelerator: list[FilterText] = Field(default=[], description="chip type: cpu, h100, v5p, …")
    accelerator_kind: list[AcceleratorKind] = []
    dtype: list[DType] = []
    param_sharding: list[ParamSharding] = []
    remat: list[Remat] = []
    layers: list[Layers] = Field(default=[], description="the decoder: gdn_only or hybrid")
    attn_cp: list[AttnCPMode] = Field(default=[], description="the hybrid's attention CP mode "
                                      "(GDN-only rows and one-chip baselines have none)")
    layout: list[Layout] = Field(default=[], description="contiguous or zigzag")
    kernels: list[Kernels] = Field(default=[], description="reference (this project's code) "
                                   "or fused (library kernels)")
    documents: list[Documents] = Field(default=[], description="how sequences were packed: "
                                       "single, or uniform:LO-HI")
    repeat: list[DbInt] = Field(default=[], description="run of a repeated grid point (0, 1, …)")
    device_name: list[FilterText] = Field(default=[],
                                          description="the chip as its runtime names it")
    memory_source: list[FilterText] = Field(default=[], description="what the measured peak "
                                            "memory is: process_rss_peak, cuda_max_allocated, …")
    sweep_id: DbInt | None = None
    sort: FilterText = "-tokens_per_s_per_chip"
    offset: int = Field(default=0, ge=0, le=DB_INT_MAX)
    limit: int | None = Field(default=None, ge=1, le=100_000,
                              description=f"default {JSON_PAGE} for JSON, every row for CSV")
    format: Literal["json", "csv"] = "json"

    @field_validator("sort")
    @classmethod
    def _known_sort_keys(cls, sort: str) -> str:
        for part in sort.split(","):
            if part.strip().lstrip("-") not in SORT_FIELDS:
                raise ValueError(f"sort key {part.strip()!r} is not one of: "
                                 f"{', '.join(SORT_FIELDS)} (prefix '-' for descending)")
        return sort

    @model_validator(mode="after")
    def _range(self) -> ResultFilters:
        if self.seq_len_min and self.seq_len_max and self.seq_len_min > self.seq_len_max:
            raise ValueError(f"seq_len_min={self.seq_len_min} is larger than "
                             f"seq_len_max={self.seq_len_max}")
        return self


def _where(filters: ResultFilters) -> list:
    statuses = filters.status
    where = [Result.status == statuses[0] if len(statuses) == 1 else Result.status.in_(statuses)]
    for values, column in ((filters.kind, Result.kind), (filters.preset, Result.preset),
                           (filters.framework, Result.framework),
                           (filters.mode, Result.mode), (filters.chips, Result.chips),
                           (filters.dp, Result.dp),
                           (filters.accelerator, Result.accelerator_type),
                           (filters.accelerator_kind, Result.accelerator_kind),
                           (filters.dtype, Result.dtype),
                           (filters.param_sharding, Result.param_sharding),
                           (filters.remat, Result.remat), (filters.repeat, Result.repeat),
                           (filters.layers, Result.layers), (filters.attn_cp, Result.attn_cp),
                           (filters.layout, Result.layout), (filters.kernels, Result.kernels),
                           (filters.documents, Result.documents),
                           (filters.device_name, Result.device_name),
                           (filters.memory_source, Result.memory_source)):
        if values:
            where.append(column == values[0] if len(values) == 1 else column.in_(values))
    if filters.seq_len_min is not None:
        where.append(Result.seq_len >= filters.seq_len_min)
    if filters.seq_len_max is not None:
        where.append(Result.seq_len <= filters.seq_len_max)
    if filters.sweep_id is not None:
        where.append(Result.sweep_id == filters.sweep_id)
    return where


_INDEXED_SORTS = ("tokens_per_s_per_chip", "mfu")
"""Sorted by an index (status, key, trial_id): succeeded measured trials always have these
metrics, so NULL placement is left to the database (first for DESC on PostgreSQL, last on
SQLite) unless plan rows (which have none) are asked for."""


def _order_by(sort: str, *, with_plans: bool = False) -> list:
    order, first_desc = [], None
    for part in sort.split(","):
        part = part.strip()
        name, desc = part.lstrip("-"), part.startswith("-")
        first_desc = desc if first_desc is None else first_desc
        column = SORT_FIELDS[name].desc() if desc else SORT_FIELDS[name].asc()
        indexed = name in _INDEXED_SORTS and not with_plans
        order.append(column if indexed else column.nulls_last())
    tie = Result.trial_id.desc() if first_desc else Result.trial_id.asc()
    return [*order, tie]  # the tie-breaker follows the first key: one index scan serves both


def query_results(*, session: Session, filters: ResultFilters) -> tuple[list[TrialPublic], int]:
    """Succeeded trials matching `filters`, sorted and paged, and how many match in all.

    Filters, counts, sorts and paging read `results` alone (its own indexes); only the page's
    rows are joined to their trials."""
    where = _where(filters)
    count = session.scalar(select(func.count()).select_from(Result).where(*where)) or 0
    limit = filters.limit or (JSON_PAGE if filters.format == "json" else None)
    # rows without metrics (plans, trials that did not succeed) sort as plans do: NULLs last
    order_by = _order_by(filters.sort, with_plans="plan" in filters.kind
                         or filters.status != ["succeeded"])
    page = (select(Result.trial_id).where(*where).order_by(*order_by)
            .offset(filters.offset).limit(limit))
    return public_trials(session=session, ids=page, order_by=order_by), count


CSV_COLUMNS: tuple[str, ...] = tuple(TrialPublic.model_fields)


def to_csv(rows: Sequence[TrialPublic]) -> str:
    """One header line, then one line per trial (hosts and versions as JSON)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        data = row.model_dump(mode="json")
        writer.writerow([json.dumps(data[c]) if isinstance(data[c], (dict, list)) else
                         ("" if data[c] is None else data[c]) for c in CSV_COLUMNS])
    return out.getvalue()

