"""The dashboard when the service is exposed (issue 37 item 1), in a real browser: every page
of a service served beyond loopback without a token (`--allow-unauthenticated`) shows a banner
saying so, a loopback one none; with reads behind the token, a page asks for it once, stores
it and reads with it."""

from __future__ import annotations

import pytest

from .conftest import api_settings, serving

BANNER = "open to the network without a token"


@pytest.mark.timeout(90)
def test_every_page_of_an_open_service_shows_the_banner(db_url, page):
    with serving(api_settings(db_url, served_host="0.0.0.0",
                              allow_unauthenticated=True)) as base_url:
        for path in ("/", "/results", "/compare", "/planner", "/schedules", "/regressions"):
            page.goto(base_url + path)
            banner = page.wait_for_selector(".exposure-banner")
            assert BANNER in banner.inner_text() and "GDN_SWEEP_API_TOKEN" in banner.inner_text()
    with serving(api_settings(db_url)) as base_url:  # loopback: none
        page.goto(base_url + "/")
        page.wait_for_selector("#kinds input")
        page.wait_for_load_state("networkidle")
        assert page.locator(".exposure-banner").count() == 0


@pytest.mark.timeout(90)
def test_reads_behind_the_token_ask_for_it_once_and_use_it(db_url, page):
    asked = []

    def answer(dialog):
        asked.append(dialog.message)
        dialog.accept("s3cret")

    page.on("dialog", answer)
    settings = api_settings(db_url, api_token="s3cret", token_for_reads=True)
    with serving(settings) as base_url:
        page.goto(base_url + "/")
        page.wait_for_selector("#kinds input")  # the form, from /api/options read with it
        assert len(asked) == 1 and "API token" in asked[0]
        assert page.evaluate("localStorage.getItem('gdnSweepToken')") == "s3cret"
        page.goto(base_url + "/results")  # stored: no second question
        page.wait_for_load_state("networkidle")
        assert len(asked) == 1
