"""The dashboard in a real browser (Debian's chromium via Playwright) against a live server
with the scheduler, the workers driver and a local Ray: create a sweep through the form,
watch it finish, find the plots drawn (error bars on throughput, the one-chip baseline in
every mode's scaling line, measured and estimated memory as separate series), and see a
hostile sweep name shown as text. On seeded databases (both backends, no Ray): what a newcomer
sees at 1400×900 — a note instead of bare axes, binary memory units, whole legends, no page
wider than the window, one-line table rows, filters kept in the link, formatted numbers,
elapsed time, an ETA and the queue position."""

from __future__ import annotations

import datetime as dt
import os
import re

import pytest
from sqlalchemy import delete, select, update

from service.core.config import Settings
from service.db import crud
from service.db.models import Result, Sweep, Trial, TrialAttempt
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP, api_settings, serving
from .seed import seed_sweep

EVIL_NAME = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


@pytest.fixture
def live_server(local_ray, tmp_path):
    # One trial at a time on 2 chips: both 2-chip trials run on one warm group of rank
    # processes, so 3 processes start instead of 5 (the sweep's test: 11.2 → 9.5 s here).
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'dash.db'}", scheduler_poll_s=0.2,
                        max_concurrent_trials=1, cpu_chips=2)
    with serving(settings) as base_url:
        yield base_url


def _fill_the_tiny_torch_sweep(page) -> None:
    page.wait_for_selector("#preset option[value=tiny]", state="attached")
    page.uncheck("input[name=frameworks][value=jax]")
    page.check("input[name=modes][value=all_gather]")
    page.check("input[name=modes][value=p2p]")
    page.fill("#seq_lens", "64")
    page.fill("#num_layers", "1")
    page.fill("#steps", "1")


@pytest.mark.timeout(120)
def test_the_form_shows_the_apis_422_and_counts_the_grid_as_you_edit(seeded_server, page):
    page.goto(seeded_server + "/")
    _fill_the_tiny_torch_sweep(page)
    page.fill("#name", "form")
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
    # plans are JAX's and made once: torch only → none; with jax, 6 more whatever the repeats
    page.check("input[name=kinds][value=plan]")
    assert page.inner_text("#grid-size").startswith("12 trials")
    page.check("input[name=frameworks][value=jax]")
    assert page.inner_text("#grid-size").startswith(f"{2 * 12 + 6} trials")
    page.uncheck("input[name=frameworks][value=jax]")
    page.uncheck("input[name=kinds][value=plan]")
    page.check("input[name=kernels][value=fused]")  # a dimension of every measured point
    assert page.inner_text("#grid-size").startswith("24 trials")
    page.uncheck("input[name=kernels][value=fused]")
    assert page.is_checked("input[name=kernels][value=reference]")
    # dp splits each chip count it divides: chips 1, 2 × dp 1, 2 are the meshes 1, 2 and
    # 2 = 2×1; 2×1 has no CP (one chip per replica), so it runs once like the baseline
    assert page.input_value("#dp") == "1"
    page.fill("#dp", "1,2")
    assert page.inner_text("#grid-size").startswith(f"{(2 + 2) * 2 * 2} trials")
    page.fill("#dp", "2")  # chip count 1 has no dp 2 mesh: 2×1 alone
    assert page.inner_text("#grid-size").startswith(f"{1 * 2 * 2} trials")
    page.fill("#dp", "1")
    assert page.inner_text("#grid-size").startswith("12 trials")
    # documents: a step setting like the rest, the baseline included
    assert page.input_value("#documents") == "single"
    page.fill("#documents", "single, uniform:8-24")
    assert page.inner_text("#grid-size").startswith("24 trials")
    # the defaults a plain submission runs with
    assert page.is_checked("input[name=dtypes][value=float32]")
    assert page.is_checked("input[name=param_shardings][value=replicated]")


