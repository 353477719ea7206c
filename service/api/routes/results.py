"""Succeeded trials across sweeps: filters, sorting, paging, CSV."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from ...results_query import ResultFilters, query_results, to_csv
from ...schemas import TrialsPublic
from ..deps import SessionDep

router = APIRouter(tags=["results"])


@router.get("/results", response_model=TrialsPublic,
            responses={200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with "
                             "?format=csv (header X-Total-Count: rows matching)"}})
def read_results(filters: Annotated[ResultFilters, Query()], session: SessionDep):
    """Succeeded trials matching the filters; `count` is the total before paging."""
    rows, count = query_results(session=session, filters=filters)
    if filters.format == "csv":
        return Response(to_csv(rows), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": 'attachment; filename="gdn-sweep-results.csv"',
            "X-Total-Count": str(count)})
    return TrialsPublic(data=rows, count=count)
