"""The API's perimeter: one ASGI middleware in front of every route, and the answer to a
database outage.

- Host: only `allowed_hosts`, or the address the connection arrived on; else 400 (a page on a
  DNS name rebound to this machine cannot talk to it).
- POST, PUT, PATCH, DELETE whose `Origin` is neither the service's own nor in
  `allowed_origins`, or sent with `Sec-Fetch-Site: cross-site`: 403 (no cross-site cancel).
- A body over `max_request_bytes`: 413, whether declared (Content-Length) or streamed
  (counted as it arrives, before the app sees any of it).
- Security headers on every response (CSP, nosniff, no framing, no referrer).
- The results database unreachable: 503 JSON with Retry-After on every route that needs it
  (the pool's pre-ping reconnects once it is back).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.docs import (
    DOCS_PATHS,
    REDOC_SCROLLBAR_STYLE_HASH,
    REDOC_STYLE_HASH,
    SWAGGER_INIT_HASH,
)
from service.core.config import Settings

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
"""What a 503 tells clients to wait before retrying (seconds)."""
DATABASE_UNAVAILABLE = "the results database is unavailable; retry later"
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

EMPTY_STYLE_HASH = "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
"""CSP hash of an empty <style>: plotly.js adds one and fills it through CSSOM (insertRule,
which CSP does not govern), so no inline style source needs to be allowed. The same hash, with
'unsafe-hashes', admits an empty style *attribute*: plotly's colour bar resets its fill rects
with `style=""` (the compare page's parallel coordinates); any other style attribute stays
refused, and an empty one styles nothing."""
PLOTLY_MAPLIBRE_STYLE_HASH = "'sha256-ji27qzEtxXZW+7dun6UwjHXJ18e6WAin1VvNtkzIE/o='"
"""CSP hash of the maplibre-gl stylesheet plotly.js 4.1.1 injects as a <style> when it loads
(both bundles served: the plotly package's and vendor/plotly-strict.min.js). It only styles
`.maplibregl-*` elements of map traces, which the dashboard never draws; admitting it by hash
(not 'unsafe-inline') keeps every other inline style refused and the console free of the
refusal. A new plotly.js changes it: the browser tests then fail on the console error, whose
text names the new hash (tests/service/test_csp_hashes.py recomputes it from the bundles)."""
DASHBOARD_CSP = (f"default-src 'self'; script-src 'self'; "
                 f"style-src 'self' {EMPTY_STYLE_HASH} {PLOTLY_MAPLIBRE_STYLE_HASH}; "
                 f"style-src-attr 'unsafe-hashes' {EMPTY_STYLE_HASH}; "
                 "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
                 "frame-ancestors 'none'")
DOCS_CSP = (f"default-src 'self'; script-src 'self' {SWAGGER_INIT_HASH}; "
            f"style-src 'self' {REDOC_STYLE_HASH} {REDOC_SCROLLBAR_STYLE_HASH} {EMPTY_STYLE_HASH}; "
            "img-src 'self' data:; "
            "worker-src blob:; object-src 'none'; base-uri 'none'; form-action 'self'; "
            "frame-ancestors 'none'")
"""/docs and /redoc (service/api/docs.py): every asset from this origin, no other host (ReDoc's
"API docs by Redocly" logo on cdn.redoc.ly stays refused); the pages' fixed inline blocks
allowed by hash: Swagger UI's start script, ReDoc's margin reset and scrollbar CSS. ReDoc fills
an empty <style> through CSSOM, as plotly.js does, and runs its search in a worker made from a
blob: URL; Swagger UI draws its icons as data: images."""
SECURITY_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"no-referrer"))


def install_guards(app: FastAPI, settings: Settings) -> None:
    """Register the perimeter middleware and the database-outage handlers on `app`."""
    app.add_middleware(Perimeter, settings=settings)
    for error in (DBAPIError, PoolTimeoutError):
        app.add_exception_handler(error, database_unavailable)


def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 for a database that cannot be reached (any other database error is re-raised)."""
    if isinstance(exc, DBAPIError) and not (isinstance(exc, OperationalError | InterfaceError)
                                            or exc.connection_invalidated):
        raise exc
    log.warning("database unreachable during %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse({"detail": DATABASE_UNAVAILABLE}, status_code=503,
                        headers={"Retry-After": str(RETRY_AFTER_S)})


class Perimeter:
    """Host, Origin and body-size checks before the app, security headers after it."""

    def __init__(self, app: ASGIApp, *, settings: Settings) -> None:
        self.app = app
        self.allowed_hosts = frozenset(settings.allowed_hosts)
        self.allowed_origins = frozenset(settings.allowed_origins)
        self.max_bytes = settings.max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = self._with_security_headers(scope, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large()(scope, receive, send)
            return
        messages = await self._read_body(receive)
        if messages is None:
            await self._too_large()(scope, receive, send)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> JSONResponse | None:
        host = headers.get("host", "")
        if not self._host_allowed(scope, host):
            return JSONResponse({"detail": "unknown Host header; the service answers the names "
                                           "in GDN_SWEEP_ALLOWED_HOSTS"}, status_code=400)
        if scope["method"] not in MUTATING_METHODS:
            return None
        origin = headers.get("origin", "").lower().rstrip("/")
        if origin in self.allowed_origins:
            return None
        own = _origin(f"{scope['scheme']}://{host}".lower())
        cross_origin = origin and _origin(origin) != own
        if cross_origin or headers.get("sec-fetch-site") == "cross-site":
            return JSONResponse({"detail": f"cross-origin {scope['method']} refused: pages of "
                                           "other origins may not change sweeps (add yours to "
                                           "GDN_SWEEP_ALLOWED_ORIGINS)"}, status_code=403)
        return None

    def _host_allowed(self, scope: Scope, host: str) -> bool:
        name = _host_name(host)
        arrived_on = (scope.get("server") or ("",))[0]
        return bool(name) and ("*" in self.allowed_hosts or name in self.allowed_hosts
                               or name == str(arrived_on).lower())

    async def _read_body(self, receive: Receive) -> list[Message] | None:
        """The request's messages up to the end of its body; None once it grows past the limit."""
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return None
            if not message.get("more_body", False):
                return messages

    def _too_large(self) -> JSONResponse:
        return JSONResponse({"detail": f"request body over the limit of {self.max_bytes} bytes "
                                       "(GDN_SWEEP_MAX_REQUEST_BYTES)"}, status_code=413)

    def _with_security_headers(self, scope: Scope, send: Send) -> Send:
        csp = DOCS_CSP if scope["path"] in DOCS_PATHS else DASHBOARD_CSP
        added = (*SECURITY_HEADERS, (b"content-security-policy", csp.encode()))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *(h for h in added if h[0] not in present)]
            await send(message)

        return send_with_headers


def _host_name(host: str) -> str:
    """The name in a Host header: `[::1]:8000` → `::1`, `Localhost.:8000` → `localhost`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else ""
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _origin(origin: str) -> str:
    """scheme://host[:port] without its scheme's default port."""
    for scheme, port in (("http://", ":80"), ("https://", ":443")):
        if origin.startswith(scheme) and origin.endswith(port):
            return origin[:-len(port)]
    return origin
