"""The API's documentation pages, /docs (Swagger UI) and /redoc (ReDoc), with no CDN.

FastAPI's own pages load their bundles from cdn.jsdelivr.net, so on a machine without
internet they stay blank. Here the bundles come from the fastapi-offline package's copies
(as the dashboard's plotly.js comes from the plotly package), served under /docs/assets, and
the pages are FastAPI's page builders pointed at them.

Those builders start Swagger UI with an inline <script> and reset ReDoc's margins with an
inline <style>, and ReDoc's bundle adds a <style> of its own. The pages never change, so their
CSP (service/api/guards.py) allows exactly those blocks by hash, not inline code at large.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
DOCS_URL, REDOC_URL, ASSETS_URL = "/docs", "/redoc", "/docs/assets"
OPENAPI_URL = "/openapi.json"
"""FastAPI's default, which the app keeps; the pages (and so their hashes) name it."""
DOCS_PATHS = frozenset({DOCS_URL, REDOC_URL})
TITLE = "gdn-sweep"

SWAGGER_PAGE = get_swagger_ui_html(
    openapi_url=OPENAPI_URL, title=f"{TITLE} - Swagger UI", oauth2_redirect_url=None,
    swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
    swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
    swagger_favicon_url=f"{ASSETS_URL}/favicon.png").body
REDOC_PAGE = get_redoc_html(
    openapi_url=OPENAPI_URL, title=f"{TITLE} - ReDoc", with_google_fonts=False,
    redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
    redoc_favicon_url=f"{ASSETS_URL}/favicon.png").body


def _inline_hash(page: bytes, tag: str) -> str:
    """The CSP source ('sha256-…') of the one attribute-less <tag> block of `page`."""
    (content,) = re.findall(rf"<{tag}>(.*?)</{tag}>".encode(), page, flags=re.DOTALL)
    return f"'sha256-{base64.b64encode(hashlib.sha256(content).digest()).decode()}'"


SWAGGER_INIT_HASH = _inline_hash(SWAGGER_PAGE, "script")
REDOC_STYLE_HASH = _inline_hash(REDOC_PAGE, "style")
REDOC_SCROLLBAR_STYLE_HASH = "'sha256-QMIg+bpjm3JdElJ388KYke01izlUW0UoNOeKjpMxdgc='"
"""The <style> redoc.standalone.js writes for its side menu's scrollbars (perfect-scrollbar's
CSS, fixed in the bundle). If a fastapi-offline update changes it, the ReDoc test of
tests/service/test_docs_offline.py fails with chromium's message naming the new hash."""


def install_docs(app: FastAPI) -> None:
    """Serve /docs, /redoc and their assets on `app` (made with docs_url=None, redoc_url=None)."""
    if app.openapi_url != OPENAPI_URL:
        raise ValueError(f"the docs pages read the schema at {OPENAPI_URL}; the app serves it "
                         f"at {app.openapi_url}")
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return HTMLResponse(SWAGGER_PAGE)

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return HTMLResponse(REDOC_PAGE)
