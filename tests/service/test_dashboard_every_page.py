"""Every dashboard page in a real browser (chromium via Playwright) on a database with
something to show on each: no page logs a console error or throws (a CSP refusal of plotly's
styles was one on every page with a plot), and the CSP refuses nothing. The pages are listed
from the dashboard's own routes, so a new page is visited or this test fails."""

from __future__ import annotations

import pytest
from starlette.routing import Route

from service.dashboard import router

from .conftest import api_settings, serving
from .profile_seed import seed_profiled_sweep
from .regression_nights import nightly_levels, nightly_schedule, run_nights
from .seed import seed_sweep

EVERY_KIND = dict(frameworks=["jax", "torch"], modes=["p2p", "ulysses"], chips=[1, 2, 8],
                  seq_lens=[64, 128], layers=["gdn_only", "hybrid"],
                  kernels=["reference", "fused"])
"""jax and torch, fused and reference, gdn_only and hybrid; ulysses on 8 chips is skipped (the
tiny model's 4 value heads do not split 8 ways): 16 points of 2 frameworks × 2 decoders
× 2 kernels × 2 seq_lens."""
PAGE_ROUTES = {route.path for route in router.routes
               if isinstance(route, Route) and not route.path.startswith("/vendor/")}


def ready(state_attribute: str, *states: str) -> str:
    """A predicate (a function: the CSP refuses string eval) for a page's data-* state."""
    return f"() => {list(states)!r}.includes(document.body.dataset.{state_attribute})"


@pytest.fixture
def everything_server(db_url, session_factory, tmp_path):
    """Sweeps of every kind (one with a failed trial), a profiled one, a schedule with a
    regression: each page has rows, plots and notes to draw."""
    artifacts = tmp_path / "artifacts"
    ids = {"mixed": seed_sweep(session_factory, name="mixed", **EVERY_KIND, status_of=lambda t: (
        "failed" if t.mode == "p2p" and t.chips == 8 and t.framework == "torch" else "succeeded")),
           "second": seed_sweep(session_factory, name="second", **EVERY_KIND,
                                speed_of=lambda t: 0.8),
           "profiled": seed_profiled_sweep(session_factory, artifacts)["sweep"]}
    nightly_schedule(session_factory)
    run_nights(session_factory, {"shifted": nightly_levels(71, 10, slowdown_from=6, factor=1.3),
                                 "steady": nightly_levels(72, 10, slowdown_from=6, factor=1.0)})
    with serving(api_settings(db_url, artifact_dir=str(artifacts))) as url:
        yield url, ids


def visits(ids: dict[str, int]) -> list[tuple[str, str, str]]:
    """(route, address, what shows the page is drawn) of every page but the planner's."""
    return [
        ("/", "/", "#sweeps tbody tr"),
        *(("/sweeps/{sweep_id}", f"/sweeps/{i}", "#scaling-view[data-state]") for i in ids.values()),
        ("/results", "/results", "#results tbody tr"),
        ("/results", "/results?status=failed&status=skipped", "#results tbody tr"),
        ("/compare", "/compare", ready("compareState", "ready")),
        ("/compare", f"/compare?sweep={ids['mixed']}&sweep={ids['second']}",
         ready("compareState", "ready")),
        ("/regressions", "/regressions", ready("regressionsState", "ready")),
        ("/regressions", "/regressions?schedule=nightly", ready("regressionsState", "ready")),
        ("/schedules", "/schedules", ready("schedulesState", "ready")),
    ]


PLANNER = ("/planner", "/planner", ready("plannerState", "answered", "error"))
"""Opened bare, it plans the stored trials' most common settings (GET /api/capacity)."""


def open_and_check(page, url: str, address: str, drawn: str) -> None:
    """Open the page, wait until it is drawn and its late work done: nothing logged, nothing
    refused."""
    page.goto(url + address)
    if drawn.startswith("()"):
        page.wait_for_function(drawn)
    else:
        page.wait_for_selector(drawn)
    page.wait_for_load_state("networkidle")  # the plots' relayouts and late fetches
    assert page.console_errors == [], address
    assert page.evaluate("window.__csp") == [], address


def test_every_page_route_is_visited():
    assert {route for route, _, _ in [*visits({"mixed": 1, "second": 2}), PLANNER]} == PAGE_ROUTES


@pytest.mark.timeout(240)
def test_no_page_logs_a_console_error(everything_server, csp_page):
    url, ids = everything_server
    page = csp_page
    for _, address, drawn in visits(ids):
        open_and_check(page, url, address, drawn)
    # the sweep page drew its plots, environments and profiles (what could log an error)
    page.goto(f"{url}/sweeps/{ids['profiled']}")
    page.wait_for_selector("#profiles:not([hidden]) .profile-block")
    page.goto(f"{url}/sweeps/{ids['mixed']}")
    page.wait_for_selector("#plot-memory svg.main-svg")
    page.wait_for_load_state("networkidle")
    assert page.locator("#trials tbody tr[data-status=skipped]").count() == 2 * 2 * 2 * 2
    assert page.console_errors == [] and page.evaluate("window.__csp") == []


@pytest.mark.timeout(120)
def test_the_planner_page_logs_no_console_error(everything_server, csp_page):
    """On the same database: its answer drawn (or its refusal said), nothing logged."""
    url, _ = everything_server
    _, address, drawn = PLANNER
    open_and_check(csp_page, url, address, drawn)


@pytest.mark.timeout(60)
def test_the_console_check_catches_an_error(everything_server, browser):
    """The check every page fixture runs: a script error, a 5xx from the API and a refused
    inline style are caught; a 4xx the page shows is not an error of the page."""
    from .browser import window_page

    url, _ = everything_server
    tab = window_page(browser)
    try:
        tab.goto(url + "/results?mode=ring")  # the API's 422, shown on the page
        tab.wait_for_function("() => document.getElementById('results-errors').textContent")
        assert tab.console_errors == []
        tab.evaluate("() => { const s = document.createElement('style');"
                     " s.textContent = 'body { color: red }'; document.head.append(s); }")
        tab.evaluate("() => setTimeout(() => { throw new Error('late'); })")
        tab.wait_for_timeout(300)
        errors = "\n".join(tab.console_errors)
        assert "Content Security Policy" in errors and "uncaught Error: late" in errors, errors
    finally:
        tab.context.close()
