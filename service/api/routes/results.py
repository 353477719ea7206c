"""Finished trials across sweeps (succeeded ones by default): filters, sorting, paging, CSV."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from service.api.deps import ResultsCacheDep, SessionDep
from service.db.read_cache import data_version
from service.db.results_query import query_results
from service.schemas.results import ResultFilters, to_csv
from service.schemas.trials import TrialPublic, TrialsPublic

router = APIRouter(tags=["results"])


@router.get("/results", response_model=TrialsPublic,
            responses={200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with "
                             "?format=csv (header X-Total-Count: rows matching)"}})
def read_results(filters: Annotated[ResultFilters, Query()], session: SessionDep,
                 cache: ResultsCacheDep):
    """Trials matching the filters (succeeded ones unless `status` names others); `count` is
    the total before paging."""
    if filters.format == "csv":
        rows, count = query_results(session=session, filters=filters)
        csv = to_csv(TrialPublic.from_rows(rows))
        return Response(csv, media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": 'attachment; filename="gdn-sweep-results.csv"',
            "X-Total-Count": str(count)})
    key = filters.model_dump_json()
    version = data_version(session, "results") if cache.enabled else None  # None: not cached
    body = cache.get(key, version)
    if body is None:
        rows, count = query_results(session=session, filters=filters)
        body = TrialsPublic(data=TrialPublic.from_rows(rows),
                            count=count).model_dump_json().encode()
        cache.put(key, version, body)
    return Response(body, media_type="application/json")
