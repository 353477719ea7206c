"""The FastAPI app: REST API under /api, dashboard pages, /metrics for Prometheus, the
scheduler in the background.

    uvicorn --factory service.main:create_app      (or `gdn-sweep serve`)

`gdn-sweep serve` loads `serve_app` (the settings and the log configuration from the
environment) in each of its uvicorn workers.
"""

from __future__ import annotations

import gc
import logging
from contextlib import asynccontextmanager

import anyio
from anyio import to_thread
from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.docs import install_docs
from service.api.errors import install_error_handlers
from service.api.guards import install_guards
from service.api.main import api_router
from service.api.prometheus import install_metrics
from service.core.config import Settings, get_settings
from service.core.logging import configure_logging, sweep_event_logger
from service.dashboard import mount_dashboard
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.read_cache import ResponseCache
from service.runs.ray_setup import RayConnection
from service.runs.schedule_firing import ScheduleLoop
from service.runs.sweep_queue import Scheduler

log = logging.getLogger(__name__)


def build_scheduler(session_factory: sessionmaker[Session], settings: Settings) -> Scheduler:
    """The scheduler of `settings`, logging one line per trial event with its sweep's id."""
    scheduler: Scheduler | None = None
    scheduler = Scheduler(session_factory=session_factory, settings=settings,
                          ray=RayConnection.from_settings(settings),
                          on_event=sweep_event_logger(lambda: scheduler.running_sweep_id))
    return scheduler


def build_schedule_loop(session_factory: sessionmaker[Session], settings: Settings,
                        scheduler: Scheduler) -> ScheduleLoop:
    """The thread that fires due schedules beside `scheduler`, waking it for each sweep."""
    return ScheduleLoop(session_factory=session_factory, settings=settings,
                        on_created=lambda _sweep_id: scheduler.wake())


class ApiConcurrencyLimit:
    """At most `limit` API requests inside the app at once; the rest wait at the door, in
    order, holding nothing.

    An API request holds its database session from its first query until its response is
    sent, and hops to the thread pool up to three times (session, endpoint, response
    validation). With more requests inside than pool connections, the threads block waiting
    for connections that requests waiting for a thread hold: under 500 concurrent reads the
    pool timed out (30 s, then 500s). With `limit` = threads <= connections, every request
    inside gets a connection and a thread at once."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app, self.limit = app, limit
        self._slots: anyio.Semaphore | None = None  # made in the server's event loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or not scope["path"].startswith("/api/")
                or scope["path"] == "/api/health/live"):  # no database session: no wait
            await self.app(scope, receive, send)
            return
        if self._slots is None:
            self._slots = anyio.Semaphore(self.limit)
        async with self._slots:
            await self.app(scope, receive, send)


def create_app(settings: Settings | None = None, *, freeze_startup: bool = False) -> FastAPI:
    """Build the app for `settings` (default: from the environment). `freeze_startup`: for
    the app that is its process's life (a serve worker), hide everything made up to the end
    of startup from the garbage collector (gc.freeze)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Sync routes run in anyio's thread pool: as many threads as database connections.
        to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        if settings.upgrade_on_start:
            revision = await run_in_threadpool(upgrade_database, settings.database_url)
            log.info("database at revision %s", revision)
        if app.state.scheduler is not None:
            app.state.scheduler.start()
            log.info("scheduler started", extra={"runner": app.state.scheduler.runner_id})
            app.state.schedule_loop.start()
        if freeze_startup:
            # What the process holds once started (modules, the app, its routes and schemas)
            # lives as long as it does: out of the collector's sight, a full collection scans
            # only what requests made (under load its pauses went from ~100 ms to ~20 ms).
            gc.freeze()
        try:
            yield
        finally:
            if app.state.scheduler is not None:
                await run_in_threadpool(app.state.schedule_loop.stop)
                await run_in_threadpool(app.state.scheduler.stop)
                log.info("scheduler stopped")
                await run_in_threadpool(app.state.scheduler.ray.shutdown)
            app.state.metrics_collector.close()
            app.state.engine.dispose()

    app = FastAPI(title="gdn-sweep", version="0.1.0", lifespan=lifespan,
                  docs_url=None, redoc_url=None,  # FastAPI's load from a CDN; see install_docs
                  description="Sweeps of Gated DeltaNet training under context parallelism: "
                              "submit grids, follow trials, query results.")
    engine = make_engine(settings.database_url, threads=settings.api_threads)
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = make_session_factory(engine)
    app.state.results_cache = ResponseCache(settings.results_cache_entries)
    app.state.scheduler = (build_scheduler(app.state.session_factory, settings)
                           if settings.run_scheduler else None)
    app.state.schedule_loop = (None if app.state.scheduler is None else build_schedule_loop(
        app.state.session_factory, settings, app.state.scheduler))
    install_error_handlers(app)
    install_guards(app, settings)
    app.add_middleware(ApiConcurrencyLimit, limit=settings.api_threads)
    install_metrics(app, settings)  # its middleware outermost: waits at the door count too
    app.include_router(api_router)
    install_docs(app)
    mount_dashboard(app)
    return app


def serve_app() -> FastAPI:
    """The app of one `gdn-sweep serve` worker: settings and log format from the environment
    (serve exports its options there, so every worker process gets the same)."""
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    return create_app(settings, freeze_startup=True)
