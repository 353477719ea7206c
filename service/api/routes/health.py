"""Liveness of what the service needs: the database and Ray."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ...core.db import ping
from ...schemas import ComponentHealth, HealthPublic

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthPublic,
            responses={503: {"model": HealthPublic, "description": "a component is unreachable"}})
def health(request: Request) -> JSONResponse:
    """200 when the database answers and Ray is reachable (or unused here); 503 otherwise."""
    try:
        ping(request.app.state.engine)
        database = ComponentHealth(ok=True, detail=request.app.state.engine.url.render_as_string(
            hide_password=True))
    except Exception as err:  # noqa: BLE001 - reported, not raised
        database = ComponentHealth(ok=False, detail=f"{type(err).__name__}: {err}")
    scheduler = request.app.state.scheduler
    if scheduler is None:
        ray = ComponentHealth(ok=None, detail="no scheduler in this process "
                                              "(GDN_SWEEP_RUN_SCHEDULER=false)")
    else:
        ok, detail = scheduler.ray.health()
        ray = ComponentHealth(ok=ok, detail=detail)
    healthy = database.ok and ray.ok is not False
    body = HealthPublic(status="ok" if healthy else "unavailable", database=database, ray=ray)
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if healthy else 503)
