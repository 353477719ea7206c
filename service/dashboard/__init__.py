"""The dashboard: static pages and scripts served by the app (no CDN, no build step).

Pages fetch /api and build the DOM with `textContent`, so user text (sweep names, errors)
is never parsed as HTML. plotly.js is served from the plotly Python package's own copy.
"""

from __future__ import annotations

from pathlib import Path

import plotly
from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
PLOTLY_STRICT_JS = Path(__file__).parent / "vendor" / "plotly-strict.min.js"
"""plotly.js's CSP-safe bundle (no eval), for WebGL traces such as parcoords: vendor/README.md."""

router = APIRouter(include_in_schema=False)


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC_DIR / name, media_type="text/html",
                        headers={"Cache-Control": "no-cache"})


@router.get("/")
def sweeps_page() -> FileResponse:
    return _page("index.html")


@router.get("/sweeps/{sweep_id}")
def sweep_page(sweep_id: int) -> FileResponse:
    return _page("sweep.html")


@router.get("/schedules")
def schedules_page() -> FileResponse:
    return _page("schedules.html")


@router.get("/regressions")
def regressions_page() -> FileResponse:
    return _page("regressions.html")


@router.get("/results")
def results_page() -> FileResponse:
    return _page("results.html")


@router.get("/compare")
def compare_page() -> FileResponse:
    return _page("compare.html")


@router.get("/planner")
def planner_page() -> FileResponse:
    return _page("planner.html")


@router.get("/vendor/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(PLOTLY_JS, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/vendor/plotly-strict.min.js")
def plotly_strict_js() -> FileResponse:
    return FileResponse(PLOTLY_STRICT_JS, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


def mount_dashboard(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