@pytest.mark.timeout(240)
def test_create_a_sweep_in_the_form_and_see_it_plotted(live_server, page):
    page.goto(live_server + "/")
    _fill_the_tiny_torch_sweep(page)
    page.fill("#name", EVIL_NAME)
    page.fill("#chips", "1,2")
    assert page.inner_text("#grid-size").startswith("3 trials")
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
    assert re.fullmatch(r"took \d+ s|took \d+ min \d+ s", page.inner_text("#sweep-timing"))
    for plot in ("#plot-throughput", "#plot-scaling", "#plot-memory", "#plot-mfu"):
        _assert_legend_visible(page, plot)
    _assert_binary_memory_ticks(page)
    _assert_fits_the_window(page, "#trials")

    shots = os.environ.get("GDN_SWEEP_SCREENSHOTS")  # a folder: keep pictures for a human
    if shots:
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.screenshot(path=os.path.join(shots, "sweep.png"), full_page=True)
    page.goto(live_server + "/")
    page.wait_for_selector("#sweeps tbody tr")
    assert page.inner_text("#sweeps a.sweep-name") == EVIL_NAME
    assert page.locator("#sweeps tbody tr").first.get_attribute("data-status") == "finished"
    assert page.locator("img[src=x]").count() == 0 and page.evaluate("window.__pwned") is None
    assert page.inner_text("#sweeps tbody tr td.timing").startswith("took ")
    _assert_fits_the_window(page, "#sweeps")

    page.goto(live_server + "/results")
    page.wait_for_selector("#f-mode option[value=p2p]", state="attached")
    page.select_option("#f-mode", "p2p")
    page.select_option("#f-remat", "none")
    page.click("#filters button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('#results tbody tr').length === 1")
    assert "mode=p2p" in page.get_attribute("#csv", "href")
    assert "remat=none" in page.get_attribute("#csv", "href")
    _assert_fits_the_window(page, "#results")
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


# --- what a newcomer sees, on seeded databases ------------------------------------------------

BINARY_BYTES = re.compile(r"\d+(\.\d+)? (B|KiB|MiB|GiB|TiB)")


@pytest.fixture
def seeded_server(db_url):
    """The API and pages on `db_url` with no scheduler: seeded sweeps stay as seeded."""
    with serving(api_settings(db_url)) as base_url:
        yield base_url


def _column(page, table: str, header: str) -> list[str]:
    """The texts of the column headed `header` in `table`."""
    return page.evaluate("""([table, header]) => {
        const heads = [...document.querySelectorAll(table + " thead th")].map(th => th.textContent);
        const i = heads.indexOf(header);
        return [...document.querySelectorAll(table + " tbody tr")].map(r => r.cells[i].textContent);
    }""", [table, header])


def _assert_fits_the_window(page, table: str) -> None:
    """No sideways scrolling of the page at 1400 px, and every row of `table` one line high
    (a wide table scrolls in its own box instead)."""
    assert page.viewport_size["width"] == 1400
    assert page.evaluate("() => document.scrollingElement.scrollWidth") <= 1400
    rows = page.evaluate("""(table) => [...document.querySelectorAll(table + " tbody tr")].map(r => {
        const cell = r.cells[0], style = getComputedStyle(cell);
        return { text: r.getBoundingClientRect().height - parseFloat(style.paddingTop)
                       - parseFloat(style.paddingBottom) - 1,
                 line: parseFloat(style.lineHeight) };
    })""", table)
    assert rows, table
    for row in rows:  # one line: a little more than a line box (a badge), far from two
        assert row["text"] < 1.5 * row["line"], (table, row)


def _inside(inner: dict, outer: dict) -> bool:
    """Whether the rectangle `inner` lies within `outer` (1 px of rounding allowed)."""
    return (inner["left"] >= outer["left"] - 1 and inner["right"] <= outer["right"] + 1
            and inner["top"] >= outer["top"] - 1 and inner["bottom"] <= outer["bottom"] + 1)


def _assert_legend_visible(page, plot: str) -> None:
    """Every legend entry lies inside the legend's box (nothing scrolled away or clipped),
    the box inside the figure, and below the panels' axis titles (none covered)."""
    geometry = page.evaluate("""(plot) => {
        const rect = (el) => { const r = el.getBoundingClientRect();
                               return { left: r.left, right: r.right, top: r.top, bottom: r.bottom }; };
        const div = document.querySelector(plot), legend = div.querySelector("g.legend");
        return { figure: rect(div), box: rect(legend.querySelector("rect.bg")),
                 entries: [...legend.querySelectorAll("g.traces")].map(rect),
                 titles: [...div.querySelectorAll("g.infolayer .g-xtitle, .xtick text")].map(rect) };
    }""", plot)
    figure, box = geometry["figure"], geometry["box"]
    assert geometry["entries"], plot
    assert _inside(box, figure), (plot, box, figure)
    for entry in geometry["entries"]:
        assert _inside(entry, box), (plot, entry, box)
    assert box["top"] >= max(t["bottom"] for t in geometry["titles"]) - 1, plot


