"""GET /api/capacity: the capacity planner over the results database."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import SessionDep
from service.planner.capacity import plan_capacity
from service.planner.evidence import evidence_for
from service.planner.schemas import CapacityAnswer, CapacityRequest

router = APIRouter(tags=["capacity"])


@router.get("/capacity", response_model=CapacityAnswer)
def capacity(request: Annotated[CapacityRequest, Query()], session: SessionDep) -> CapacityAnswer:
    """Every (mode, chips, settings) for the target, with predicted memory, throughput, MFU and
    bytes, each labelled measured / interpolated / extrapolated with the trials it rests on."""
    return plan_capacity(evidence_for(session, request), request)
