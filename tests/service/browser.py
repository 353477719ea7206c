"""A real browser for the dashboard and docs tests: Debian's chromium driven by Playwright.

Every tab records its console errors and uncaught exceptions (`console_errors`); the page
fixtures (conftest.py) fail a test whose tab logged one (`assert_no_console_errors`), so no
dashboard page may log an error: a CSP refusal, a script exception, a missing asset."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WINDOW = {"width": 1400, "height": 900}
"""The window a newcomer had."""
RECORD_CSP = """window.__csp = [];
document.addEventListener('securitypolicyviolation', e => window.__csp.push(
    {directive: e.violatedDirective, source: e.sourceFile, blocked: e.blockedURI}));"""
"""An init script: what the CSP refused, as the page saw it, in window.__csp."""
API_REFUSAL = re.compile(r"Failed to load resource: the server responded with a status of 4\d\d ")
"""How chromium logs a fetch answered 4xx. From /api/ it is a refusal the page shows (a 422
beside its field, a 404 as a sentence), which the tests check on the page itself; a 5xx (a
server error) and any failure from elsewhere (a script, a stylesheet, the plotly bundle) count."""


@contextmanager
def chromium() -> Iterator:
    """A launched chromium (the test fails when it is not installed)."""
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is not installed: run scripts/test.sh (it installs it)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def window_page(browser, *, record_csp: bool = False, **context_options):
    """A tab of WINDOW's size in en-US (numbers as "10,200"), optionally recording refusals
    (`context_options`: more of Playwright's new_page options, e.g. timezone_id). Its console
    errors and uncaught exceptions collect in `tab.console_errors`."""
    tab = browser.new_page(viewport=WINDOW, locale="en-US", **context_options)
    tab.console_errors = []
    tab.on("console", lambda message: _record_console(tab, message))
    tab.on("pageerror", lambda error: tab.console_errors.append(
        f"uncaught {error.name}: {error.message} on {tab.url}"))
    if record_csp:
        tab.add_init_script(RECORD_CSP)
    return tab


def _record_console(tab, message) -> None:
    if message.type != "error":
        return
    where = message.location.get("url", "")
    if API_REFUSAL.match(message.text) and urlsplit(where).path.startswith("/api/"):
        return
    tab.console_errors.append(f"{message.text} ({where or tab.url})")


def assert_no_console_errors(tab) -> None:
    """Fail when the tab logged a console error or threw an uncaught exception."""
    errors = getattr(tab, "console_errors", [])
    assert not errors, "the page logged errors:\n" + "\n".join(errors)