def _assert_binary_memory_ticks(page) -> None:
    ticks = page.locator("#plot-memory .ytick text").all_text_contents()
    assert len(ticks) >= 2 and all(BINARY_BYTES.fullmatch(t) for t in ticks), ticks
    hovers = page.evaluate("() => document.getElementById('plot-memory').data"
                           ".flatMap(t => t.customdata || [])")
    assert hovers and all(BINARY_BYTES.fullmatch(h) for h in hovers), hovers


@pytest.mark.timeout(120)
def test_a_sweep_without_a_succeeded_trial_says_so_and_where_it_waits(seeded_server,
                                                                       session_factory, page):
    with session_factory() as session:
        ids = [crud.create_sweep(session=session, sweep_create=SweepSpec.model_validate(
            {**TINY_SWEEP, "name": f"waiting {i}", "chips": [1, 2]})).id for i in range(2)]
    page.goto(f"{seeded_server}/sweeps/{ids[1]}")
    page.wait_for_selector("#plot-mfu.no-data")
    for plot in ("throughput", "scaling", "memory", "mfu"):  # a sentence, no bare axes
        div = page.locator(f"#plot-{plot}")
        assert div.locator("svg").count() == 0, plot
        assert "has succeeded yet" in div.inner_text(), plot
    assert "no trial has succeeded yet" in page.inner_text("#plot-throughput")
    assert page.inner_text("#sweep-timing").startswith("queue position 2 (1 = next) · waiting ")
    page.goto(seeded_server + "/")
    page.wait_for_selector("#sweeps tbody tr td.timing")
    assert [t.split(" · ")[0] for t in _column(page, "#sweeps", "time")] == [
        "#2 in the queue", "#1 in the queue"]  # newest first
    _assert_fits_the_window(page, "#sweeps")


def _running_with_times(session_factory, sweep_id: int) -> None:
    """Make a seeded sweep look half run: started 3 min ago, its chips=4 trials pending or
    running (their results removed), the others run 2 s each, one after the other."""
    now = dt.datetime.now(dt.UTC)
    with session_factory() as session:
        session.execute(update(Sweep).where(Sweep.id == sweep_id).values(
            status="running", started_at=now - dt.timedelta(minutes=3)))
        trials = session.scalars(select(Trial).where(Trial.sweep_id == sweep_id)
                                 .order_by(Trial.id)).all()
        for i, trial in enumerate(trials):
            if trial.chips == 4:
                session.execute(delete(TrialAttempt).where(TrialAttempt.trial_id == trial.id))
                session.execute(delete(Result).where(Result.trial_id == trial.id))
                trial.status = "running" if i % 2 else "pending"
                trial.started_at = now - dt.timedelta(seconds=1) if i % 2 else None
            else:
                started = now - dt.timedelta(seconds=170 - 2 * i)
                session.execute(update(Result).where(Result.trial_id == trial.id).values(
                    started_at=started, finished_at=started + dt.timedelta(seconds=2)))
        session.commit()


