"""The regressions page and the schedules page's webhook in a real browser (Debian's chromium
via Playwright) against a live server: a schedule's nights (fired on a controlled clock,
results through the database sink) with a slowdown from night 7 and a speedup on another
series; each open regression a card with its size, levels, first run and environment, over a
plot of the series with the shift marked; the improvements in their table; a schedule's
failed webhook shown on its row, a bad webhook URL refused beside its field."""

from __future__ import annotations

import httpx
import pytest

from service.regressions.webhook import alert_after_sweep

from .conftest import api_settings, serving
from .regression_nights import nightly_levels, nightly_schedule, run_nights
from .webhook_receiver import webhook_receiver


@pytest.fixture
def served(db_url, session_factory):
    with serving(api_settings(db_url)) as url:
        yield url, session_factory


@pytest.mark.timeout(120)
def test_each_open_regression_is_a_card_with_its_plot(served, csp_page):
    url, session_factory = served
    page = csp_page
    page.goto(f"{url}/regressions")
    page.wait_for_selector("body[data-regressions-state=ready]")
    assert page.inner_text("#summary") == "no open regression in 0 series"
    nightly_schedule(session_factory)
    sweeps = run_nights(session_factory, {
        "shifted": nightly_levels(71, 12, slowdown_from=7, factor=1.3),
        "steady": nightly_levels(72, 12, slowdown_from=4, factor=0.6)})
    api = httpx.get(f"{url}/api/regressions", timeout=30).json()
    page.goto(f"{url}/regressions?schedule=nightly")
    page.wait_for_selector("body[data-regressions-state=ready]")
    assert page.locator("header a[href='/regressions']").count() == 1
    assert page.input_value("#f-schedule") == "nightly"
    assert page.inner_text("#summary").startswith("2 open regression(s), 0 new, worst first")
    cards = page.locator("section.regression")
    assert cards.count() == 2
    assert [cards.nth(i).get_attribute("data-metric") for i in range(2)] == [
        r["metric"] for r in api["data"]]
    step = next(r for r in api["data"] if r["metric"] == "step_time_s")
    first = page.locator("section.regression[data-metric=step_time_s]")
    assert first.get_attribute("data-first-sweep") == str(sweeps[7])
    heading = first.locator("h3").inner_text()
    assert heading.startswith(f"+{100 * step['relative_change']:.3g}% step time")
    assert "seq_len=64/" in heading
    facts = first.locator(".facts").inner_text()
    assert f"from sweep {sweeps[7]} (" in facts and "5 run(s) at the new level" in facts
    assert " ms → " in facts  # step times in ms
    assert "not recorded" in first.locator(".environment").inner_text()
    drawn = first.locator(".plot").evaluate("""d => ({traces: d.data.length,
        points: d.data[0].x.length, marked: d.layout.shapes[0].x0, after: d.data[2].y[0]})""")
    assert drawn["traces"] == 3 and drawn["points"] == 12
    assert drawn["marked"] == step["first_run"]["at"]
    assert drawn["after"] == pytest.approx(step["after"])
    assert first.locator(".plot .main-svg").count() >= 1
    improvements = page.locator("#improvements tbody tr")
    assert improvements.count() == 2
    assert improvements.nth(0).inner_text().startswith("-")
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], "the page is wider than the window"
    # the one refusal, as on every plotly page: the maplibre CSS of its bundle (guards.py)
    assert [v for v in page.evaluate("() => window.__csp")
            if not v["source"].endswith("/vendor/plotly.min.js")] == []


@pytest.mark.timeout(120)
def test_a_failed_webhook_is_shown_on_its_schedule(served, page):
    url, session_factory = served
    with webhook_receiver([500, 500]) as hook:
        schedule_id = nightly_schedule(session_factory, webhook_url=hook.url)
        sweeps = run_nights(session_factory, {
            "shifted": nightly_levels(81, 9, slowdown_from=7, factor=1.5),
            "steady": nightly_levels(82, 9)})
        alert_after_sweep(session_factory=session_factory, sweep_id=sweeps[-1], tries=2,
                          backoff_s=0.01)
    page.goto(f"{url}/schedules")
    page.wait_for_selector("body[data-schedules-state=ready]")
    webhook = page.locator(f"#schedules tr[data-schedule-id='{schedule_id}'] .webhook")
    assert webhook.locator(".badge").inner_text() == "failed"
    assert webhook.locator(".webhook-error").inner_text().startswith(f"HTTP 500 from {hook.url}")
    page.fill("#f-name", "hooked")
    page.fill("#f-webhook_url", "ftp://example.com/hook")
    page.click("#create-submit")
    page.wait_for_function("() => document.getElementById('e-webhook_url').textContent.length")
    assert "scheme should be 'http' or 'https'" in page.inner_text("#e-webhook_url")
    assert page.get_attribute("#f-webhook_url", "aria-invalid") == "true"
