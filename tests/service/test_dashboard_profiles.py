"""Profiles on the sweep page, in a real browser (chromium via Playwright): a profiled trial's
row links its trace (the link downloads the file the API serves), the Profiles section shows
its top ops by self time and the compute / collectives / idle split, and an unprofiled trial's
button queues a sweep that profiles its point."""

from __future__ import annotations

import pytest

from .conftest import api_settings, serving
from .profile_seed import seed_profiled_sweep


@pytest.fixture
def artifacts(tmp_path):
    return tmp_path / "artifacts"


@pytest.fixture
def profile_server(db_url, artifacts):
    with serving(api_settings(db_url, artifact_dir=str(artifacts))) as base_url:
        yield base_url


@pytest.mark.timeout(90)
def test_the_sweep_page_links_the_trace_shows_top_ops_and_profiles_again(
        profile_server, session_factory, artifacts, page):
    ids = seed_profiled_sweep(session_factory, artifacts)
    page.goto(f"{profile_server}/sweeps/{ids['sweep']}")
    page.wait_for_selector("#profiles:not([hidden]) .profile-block")

    trial = page.request.get(f"{profile_server}/api/trials/{ids['profiled']}").json()
    summary = trial["profile"]["summary"]
    link = page.locator(f"#trials tr[data-trial-id='{ids['profiled']}'] a.profile-link")
    assert link.get_attribute("href") == f"/api/trials/{ids['profiled']}/profile"
    assert link.inner_text().startswith("trace (") and "KiB" in link.inner_text()
    with page.expect_download() as download:  # the link downloads the stored trace
        link.click()
    assert download.value.suggested_filename == f"trial-{ids['profiled']}.pt.trace.json.gz"
    served = page.request.get(profile_server + trial["profile"]["url"]).body()
    assert open(download.value.path(), "rb").read() == served

    block = page.locator(f".profile-block[data-trial-id='{ids['profiled']}']")
    shown = block.locator("table.top-ops tbody tr td.name").all_inner_texts()
    assert shown == [op["name"] for op in summary["top_ops"]]  # by self time, as stored
    split = block.locator(".profile-split").inner_text()
    assert "compute" in split and "collectives" in split and "idle" in split
    assert "not in the metrics" in split

    # the baseline ran without a profile: its button profiles the point in a new sweep
    page.click(f"#trials tr[data-trial-id='{ids['plain']}'] button.profile-again")
    queued = page.locator(f"#trials tr[data-trial-id='{ids['plain']}'] a.profile-queued")
    queued.wait_for()
    new_id = int(queued.get_attribute("href").rsplit("/", 1)[1])
    new_sweep = page.request.get(f"{profile_server}/api/sweeps/{new_id}").json()
    assert new_sweep["spec"]["profile"] is True and new_sweep["trials_total"] == 1
    page.goto(f"{profile_server}/sweeps/{new_id}")
    page.wait_for_selector("#trials tbody tr")
    assert "profiled (one extra step per trial)" in page.inner_text("#sweep-spec")