@pytest.mark.timeout(120)
def test_a_half_run_sweep_reads_at_a_glance(seeded_server, session_factory, page):
    sweep_id = seed_sweep(session_factory, frameworks=["jax", "torch"],
                          modes=["p2p", "all_gather", "ulysses"], chips=[1, 2, 4],
                          seq_lens=[1024, 4096], remats=["none", "full"])
    _running_with_times(session_factory, sweep_id)
    page.goto(f"{seeded_server}/sweeps/{sweep_id}")
    page.wait_for_selector("#plot-memory .ytick")
    page.wait_for_selector("#trials tbody tr")

    # the chips = 4 panel is drawn in its place, empty, saying why
    panels = page.evaluate("""() => {
        const gd = document.getElementById('plot-throughput'), box = gd.getBoundingClientRect();
        const axes = [1, 2, 3].map(i => gd._fullLayout["xaxis" + (i > 1 ? i : "")]);
        return { panels: axes.map(a => [a._offset, a._offset + a._length]),
                 notes: [...gd.querySelectorAll("g.annotation")].map(a => {
                   const r = a.getBoundingClientRect();
                   return [a.textContent, (r.left + r.right) / 2 - box.left]; }) };
    }""")
    notes = dict(panels["notes"])
    assert set(notes) == {"chips = 1", "chips = 2", "chips = 4", "no trial has succeeded yet"}
    for i, title in enumerate(["chips = 1", "chips = 2", "chips = 4"]):
        left, right = panels["panels"][i]
        assert left <= notes[title] <= right, (title, notes, panels["panels"])
    left, right = panels["panels"][2]
    assert left <= notes["no trial has succeeded yet"] <= right

    for plot in ("#plot-throughput", "#plot-scaling", "#plot-memory", "#plot-mfu"):
        _assert_legend_visible(page, plot)
    assert page.locator("#plot-memory g.legend g.traces").count() > 30  # a long legend, whole
    _assert_binary_memory_ticks(page)
    mfu_ticks = page.locator("#plot-mfu .ytick text").all_text_contents()
    assert mfu_ticks[0] == "0%" and all(t.endswith("%") for t in mfu_ticks), mfu_ticks

    timing = page.inner_text("#sweep-timing")
    assert re.match(r"running for 3 min \d+ s · about \d+ s left — an estimate: the \d+ trials "
                    r"that ran took 2 s each on average", timing), timing
    _assert_fits_the_window(page, "#trials")
    # seed: tokens/s/chip = seq_len / chips (+100 for p2p); step 10 ms × chips ± 10%;
    # peak memory = seq_len × 1000 bytes
    cells = {(mode, chips, seq): (tps, step, peak) for mode, chips, seq, tps, step, peak in zip(
        *(_column(page, "#trials", h) for h in ("mode", "chips", "seq_len", "tokens/s/chip",
                                                 "step time", "peak mem/chip")))}
    assert cells[("none", "1", "4,096")] == ("4,100", "10 ms (9–11) ×1", "3.91 MiB")
    assert cells[("p2p", "2", "1,024")][0] == "612"
    assert cells[("p2p", "4", "1,024")] == ("", "", "")  # not run yet


@pytest.mark.timeout(120)
def test_results_filters_live_in_the_link(seeded_server, session_factory, page):
    seed_sweep(session_factory, modes=["p2p", "all_gather"], chips=[1, 2, 4], seq_lens=[64, 128],
               remats=["none", "full"])
    query = "mode=p2p&chips=2&chips=4&sort=seq_len"
    page.goto(f"{seeded_server}/results?{query}")
    page.wait_for_selector("#results tbody tr")
    assert page.input_value("#f-mode") == "p2p" and page.input_value("#f-chips") == "2, 4"
    assert page.input_value("#f-sort") == "seq_len" and not page.is_checked("#f-desc")
    rows = list(zip(*(_column(page, "#results", h) for h in ("mode", "chips", "seq_len"))))
    assert len(rows) == 8  # p2p × chips 2, 4 × seq_len 64, 128 × remat none, full
    assert {(m, c) for m, c, _ in rows} == {("p2p", "2"), ("p2p", "4")}
    assert [int(s) for _, _, s in rows] == sorted(int(s) for _, _, s in rows)
    assert page.evaluate("() => window.location.search") == "?" + query

    page.select_option("#f-remat", "full")  # a change is written back, lists repeated
    page.click("#filters button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('#results tbody tr').length === 4")
    assert page.evaluate("() => window.location.search") == (
        "?mode=p2p&remat=full&chips=2&chips=4&sort=seq_len")
    page.reload()  # the link alone reproduces the view
    page.wait_for_selector("#results tbody tr")
    assert page.locator("#results tbody tr").count() == 4
    assert set(_column(page, "#results", "remat")) == {"full"}
    _assert_fits_the_window(page, "#results")
    assert page.evaluate("() => { const box = document.querySelector('#results').parentElement;"
                         " return box.scrollWidth > box.clientWidth; }")  # scrolls in its box

    page.goto(f"{seeded_server}/results?mode=ring")  # kept, so the API's answer names it
    page.wait_for_function("() => document.getElementById('results-errors').textContent")
    assert page.inner_text("#results-errors").startswith("mode.0: ")


@pytest.mark.timeout(60)
def test_results_show_the_kernels_and_what_they_resolved_to(seeded_server, session_factory,
                                                            page):
    seed_sweep(session_factory, frameworks=["jax"], modes=["p2p"], chips=[2], seq_lens=[64],
               layers=["hybrid"], kernels=["reference", "fused"])
    page.goto(f"{seeded_server}/results?kernels=fused")
    page.wait_for_selector("#results tbody tr")
    assert page.input_value("#f-kernels") == "fused"
    assert _column(page, "#results", "kernels") == ["fused"]
    assert _column(page, "#results", "GDN kernel") == ["seed fused jax gdn"]
    assert _column(page, "#results", "attention kernel") == ["seed fused jax attention"]
    _assert_fits_the_window(page, "#results")


