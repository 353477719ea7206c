"""The /api router: every route module mounted in one place."""

from fastapi import APIRouter

from service.api.deps import ReadTokenDep

from service.api.routes import (
    capacity,
    environments,
    health,
    options,
    regressions,
    results,
    schedules,
    sweeps,
    trials,
)

api_router = APIRouter(prefix="/api")
api_router.include_router(health.router)  # open: probes carry no token, and it holds no data
for module in (sweeps, trials, environments, results, capacity, options, schedules,
               regressions):
    api_router.include_router(module.router, dependencies=[ReadTokenDep])
