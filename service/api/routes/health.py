"""Liveness (the process serves) and readiness (the database answers, Ray is reachable).

Unauthenticated, so the bodies say only reachable / unreachable and at most an error's class
name; the full error goes to the server log.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.api.guards import RETRY_AFTER_S
from service.db.engine import ping
from service.schemas.system import ComponentHealth, HealthPublic, LivenessPublic

log = logging.getLogger(__name__)
router = APIRouter(prefix="/health", tags=["health"])


@router.get("/live", response_model=LivenessPublic)
def live() -> LivenessPublic:
    """200 while the process serves requests (touches no database)."""
    return LivenessPublic(status="ok")


@router.get("", response_model=HealthPublic,
            responses={503: {"model": HealthPublic, "description": "a component is unreachable"}})
@router.get("/ready", response_model=HealthPublic,
            responses={503: {"model": HealthPublic, "description": "a component is unreachable"}})
def ready(request: Request) -> JSONResponse:
    """200 when the database answers and Ray is reachable (or unused here); else 503 with
    Retry-After. `/api/health` is the same check."""
    engine = request.app.state.engine
    backend = engine.url.get_backend_name()
    try:
        ping(engine)
        database = ComponentHealth(ok=True, detail=f"{backend} reachable")
    except Exception as err:  # noqa: BLE001 - reported, not raised
        log.warning("readiness: the %s database is unreachable: %s", backend, err)
        database = ComponentHealth(ok=False, detail=f"{backend} unreachable "
                                                    f"({type(err).__name__})")
    ray = _ray_health(request.app.state.scheduler)
    healthy = database.ok and ray.ok is not False
    body = HealthPublic(status="ok" if healthy else "unavailable", database=database, ray=ray)
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if healthy else 503,
                        headers=None if healthy else {"Retry-After": str(RETRY_AFTER_S)})


def _ray_health(scheduler) -> ComponentHealth:
    if scheduler is None:
        return ComponentHealth(ok=None, detail="not used by this process "
                                               "(GDN_SWEEP_RUN_SCHEDULER=false)")
    ok, detail = scheduler.ray.health()
    if ok is None:
        return ComponentHealth(ok=None, detail="not connected yet")
    if ok:
        return ComponentHealth(ok=True, detail="reachable")
    log.warning("readiness: Ray is unreachable: %s", detail)
    error_class = detail.split(":", 1)[0]  # RayConnection reports "ErrorClass: message"
    return ComponentHealth(ok=False, detail=f"unreachable ({error_class})"
                           if error_class.isidentifier() else "unreachable")