@pytest.mark.timeout(60)
def test_results_show_dp_and_the_global_batch(seeded_server, session_factory, page):
    seed_sweep(session_factory, modes=["p2p"], chips=[2, 4], dp=[1, 2], seq_lens=[64],
               batch_size=2)
    page.goto(f"{seeded_server}/results?dp=2&sort=chips")
    page.wait_for_selector("#results tbody tr")
    assert page.input_value("#f-dp") == "2"
    rows = list(zip(*(_column(page, "#results", h)
                      for h in ("mode", "chips", "dp", "batch", "global batch"))))
    assert rows == [("none", "2", "2", "2", "4"), ("p2p", "4", "2", "2", "4")]
    _assert_fits_the_window(page, "#results")
    page.fill("#f-dp", "1, 2")
    page.fill("#f-chips", "4")
    page.click("#filters button[type=submit]")
    # The dp=2 table also has 2 rows: wait for the new one, whose rows are dp 1 and 2.
    page.wait_for_function("""() => {
        const heads = [...document.querySelectorAll("#results thead th")].map(t => t.textContent);
        const i = heads.indexOf("dp");
        const dps = [...document.querySelectorAll("#results tbody tr")].map(r => r.cells[i].textContent);
        return dps.sort().join() === "1,2";
    }""")
    assert "dp=1&dp=2" in page.url
    assert _column(page, "#results", "chips") == ["4", "4"]


@pytest.mark.timeout(60)
def test_results_and_the_sweep_page_show_packed_documents(seeded_server, session_factory,
                                                          page):
    sweep_id = seed_sweep(session_factory, modes=["p2p"], chips=[1, 2], seq_lens=[64],
                          documents=["single", "uniform:8-24"])
    page.goto(f"{seeded_server}/results?documents=uniform:8-24&sort=chips")
    page.wait_for_selector("#results tbody tr")
    assert page.input_value("#f-documents") == "uniform:8-24"
    assert list(zip(_column(page, "#results", "chips"), _column(page, "#results", "documents"))) \
        == [("1", "uniform:8-24"), ("2", "uniform:8-24")]
    _assert_fits_the_window(page, "#results")
    page.fill("#f-documents", "single, uniform:8-24")
    page.click("#filters button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('#results tbody tr').length === 4")
    assert sorted(_column(page, "#results", "documents")) == ["single"] * 2 + ["uniform:8-24"] * 2

    page.goto(f"{seeded_server}/sweeps/{sweep_id}")
    page.wait_for_selector("#plot-throughput g.trace.scatter")
    settings = _column(page, "#trials", "settings")
    assert sum(text.endswith(" · documents uniform:8-24") for text in settings) == 2
    assert "documents single, uniform:8-24" in page.inner_text("#sweep-spec")
    series = page.evaluate("document.getElementById('plot-throughput').data.map(t => t.name)")
    assert {"torch p2p", "torch p2p documents=uniform:8-24"} <= set(series)


@pytest.mark.timeout(60)
def test_a_sweep_labels_its_data_parallel_trials_dp_by_cp(seeded_server, session_factory,
                                                          page):
    sweep_id = seed_sweep(session_factory, modes=["p2p"], chips=[1, 2, 4], dp=[1, 2],
                          seq_lens=[64], batch_size=2)
    page.goto(f"{seeded_server}/sweeps/{sweep_id}")
    page.wait_for_selector("#plot-throughput g.trace.scatter")
    labels = sorted(zip(_column(page, "#trials", "mode"), _column(page, "#trials", "chips")))
    # chips = dp: one chip per replica, run once as mode none; 4 = 2 replicas × 2 CP chips
    assert labels == [("none", "1"), ("none", "2 (2×1)"), ("p2p", "2"), ("p2p", "4"),
                      ("p2p", "4 (2×2)")]
    title = page.get_attribute("#trials td[title^='2 data-parallel replicas × 2']", "title")
    assert title.endswith("batch 2 per replica, 4 per step")
    assert "batch 2 per replica · dp 1, 2" in page.inner_text("#sweep-spec")
    series = page.evaluate("document.getElementById('plot-throughput').data.map(t => t.name)")
    assert {"torch p2p", "torch p2p dp=2", "torch one chip dp=2"} <= set(series)
    _assert_fits_the_window(page, "#trials")
    # scaling: each line starts at the one-chip baseline, never at the pure data-parallel mesh
    page.wait_for_selector("#scaling-view[data-state=drawn]")
    lines = page.evaluate("document.getElementById('scaling-total').data.map(t => [t.name, t.x])")
    assert sorted(lines) == [["torch p2p", [1, 2, 4]], ["torch p2p dp=2", [1, 4]]]


