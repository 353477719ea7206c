"""Open regressions of scheduled (or named) sweeps: level shifts of step time, tokens/s/chip
and peak memory per trial key, worst first (service/regressions/)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import Response
from pydantic import Field

from service.api.deps import ResultsCacheDep, SessionDep
from service.db.bounds import DB_INT_MAX
from service.db.read_cache import data_version
from service.regressions.report import ScopeError, regressions_report, resolve_scope
from service.schemas.schedules import Metric, RegressionsPublic
from workers.sweep_spec import PlainText

router = APIRouter(tags=["regressions"])
SWEEP_IDS_MAX = 500


@router.get("/regressions", response_model=RegressionsPublic)
def read_regressions(
        session: SessionDep, cache: ResultsCacheDep,
        schedule: Annotated[PlainText | None, Query(
            max_length=200, description="a schedule's name (its sweeps make the series)")] = None,
        sweep_id: Annotated[list[Annotated[int, Field(ge=1, le=DB_INT_MAX)]], Query(
            max_length=SWEEP_IDS_MAX,
            description="sweeps that make the series instead (repeat the parameter)")] = [],  # noqa: B006
        metric: Annotated[list[Metric], Query(description="only these metrics")] = []):  # noqa: B006
    """Open regressions, worst first, each with its series (the plot) and environment diff,
    and the improvements; of every schedule, of the schedule(s) named `schedule`, or of the
    sweeps `sweep_id` as one set. A series is one trial key (repeats are one run)."""
    try:
        schedule_ids, sweep_ids = resolve_scope(session=session, schedule=schedule,
                                                sweep_ids=sweep_id)
    except ScopeError as err:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
            "type": "value_error", "loc": ["query", "sweep_id" if sweep_id else "schedule"],
            "msg": str(err), "input": sweep_id or schedule}]) from None
    # computed on read, cached under the results' counter and the scope it resolved to
    key = f"regressions:{schedule_ids}:{sweep_ids}:{sorted(metric)}"
    version = data_version(session, "results") if cache.enabled else None
    body = cache.get(key, version)
    if body is None:
        body = regressions_report(session=session, schedule_ids=schedule_ids,
                                  sweep_ids=sweep_ids, metrics=metric).model_dump_json().encode()
        cache.put(key, version, body)
    return Response(body, media_type="application/json")
