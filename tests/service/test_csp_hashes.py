"""The dashboard's CSP admits exactly the inline styles the served plotly bundles inject: the
stylesheet each bundle adds as a <style> when it loads (maplibre-gl's, for map traces) is
allowed by its sha256, recomputed here from the files the service serves, and nothing inline
is allowed wholesale."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest

from service.api.guards import DASHBOARD_CSP, EMPTY_STYLE_HASH, PLOTLY_MAPLIBRE_STYLE_HASH
from service.dashboard import PLOTLY_JS, PLOTLY_STRICT_JS

INJECTED_STYLE = re.compile(
    r'createElement\("style"\);e\.id="[0-9a-f]{64}",e\.textContent=\'([^\'\\]*)\'')
"""plotly.js 4's bundles: `var e=document.createElement("style");e.id="<sha>",
e.textContent='<css>'` (a plain literal: no quote or backslash inside)."""


def csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@pytest.mark.parametrize("bundle", [PLOTLY_JS, PLOTLY_STRICT_JS], ids=lambda p: p.name)
def test_every_style_a_served_bundle_injects_is_admitted_by_its_hash(bundle):
    injected = INJECTED_STYLE.findall(bundle.read_text())
    assert injected, f"{bundle}: no injected <style> found: a new plotly.js? update the pattern"
    style_src = DASHBOARD_CSP.split("style-src ", 1)[1].split(";", 1)[0]
    for css in injected:
        assert csp_hash(css) in style_src, (bundle.name, css[:80])
    assert csp_hash(injected[0]) == PLOTLY_MAPLIBRE_STYLE_HASH


def test_nothing_inline_is_admitted_wholesale():
    assert "unsafe-inline" not in DASHBOARD_CSP and "unsafe-eval" not in DASHBOARD_CSP
    assert csp_hash("") == EMPTY_STYLE_HASH  # the empty <style> and style="" only
    attr = DASHBOARD_CSP.split("style-src-attr ", 1)[1].split(";", 1)[0]
    assert attr.split() == ["'unsafe-hashes'", EMPTY_STYLE_HASH]
