"""A real browser for the dashboard and docs tests: Debian's chromium driven by Playwright."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WINDOW = {"width": 1400, "height": 900}
"""The window a newcomer had."""
RECORD_CSP = """window.__csp = [];
document.addEventListener('securitypolicyviolation', e => window.__csp.push(
    {directive: e.violatedDirective, source: e.sourceFile, blocked: e.blockedURI}));"""
"""An init script: what the CSP refused, as the page saw it, in window.__csp."""


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


def window_page(browser, *, record_csp: bool = False):
    """A tab of WINDOW's size in en-US (numbers as "10,200"), optionally recording refusals."""
    tab = browser.new_page(viewport=WINDOW, locale="en-US")
    if record_csp:
        tab.add_init_script(RECORD_CSP)
    return tab
