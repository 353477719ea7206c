"""`GET /metrics`: the service for Prometheus (prometheus-client's text format).

Two kinds of series, each with its source:
- Requests this process served: `gdn_sweep_http_requests_total{method, route, status}` and
  `gdn_sweep_http_request_duration_seconds{method, route}`, counted by an ASGI middleware
  around the whole app (time spent waiting for an API slot included). `route` is the route's
  template (`/api/sweeps/{sweep_id}`), never the raw path, so ids do not make new series;
  a request no route matched is `unmatched`.
- State read when Prometheus scrapes (a custom collector, nothing cached): sweeps and trials
  by status, the queue's depth and the schedule lag from the database
  (service/db/operator_counts.py), this host's result spool (service/runs/spool.py) and the
  profile traces held under the artifact directory (workers/profile_store.py). The
  database read gets DB_READ_TIMEOUT_S on a thread of its own; when it fails or is slow the
  scrape still answers 200, with `gdn_sweep_db_up 0` and the database's series left out (the
  spool's are read from disk and stay).

Each process has its own registry: under `serve --workers N` a scrape reaches one worker, so
request counters are that worker's (sum them over `instance` in queries); the database's
gauges are the same from any.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
import time

from fastapi import FastAPI, Response
from fastapi.routing import iter_route_contexts
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, \
    generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import Mount, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.config import Settings
from service.db.models import utcnow
from service.db.operator_counts import operator_counts
from service.runs.spool import Spool
from workers.profile_store import held_traces

log = logging.getLogger(__name__)
DB_READ_TIMEOUT_S = 3.0
"""How long a scrape waits for the database's counts (Prometheus' default scrape timeout is
10 s; a database that drops packets would hold a connection attempt longer)."""
UNMATCHED = "unmatched"


class RouteTemplates:
    """The template of the app's route a path belongs to (`/api/sweeps/7` → `/api/sweeps/{
    sweep_id}`, a mount's files → `/static/{path}`), from FastAPI's flattened route list, read
    at the first request (every route is added by then)."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._patterns: list[tuple[re.Pattern, str]] | None = None

    def template(self, path: str) -> str:
        if self._patterns is None:
            self._patterns = []
            for context in iter_route_contexts(self._app.routes):
                template = context.path_format
                if not template:
                    continue
                if isinstance(context.original_route, Mount):  # any file under its prefix
                    prefix = re.escape(template.removesuffix("/{path}"))
                    self._patterns.append((re.compile(f"^{prefix}/.*$"), template))
                else:
                    self._patterns.append((compile_path(template)[0], template))
        return next((template for pattern, template in self._patterns if pattern.match(path)),
                    UNMATCHED)


class RequestMetrics:
    """ASGI middleware: count and time every HTTP request by method, route template, status."""

    def __init__(self, app: ASGIApp, *, routes: RouteTemplates, requests: Counter,
                 duration: Histogram) -> None:
        self.app, self.routes, self.requests, self.duration = app, routes, requests, duration

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), 500  # an exception before any answer is a 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = self.routes.template(scope["path"])
            self.requests.labels(scope["method"], route, str(status)).inc()
            self.duration.labels(scope["method"], route).observe(time.perf_counter() - started)


class ServiceCollector(Collector):
    """The gauges read at scrape time (see the module docstring)."""

    def __init__(self, *, session_factory: sessionmaker[Session], spool: Spool,
                 artifact_dir: str, profile_max_bytes: int) -> None:
        self._session_factory, self._spool = session_factory, spool
        self._artifact_dir, self._profile_max_bytes = artifact_dir, profile_max_bytes
        # One read at a time: a scrape while an earlier read still hangs does not start another.
        self._reader = concurrent.futures.ThreadPoolExecutor(1, "gdn-sweep-metrics")
        self._reading: concurrent.futures.Future | None = None

    def close(self) -> None:
        """Stop the reader thread (a read still hanging is abandoned, not waited for)."""
        self._reader.shutdown(wait=False, cancel_futures=True)

    def collect(self):
        yield from self._spool_gauges()
        yield from self._profile_gauges()
        counts = self._read_database()
        up = GaugeMetricFamily("gdn_sweep_db_up", "1 when the database answered this scrape's "
                               "reads, else 0 (its series are then left out)")
        up.add_metric([], 0 if counts is None else 1)
        yield up
        if counts is not None:
            yield from _database_gauges(counts)

    def _read_database(self):
        if self._reading is None or self._reading.done():
            self._reading = self._reader.submit(self._counts)
        try:
            return self._reading.result(timeout=DB_READ_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            log.warning("metrics: the database did not answer within %.0f s", DB_READ_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - reported as db_up 0, never a failed scrape
            log.warning("metrics: the database is unreachable: %s", type(err).__name__)
        return None

    def _counts(self):
        with self._session_factory() as session:
            return operator_counts(session=session, now=utcnow())

    def _spool_gauges(self):
        backlog = self._spool.backlog()
        for name, value, help_text in (
                ("gdn_sweep_spool_files", backlog.files,
                 "result spool files on this host (a sweep's sink with results not yet stored, "
                 "or a dead process's, replayed at the next start)"),
                ("gdn_sweep_spool_unstored_results", backlog.unstored_results,
                 "results in this host's spool files that the database does not have yet"),
                ("gdn_sweep_spool_set_aside_files", backlog.set_aside_files,
                 "spool files set aside as *.unstored: results the database refused for good")):
            gauge = GaugeMetricFamily(name, help_text)
            gauge.add_metric([], value)
            yield gauge


    def _profile_gauges(self):
        traces = held_traces(self._artifact_dir)
        for name, value, help_text in (
                ("gdn_sweep_profile_bytes", sum(size for _, size, _ in traces),
                 "bytes of profile traces under the artifact directory (read from disk)"),
                ("gdn_sweep_profile_traces", len(traces),
                 "profile traces under the artifact directory"),
                ("gdn_sweep_profile_max_bytes", self._profile_max_bytes,
                 "the retention limit: beyond it the oldest traces are removed")):
            gauge = GaugeMetricFamily(name, help_text)
            gauge.add_metric([], value)
            yield gauge


def _database_gauges(counts):
    sweeps = GaugeMetricFamily("gdn_sweep_sweeps", "sweeps by status (database)",
                               labels=["status"])
    for status, n in counts.sweeps_by_status.items():
        sweeps.add_metric([status], n)
    trials = GaugeMetricFamily("gdn_sweep_trials", "trials by status (database)",
                               labels=["status"])
    for status, n in counts.trials_by_status.items():
        trials.add_metric([status], n)
    queued_sweeps = GaugeMetricFamily("gdn_sweep_queued_sweeps",
                                      "sweeps waiting for a scheduler (status queued)")
    queued_sweeps.add_metric([], counts.sweeps_by_status.get("queued", 0))
    queued_trials = GaugeMetricFamily("gdn_sweep_queued_trials", "pending trials of queued or "
                                      "running sweeps: trials the scheduler has yet to start")
    queued_trials.add_metric([], counts.queued_trials)
    lag = GaugeMetricFamily("gdn_sweep_schedule_lag_seconds", "how long ago the most overdue "
                            "unpaused schedule was due, 0 when none is (database)")
    lag.add_metric([], counts.schedule_lag_s)
    return sweeps, trials, queued_sweeps, queued_trials, lag


def install_metrics(app: FastAPI, settings: Settings) -> None:
    """Count `app`'s requests and serve GET /metrics from a registry of its own (the app's
    lifespan closes `app.state.metrics_collector`)."""
    registry = CollectorRegistry()
    requests = Counter("gdn_sweep_http_requests", "HTTP requests this process answered",
                       ["method", "route", "status"], registry=registry)
    duration = Histogram("gdn_sweep_http_request_duration_seconds", "seconds from a request's "
                         "arrival to its last byte, in this process", ["method", "route"],
                         registry=registry)
    app.state.metrics_collector = ServiceCollector(
        session_factory=app.state.session_factory,
        spool=Spool(settings.spool_dir, settings.database_url),
        artifact_dir=settings.artifact_dir, profile_max_bytes=settings.profile_max_bytes)
    registry.register(app.state.metrics_collector)
    app.add_middleware(RequestMetrics, routes=RouteTemplates(app), requests=requests,
                       duration=duration)

    @app.get("/metrics", tags=["health"], response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}},
                              "description": "Prometheus text format"}})
    def metrics() -> Response:
        """The service's metrics in Prometheus' text format (always 200: a database that
        cannot be read shows as `gdn_sweep_db_up 0`)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
