"""/docs and /redoc work without internet: a real chromium (Debian's, via Playwright) opens
them on a live server with every request to another host aborted, and Swagger UI and ReDoc
draw every operation of the API from the bundles the app serves; no request leaves the
server's origin, the page's CSP refuses nothing it needs, and names no other host."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import httpx
import pytest

from service.api.docs import ASSETS_URL

from .browser import window_page
from .conftest import api_settings, serving

HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
REDOCLY_BADGE_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
"""ReDoc's "API docs by Redocly" link shows this logo (no option turns it off): the CSP
refuses it, so the browser never asks for it, and the link shows as text."""


@pytest.fixture
def docs_server(tmp_path):
    """The app on a real uvicorn; the pages and the schema touch no database."""
    with serving(api_settings(f"sqlite:///{tmp_path / 'docs.db'}")) as base_url:
        yield base_url


def open_offline(browser, base_url: str, path: str):
    """A page at base_url + path whose requests to any other origin are aborted (as on a
    machine without internet); returns it, the http(s) URLs it asked for and its console
    errors (chromium's say which hash a refused inline block has)."""
    origin = urlsplit(base_url)[:2]
    asked: list[str] = []
    errors: list[str] = []

    def only_this_origin(route) -> None:
        url = route.request.url
        asked.append(url)
        if urlsplit(url)[:2] == origin:
            route.continue_()
        else:
            route.abort("internetdisconnected")

    page = window_page(browser, record_csp=True)
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.route(re.compile(r"^https?://"), only_this_origin)
    page.goto(base_url + path)
    return page, asked, errors


def operations(base_url: str) -> set[tuple[str, str]]:
    schema = httpx.get(base_url + "/openapi.json").json()
    found = {(method.upper(), path) for path, item in schema["paths"].items()
             for method in item if method in HTTP_METHODS}
    assert ("POST", "/api/sweeps") in found and len(found) >= 5
    return found


@pytest.mark.timeout(120)
def test_swagger_ui_draws_every_operation_with_no_internet(docs_server, browser):
    page, asked, errors = open_offline(browser, docs_server, "/docs")
    page.wait_for_selector(".opblock .opblock-summary-path")
    drawn = page.evaluate("""() => [...document.querySelectorAll('.opblock-summary')].map(s =>
        [s.querySelector('.opblock-summary-method').textContent,
         s.querySelector('.opblock-summary-path').dataset.path])""")
    assert {tuple(op) for op in drawn} == operations(docs_server)
    assert "/api/sweeps" in page.inner_text("#swagger-ui")
    # swagger-ui.css came too: an operation block is drawn as a bordered, rounded box
    assert page.evaluate("() => getComputedStyle(document.querySelector('.opblock'))"
                         ".borderTopStyle") == "solid"
    page.click(".opblock-summary-get .opblock-summary-control")  # open one operation
    page.wait_for_selector(".opblock.is-open .opblock-body")
    assert page.evaluate("() => window.__csp") == [], errors  # the CSP refused nothing
    assert asked and all(urlsplit(url)[:2] == urlsplit(docs_server)[:2] for url in asked), asked
    assert f"{docs_server}{ASSETS_URL}/swagger-ui-bundle.js" in asked


@pytest.mark.timeout(120)
def test_redoc_draws_every_operation_with_no_internet(docs_server, browser):
    page, asked, errors = open_offline(browser, docs_server, "/redoc")
    page.wait_for_selector("[data-section-id^='operation/']")
    drawn = page.locator("[data-section-id^='operation/']").count()
    assert drawn == len(operations(docs_server))
    assert "/api/sweeps" in page.inner_text("body")
    page.fill("input.search-input", "cancel")  # its search runs in a blob: worker
    page.wait_for_selector("[data-role='search:results'] li, .search-results li")
    violations = page.evaluate("() => window.__csp")
    assert all((v["directive"], v["blocked"]) == ("img-src", REDOCLY_BADGE_LOGO)
               for v in violations), (violations, errors)
    assert asked and all(urlsplit(url)[:2] == urlsplit(docs_server)[:2] for url in asked), asked


SOURCE = re.compile(r"^('self'|'none'|'sha256-[A-Za-z0-9+/]+=*'|data:|blob:)$")
"""What a docs page's policy may allow: this origin, hashed inline blocks, data: and blob:."""


@pytest.mark.timeout(60)
def test_docs_pages_name_no_other_host(docs_server):
    for path in ("/docs", "/redoc"):
        page = httpx.get(docs_server + path)
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
        assert directives["default-src"] == "'self'"
        assert directives["frame-ancestors"] == "'none'"
        foreign = [source for sources in directives.values() for source in sources.split()
                   if not SOURCE.match(source)]
        assert foreign == [], f"{path}: {csp}"
        assert "unsafe" not in csp
        linked = re.findall(r'(?:src|href)="([^"]*)"', page.text)
        assert linked and all(url.startswith(ASSETS_URL + "/") for url in linked), linked
        for url in linked:
            asset = httpx.get(docs_server + url)
            assert asset.status_code == 200 and len(asset.content) > 1000, url
