"""GET /api/capacity: the capacity planner over the results database, cached like the results
pages (service/db/read_cache.py): per validated request under the `results` counter, so an
answer is served again only while no succeeded result (the planner's only evidence) changed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from service.api.deps import ResultsCacheDep, SessionDep
from service.db.read_cache import data_version
from service.planner.capacity import plan_capacity
from service.planner.evidence import evidence_for
from service.planner.form_defaults import PlannerForm, form_defaults
from service.schemas.planner import CapacityAnswer, CapacityRequest

router = APIRouter(tags=["capacity"])


@router.get("/capacity", response_model=CapacityAnswer)
def capacity(request: Annotated[CapacityRequest, Query()], session: SessionDep,
             cache: ResultsCacheDep):
    """Every (mode, chips, settings) for the target, with predicted memory, throughput, MFU and
    bytes, each labelled measured / interpolated / extrapolated with the trials it rests on."""
    key = "capacity:" + request.model_dump_json()
    version = data_version(session, "results") if cache.enabled else None  # None: not cached
    body = cache.get(key, version)
    if body is None:
        body = plan_capacity(evidence_for(session, request), request).model_dump_json().encode()
        cache.put(key, version, body)
    return Response(body, media_type="application/json")


@router.get("/capacity/defaults", response_model=PlannerForm)
def capacity_defaults(session: SessionDep) -> PlannerForm:
    """The planner form's choices (layers, attn_cps, layouts) and its defaults: the settings of
    the stored measured trials (their preset, chip type, dtype, frameworks, longest sequence
    and largest mesh), so the first question is one they answer."""
    return form_defaults(session)
