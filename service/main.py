"""The FastAPI app: REST API under /api, dashboard pages, the scheduler in the background.

    uvicorn --factory service.main:create_app      (or `gdn-sweep serve`)
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from .api.errors import install_error_handlers
from .api.guards import install_guards
from .api.main import api_router
from .core.config import Settings, get_settings
from .core.db import make_engine, make_session_factory, upgrade_database
from .dashboard import mount_dashboard
from .scheduler import Scheduler

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app for `settings` (default: from the environment)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if settings.upgrade_on_start:
            revision = await run_in_threadpool(upgrade_database, settings.database_url)
            log.info("database at revision %s", revision)
        if app.state.scheduler is not None:
            app.state.scheduler.start()
        try:
            yield
        finally:
            if app.state.scheduler is not None:
                await run_in_threadpool(app.state.scheduler.stop)
                app.state.scheduler.ray.shutdown()
            app.state.engine.dispose()

    app = FastAPI(title="gdn-sweep", version="0.1.0", lifespan=lifespan,
                  description="Sweeps of Gated DeltaNet training under context parallelism: "
                              "submit grids, follow trials, query results.")
    engine = make_engine(settings.database_url)
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = make_session_factory(engine)
    app.state.scheduler = (Scheduler(session_factory=app.state.session_factory,
                                     settings=settings) if settings.run_scheduler else None)
    install_error_handlers(app)
    install_guards(app, settings)
    app.include_router(api_router)
    mount_dashboard(app)
    return app
