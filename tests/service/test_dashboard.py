"""The dashboard in a real browser (Debian's chromium via Playwright) against a live server
with the scheduler, the workers driver and a local Ray: create a sweep through the form,
watch it finish, find the plots drawn (error bars on throughput, the one-chip baseline in
every mode's scaling line, measured and estimated memory as separate series), and see a
hostile sweep name shown as text."""

from __future__ import annotations

import os
import shutil

import pytest

from service.core.config import Settings

from .conftest import serving

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
EVIL_NAME = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


@pytest.fixture
def live_server(local_ray, tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'dash.db'}", scheduler_poll_s=0.2,
                        max_concurrent_trials=2, cpu_chips=4)
    with serving(settings) as base_url:
        yield base_url


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
    # predicates as functions: a string expression is eval'd in the page, which the CSP refuses
    page.wait_for_function("() => document.getElementById('create-errors').textContent.length")
    assert "chips: " in page.inner_text("#create-errors")  # the API's 422, naming the field
    assert "use integers >= 1" in page.inner_text("#create-errors")

    page.fill("#chips", "1,2")
    # chips=1 runs once (the baseline of both modes): 1 + 2 modes × 1 chip count. The step
    # settings are grid dimensions of the form too: a second remat doubles the grid.
    assert page.inner_text("#grid-size").startswith("3 trials")
    page.check("input[name=remats][value=full]")
    assert page.inner_text("#grid-size").startswith("6 trials")
    page.fill("#repeats", "2")
    assert page.inner_text("#grid-size").startswith("12 trials")
    page.fill("#repeats", "1")
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
    assert statuses == ["succeeded"] * 3
    assert page.locator("#trials tbody tr[data-attempts='1']").count() == 3
    for plot in ("#plot-throughput", "#plot-scaling", "#plot-memory", "#plot-mfu"):
        assert page.locator(f"{plot} svg.main-svg").count() >= 1, plot
    # chips = 1 panel: the baseline; chips = 2 panel: the two modes
    assert page.locator("#plot-throughput g.trace.scatter").count() == 3
    throughput = page.evaluate("document.getElementById('plot-throughput').data.map(t => "
                               "({name: t.name, x: t.x, y: t.y, error_y: t.error_y}))")
    assert sorted(t["name"] for t in throughput) == ["torch all_gather", "torch one chip",
                                                     "torch p2p"]
    for trace in throughput:  # the spread of the measured steps, as error bars
        bars = trace["error_y"]
        assert bars["type"] == "data" and bars["visible"] and bars["symmetric"] is False
        assert len(bars["array"]) == len(bars["arrayminus"]) == len(trace["y"])
        assert min(bars["array"] + bars["arrayminus"]) >= 0
    scaling = page.evaluate("document.getElementById('plot-scaling').data.map(t => "
                            "({name: t.name, x: t.x}))")
    # every mode's scaling line starts at the one-chip baseline
    assert sorted((t["name"], t["x"]) for t in scaling) == [("torch all_gather", [1, 2]),
                                                            ("torch p2p", [1, 2])]
    assert page.locator("#plot-mfu g.trace.bars").count() == 3
    memory = page.evaluate("document.getElementById('plot-memory').data.map(t => "
                           "({name: t.name, quantity: t.meta && t.meta.quantity}))")
    names = [t["name"] for t in memory]
    assert "chip memory" in names and "torch p2p · process RSS (measured)" in names
    assert {t["quantity"] for t in memory if t["name"] != "chip memory"} <= {
        "peak_memory_bytes_per_chip", "estimated_memory_bytes_per_chip",
        "predicted_memory_bytes_per_chip"}
    _check_plot_math(page)
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
    page.wait_for_function("() => document.querySelectorAll('#results tbody tr').length === 1")
    assert "mode=p2p" in page.get_attribute("#csv", "href")
    assert "remat=none" in page.get_attribute("#csv", "href")
    if shots:
        page.screenshot(path=os.path.join(shots, "results.png"), full_page=True)


def _check_plot_math(page) -> None:
    """The page's own plot code on trials with known figures: repeats merge into one point
    with bars over every step; each memory quantity is a series of its own."""
    point = page.evaluate("""() => {
        const t = (repeat, tps, min, max) => ({ id: repeat, chips: 2, seq_len: 64,
            tokens_per_s_per_chip: tps, step_time_s: 1, step_time_min_s: min,
            step_time_max_s: max, measured_steps: 3 });
        return Plots.throughputPoints([t(0, 100, 0.5, 2), t(1, 200, 0.8, 1.25), t(2, 300, 1, 1)]);
    }""")
    # median of 100, 200, 300; fastest step: 100 × 1 / 0.5; slowest: 100 × 1 / 2
    assert [(p["y"], p["hi"], p["lo"]) for p in point] == [(200, 300, 50)]
    traces = page.evaluate("""() => Plots.memoryTraces({ spec: { chips: [1] } }, [{
        id: 1, status: "succeeded", framework: "jax", mode: "none", chips: 1, seq_len: 64,
        dtype: "float32", param_sharding: "replicated", remat: "none",
        peak_memory_bytes_per_chip: 1000, memory_source: "jax_peak_bytes_in_use",
        estimated_memory_bytes_per_chip: 2000, estimated_memory_source: "xla_memory_analysis",
        predicted_memory_bytes_per_chip: 3000 }]).map(t => [t.name, t.meta.quantity, t.y])""")
    assert traces == [
        ["jax one chip · device peak (measured)", "peak_memory_bytes_per_chip", [1000]],
        ["jax one chip · XLA estimate", "estimated_memory_bytes_per_chip", [2000]],
        ["jax one chip · predicted", "predicted_memory_bytes_per_chip", [3000]]]
