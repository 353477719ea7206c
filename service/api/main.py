"""The /api router: every route module mounted in one place."""

from fastapi import APIRouter

from .routes import health, options, results, sweeps, trials

api_router = APIRouter(prefix="/api")
for module in (sweeps, trials, results, health, options):
    api_router.include_router(module.router)
