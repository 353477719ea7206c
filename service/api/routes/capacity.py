"""GET /api/capacity: the capacity planner over the results database."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import SessionDep
from service.planner.capacity import CapacityAnswer, CapacityRequest, plan_capacity
from service.planner.evidence import load_observations

router = APIRouter(tags=["capacity"])


@router.get("/capacity", response_model=CapacityAnswer)
def capacity(request: Annotated[CapacityRequest, Query()], session: SessionDep) -> CapacityAnswer:
    """Every (mode, chips, settings) for the target, with predicted memory, throughput, MFU and
    bytes, each labelled measured / interpolated / extrapolated with the trials it rests on."""
    observations = load_observations(session, preset=request.preset,
                                     accelerator_type=request.accelerator,
                                     sweep_ids=request.sweep_id)
    return plan_capacity(observations, request)
