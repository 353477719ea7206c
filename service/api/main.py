"""The /api router: every route module mounted in one place."""

from fastapi import APIRouter

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
for module in (sweeps, trials, environments, results, capacity, health, options, schedules,
               regressions):
    api_router.include_router(module.router)