@pytest.mark.timeout(60)
def test_kernels_and_attention_cp_are_lines_of_their_own(seeded_server, session_factory, page):
    """A fused trial and a reference one of the same point, or two attn_cp modes, are other
    lines (never one point at their median), each starting at its own kernels' one chip."""
    twice_as_fast_fused = lambda t: 2.0 if t.kernels == "fused" else 1.0  # noqa: E731
    sweep_id = seed_sweep(session_factory, modes=["p2p"], chips=[1, 2], seq_lens=[64],
                          layers=["hybrid"], attn_cps=["ring", "all_gather_kv"],
                          kernels=["reference", "fused"], speed_of=twice_as_fast_fused)
    page.goto(f"{seeded_server}/sweeps/{sweep_id}")
    page.wait_for_selector("#plot-throughput g.trace.scatter")
    series = page.evaluate("document.getElementById('plot-throughput').data.map(t => t.name)")
    assert set(series) == {"torch one chip hybrid", "torch one chip hybrid kernels=fused",
                           *(f"torch p2p hybrid attn_cp={a}{k}" for a in ("ring", "all_gather_kv")
                             for k in ("", " kernels=fused"))}
    page.wait_for_selector("#scaling-view[data-state=drawn]")
    lines = page.evaluate("document.getElementById('scaling-total').data"
                          ".filter(t => t.x.length).map(t => [t.name, t.x, t.y])")
    # seed.py: one chip 64 tokens/s/chip, p2p on 2 chips (32 + 100) × 2 chips, × speed
    assert sorted(lines) == sorted(
        [f"torch p2p hybrid attn_cp={a}{k}", [1, 2], [64 * speed, 264 * speed]]
        for a in ("ring", "all_gather_kv") for k, speed in (("", 1), (" kernels=fused", 2)))


@pytest.mark.timeout(60)
def test_numbers_times_and_estimates_read_as_people_write_them(seeded_server, page):
    page.goto(seeded_server + "/")
    page.wait_for_selector("#sweeps")
    formatted = page.evaluate("""() => [GS.num(10234), GS.num(0.01234), GS.num(1.2e-7),
        GS.bytes(20 * 2 ** 30), GS.bytes(1536), GS.bytes(512), GS.bytes(1024000), GS.seconds(0.0123),
        GS.seconds(4.5), GS.seconds(192), GS.pct(0.4567), GS.pct(0.0003)]""")
    assert formatted == ["10,200", "0.0123", "1.2e-7", "20 GiB", "1.5 KiB", "512 B", "0.977 MiB", "12.3 ms",
                         "4.5 s", "3 min 12 s", "45.7%", "0.03%"]
    eta = page.evaluate("""() => {
        const at = (s) => new Date(Date.UTC(2027, 0, 1, 0, 0, s)).toISOString();
        const ran = (start, end) => ({ status: "succeeded", started_at: at(start), finished_at: at(end) });
        const now = Date.UTC(2027, 0, 1, 0, 1, 0);
        const pending = { status: "pending" }, running = { status: "running", started_at: at(56) };
        return [Timing.eta([ran(0, 10), ran(10, 20), pending, pending, pending], now),
                Timing.eta([ran(0, 10), ran(0, 10), pending, pending, running], now),
                Timing.eta([pending], now), Timing.eta([ran(0, 10)], now)];
    }""")
    # one at a time: 3 pending × 10 s; two at a time: (2 × 10 s + 10 s − 4 s run so far) / 2
    assert [(e["seconds"], e["mean"], e["parallel"], e["left"]) for e in eta[:2]] == [
        (30, 10, 1, 3), (13, 10, 2, 3)]
    assert eta[2:] == [None, None]  # nothing ran yet; nothing left
