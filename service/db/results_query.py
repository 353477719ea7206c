"""GET /api/results' query: the sort keys, the filters as SQL, and the page of TrialRows.

The filters come as service.schemas.results.ResultFilters (read by attribute: the database
layer imports no API model); the routes turn the rows into TrialPublic.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db.crud import TrialRow, public_trials
from service.db.models import Result

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


def _where(filters) -> list:
    """The WHERE clauses of a ResultFilters: each list matches any of its values."""
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


def query_results(*, session: Session, filters) -> tuple[list[TrialRow], int]:
    """The trials matching `filters` (a ResultFilters), sorted and paged, and how many match
    in all.

    Filters, counts, sorts and paging read `results` alone (its own indexes); only the page's
    rows are joined to their trials."""
    where = _where(filters)
    count = session.scalar(select(func.count()).select_from(Result).where(*where)) or 0
    # rows without metrics (plans, trials that did not succeed) sort as plans do: NULLs last
    order_by = _order_by(filters.sort, with_plans="plan" in filters.kind
                         or filters.status != ["succeeded"])
    page = (select(Result.trial_id).where(*where).order_by(*order_by)
            .offset(filters.offset).limit(filters.page_limit))
    return public_trials(session=session, ids=page, order_by=order_by), count
