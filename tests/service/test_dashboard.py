"""The dashboard in a real browser (Debian's chromium via Playwright) against a live server
with the scheduler, the workers driver and a local Ray: create a sweep through the form,
watch it finish, find the plots drawn, and see a hostile sweep name shown as text."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time

import pytest
import uvicorn

from service.core.config import Settings
from service.main import create_app

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
EVIL_NAME = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


@pytest.fixture
def live_server(local_ray, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'dash.db'}", scheduler_poll_s=0.2,
                        max_concurrent_trials=2, cpu_chips=4)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(60)


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is not installed: run scripts/test.sh (it installs it)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser.new_page()
        finally:
            browser.close()


@pytest.mark.timeout(240)
def test_create_a_sweep_in_the_form_and_see_it_plotted(live_server, page):
    page.goto(live_server + "/")
    page.wait_for_selector("#preset option[value=tiny]", state="attached")
    page.fill("#name", EVIL_NAME)
    page.uncheck("input[name=frameworks][value=jax]")
    page.check("input[name=modes][value=all_gather]")
    page.check("input[name=modes][value=p2p]")
    page.fill("#seq_lens", "64")
    page.fill("#num_layers", "1")
    page.fill("#steps", "1")
    page.fill("#chips", "1,0")
    page.click("#create-submit")
    page.wait_for_function("document.getElementById('create-errors').textContent.length > 0")
    assert "chips: " in page.inner_text("#create-errors")  # the API's 422, naming the field
    assert "use integers >= 1" in page.inner_text("#create-errors")

    page.fill("#chips", "1,2")
    # The step settings are grid dimensions of the form too: a second remat doubles the grid.
    assert page.inner_text("#grid-size").startswith("4 trials")
    page.check("input[name=remats][value=full]")
    assert page.inner_text("#grid-size").startswith("8 trials")
    page.uncheck("input[name=remats][value=full]")
    assert page.is_checked("input[name=dtypes][value=float32]")
    assert page.is_checked("input[name=param_shardings][value=replicated]")
    page.click("#create-submit")
    page.wait_for_url("**/sweeps/*")
    page.wait_for_selector("body[data-sweep-status=finished]", timeout=180_000)

    assert page.inner_text("#sweep-name") == EVIL_NAME  # shown as text, never run
    assert page.evaluate("window.__pwned") is None
    statuses = page.locator("#trials tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.status)")
    assert statuses == ["succeeded"] * 4
    for plot in ("#plot-throughput", "#plot-memory", "#plot-mfu"):
        assert page.locator(f"{plot} svg.main-svg").count() >= 1, plot
    assert page.locator("#plot-throughput g.trace.scatter").count() == 4  # 2 modes × 2 panels
    assert page.locator("#plot-mfu g.trace.bars").count() == 2
    names = page.evaluate("document.getElementById('plot-memory').data.map(t => t.name)")
    assert "chip memory" in names and "torch p2p" in names
    assert page.locator("#plot-throughput .annotation-text").all_text_contents() == [
        "chips = 1", "chips = 2"]

    shots = os.environ.get("GDN_SWEEP_SCREENSHOTS")  # a folder: keep pictures for a human
    if shots:
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.screenshot(path=os.path.join(shots, "sweep.png"), full_page=True)
    page.goto(live_server + "/")
    page.wait_for_selector("#sweeps tbody tr")
    assert page.inner_text("#sweeps a.sweep-name") == EVIL_NAME
    assert page.locator("#sweeps tbody tr").first.get_attribute("data-status") == "finished"
    assert page.locator("img[src=x]").count() == 0 and page.evaluate("window.__pwned") is None

    page.goto(live_server + "/results")
    page.wait_for_selector("#f-mode option[value=p2p]", state="attached")
    page.select_option("#f-mode", "p2p")
    page.select_option("#f-remat", "none")
    page.click("#filters button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#results tbody tr').length === 2")
    assert "mode=p2p" in page.get_attribute("#csv", "href")
    assert "remat=none" in page.get_attribute("#csv", "href")
    if shots:
        page.screenshot(path=os.path.join(shots, "results.png"), full_page=True)
