"""The schedules page in a real browser (Debian's chromium via Playwright) against a live
server on SQLite and PostgreSQL (no scheduler: ticks are fired here with an injected clock):
a schedule created from the form, listed with its next run in the browser's time and in UTC,
paused (no next run), resumed, deleted; the API's 422 beside the cron, time zone and spec
fields; a hostile name shown as text; the sweeps a schedule's ticks started, linked with their
status, beside the tick it skipped; and a new schedule from a recent sweep's spec."""

from __future__ import annotations

import datetime as dt
import json

import httpx
import pytest

from service.runs.schedule_firing import fire_due

from .browser import assert_no_console_errors, window_page
from .conftest import TINY_SWEEP, api_settings, serving

EVIL_NAME = '<img src=x onerror="window.__pwned = 1">nightly'
BERLIN = "Europe/Berlin"


@pytest.fixture
def schedules_url(db_url):
    with serving(api_settings(db_url)) as url:
        yield url


@pytest.fixture
def page(browser):
    """A 1400×900 en-US tab in Berlin's time (not the host's UTC, so the local and UTC times
    differ) that records what the CSP refused."""
    tab = window_page(browser, record_csp=True, timezone_id=BERLIN)
    yield tab
    tab.context.close()
    assert_no_console_errors(tab)


def open_schedules(page, url: str) -> None:
    page.goto(f"{url}/schedules")
    page.wait_for_selector("body[data-schedules-state=ready]")


def row(page, schedule_id: int):
    return page.locator(f"#schedules tbody tr[data-schedule-id='{schedule_id}']")


def utc_text(iso: str) -> str:
    when = dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M UTC")


def schedules(url: str) -> list[dict]:
    return httpx.get(f"{url}/api/schedules", timeout=30).json()["data"]


@pytest.mark.timeout(120)
def test_create_pause_resume_and_delete_a_schedule(schedules_url, page):
    open_schedules(page, schedules_url)
    assert page.locator("header a[href='/schedules']").count() == 1
    assert page.inner_text("#page-info") == "no schedules yet"
    page.fill("#f-name", EVIL_NAME)
    page.fill("#f-cron", "61 2 * * *")
    page.fill("#f-timezone", "Mars/Olympus_Mons")
    spec = page.input_value("#f-spec").replace('"chips": [\n    1,', '"chips": [\n    0,')
    page.fill("#f-spec", spec)
    page.click("#create-submit")
    page.wait_for_function("() => document.getElementById('e-cron').textContent.length")
    # each message beside the field it names, the field marked
    assert "cron '61 2 * * *' is not a cron expression" in page.inner_text("#e-cron")
    assert "unknown time zone 'Mars/Olympus_Mons'" in page.inner_text("#e-timezone")
    assert page.inner_text("#e-spec").startswith("chips: ")  # its path in the spec
    assert "[0]" in page.inner_text("#e-spec")
    for name in ("cron", "timezone", "spec"):
        assert page.get_attribute(f"#f-{name}", "aria-invalid") == "true", name
    assert page.inner_text("#e-name") == "" and page.inner_text("#create-errors") == ""
    assert schedules(schedules_url) == []  # nothing written
    # not JSON: said at the spec, nothing sent
    page.fill("#f-spec", "{chips: [1,")
    page.click("#create-submit")
    assert page.inner_text("#e-spec").startswith("not JSON: ")
    assert page.inner_text("#e-cron") == ""

    page.fill("#f-cron", "30 2 * * 1-5")
    assert page.inner_text("#cron-words") == ("every Monday to Friday at 02:30, "
                                              "Mars/Olympus_Mons time")
    page.fill("#f-timezone", BERLIN)
    page.fill("#f-spec", spec.replace('"chips": [\n    0,', '"chips": [\n    1,'))
    page.click("#create-submit")
    page.wait_for_selector("#schedules tbody tr")
    (saved,) = schedules(schedules_url)
    assert saved["name"] == EVIL_NAME and saved["timezone"] == BERLIN
    assert saved["spec"]["chips"] == [1, 2] and not saved["paused"]
    listed = row(page, saved["id"])
    assert listed.locator("td.name").inner_text() == EVIL_NAME  # text, never markup
    assert page.evaluate("window.__pwned") is None
    assert listed.locator("td.when").inner_text().startswith(
        "every Monday to Friday at 02:30, Europe/Berlin time")
    assert listed.locator(".next-utc").inner_text() == utc_text(saved["next_run_at"])
    local = listed.locator(".next-local").inner_text()
    assert "(in " in local and ("CET" in local or "GMT+1" in local or "CEST" in local
                                or "GMT+2" in local)  # the browser's zone (Berlin), named
    assert listed.locator("td.state").inner_text() == "active"
    assert listed.locator("td.last-run").inner_text() == "never"

    listed.locator("button.toggle").click()
    page.wait_for_selector(f"tr[data-schedule-id='{saved['id']}'][data-paused=true]")
    assert listed.locator("td.next-run").inner_text() == "— (paused)"
    assert listed.locator(".next-utc").count() == 0
    assert listed.locator("td.state").inner_text() == "paused"
    assert listed.locator("button.toggle").inner_text() == "Resume"
    (paused,) = schedules(schedules_url)
    assert paused["paused"] and paused["next_run_at"] is None

    listed.locator("button.toggle").click()
    page.wait_for_selector(f"tr[data-schedule-id='{saved['id']}'][data-paused=false]")
    (resumed,) = schedules(schedules_url)
    assert resumed["next_run_at"] is not None
    assert listed.locator(".next-utc").inner_text() == utc_text(resumed["next_run_at"])

    dialogs = []
    page.once("dialog", lambda d: (dialogs.append(d.message), d.accept()))
    listed.locator("button.delete").click()
    page.wait_for_selector(f"tr[data-schedule-id='{saved['id']}']", state="detached")
    assert dialogs == [f'Delete schedule {saved["id"]} "{EVIL_NAME}"? The sweeps it started stay.']
    assert httpx.get(f"{schedules_url}/api/schedules/{saved['id']}", timeout=30).status_code == 404
    assert page.inner_text("#page-info") == "no schedules yet"
    assert page.inner_text("#list-errors") == ""
    assert page.evaluate("window.__csp") == []


