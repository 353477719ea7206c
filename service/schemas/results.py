"""GET /api/results (and `gdn-sweep results`): the filters and the CSV rendering. The rows are
TrialPublic (service.schemas.trials); the query is service.db.results_query's."""

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

from gdn_core.config import Layers
from gdn_core.cp_layout import Layout
from gdn_core.cp_modes import AttnCPMode
from gdn_core.kernels import Kernels
from gdn_core.train_config import Framework, ParamSharding, Remat
from service.db.bounds import DB_INT_MAX, DbInt
from service.db.results_query import SORT_FIELDS
from service.schemas.trials import TrialPublic
from workers.grid import TrialMode
from workers.result import FinalStatus
from workers.sweep_spec import AcceleratorKind, Documents, DType, TrialKind, check_plain_text

JSON_PAGE = 100

FilterText = Annotated[StrictStr, Field(max_length=200), BeforeValidator(check_plain_text)]
"""A text filter value: no control characters (PostgreSQL refuses NUL) or lone surrogates."""


class ResultFilters(BaseModel):
    """Query parameters of GET /api/results (repeat a list parameter to match any of them)."""

    model_config = ConfigDict(extra="forbid")
    status: list[FinalStatus] = Field(default=["succeeded"], min_length=1, description=(
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

    @property
    def page_limit(self) -> int | None:
        """Rows of the page: `limit`, else JSON_PAGE for JSON and every row for CSV."""
        return self.limit or (JSON_PAGE if self.format == "json" else None)


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