@pytest.mark.timeout(120)
def test_the_sweeps_a_schedule_started_are_linked_with_their_status(schedules_url,
                                                                       session_factory, page):
    created = httpx.post(f"{schedules_url}/api/schedules", timeout=30, json={
        "name": "every minute", "cron": "* * * * *", "spec": TINY_SWEEP}).json()
    due = dt.datetime.fromisoformat(created["next_run_at"].replace("Z", "+00:00"))
    # the first tick starts a sweep; the next finds it still queued and is skipped
    first = fire_due(session_factory=session_factory, now=due)
    second = fire_due(session_factory=session_factory, now=due + dt.timedelta(minutes=1))
    assert [f.outcome for f in first + second] == ["created", "skipped_overlap"]
    sweep_id = first[0].sweep_id

    open_schedules(page, schedules_url)
    ticks = row(page, created["id"]).locator("ul.ticks li")
    assert ticks.count() == 2
    assert ticks.nth(0).inner_text().startswith("skipped ")  # newest first
    link = ticks.nth(1).locator(f"a[href='/sweeps/{sweep_id}']")
    assert link.inner_text() == f"sweep {sweep_id}"
    assert ticks.nth(1).locator(".badge").inner_text() == "queued"
    assert row(page, created["id"]).locator("td.when").inner_text().startswith(
        "every minute, UTC time")
    assert row(page, created["id"]).locator("td.last-run").inner_text() != "never"

    # a new schedule from that sweep's spec, as the sweep form built it
    page.select_option("#spec-from", str(sweep_id))
    sweep = httpx.get(f"{schedules_url}/api/sweeps/{sweep_id}", timeout=30).json()
    assert sweep["schedule_id"] == created["id"]
    assert json.loads(page.input_value("#f-spec")) == sweep["spec"]
    page.fill("#f-name", "copy")
    page.click("#create-submit")
    page.wait_for_selector("#schedules tbody tr >> nth=1")
    copy = next(s for s in schedules(schedules_url) if s["name"] == "copy")
    assert copy["spec"] == sweep["spec"]
    assert page.evaluate("window.__csp") == []
