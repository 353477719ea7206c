"""The comparison views in a real browser (Debian's chromium via Playwright) against a live
server on SQLite and PostgreSQL, over sweeps seeded with traceable figures (seed.py): the sweep
page's scaling view (total tokens/s and scaling efficiency vs chips per mode, at a fixed global
seq_len and a fixed local shard; the best mode per chip count; recorded compute and
communication per chip) and the compare page (parallel coordinates over the chosen sweeps,
matching points side by side with their ratio, the choice kept in the URL). Every expected
figure comes from GET /api/results; the page's are read from the DOM and the plotly graph
divs' `data`, never from pictures. Screenshots at 1400×900 go to /tmp/compare-*.png."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import httpx
import pytest

from .conftest import api_settings, serving
from .seed import seed_sweep

GRID = {"modes": ["all_gather", "p2p"], "chips": [1, 2, 4], "seq_lens": [256, 512, 1024]}


def all_gather_fast_on_four_chips(trial) -> float:
    """So that the best mode differs between chip counts (p2p is seeded faster elsewhere)."""
    return 3.0 if trial.mode == "all_gather" and trial.chips == 4 else 1.0


@pytest.fixture
def sweeps(session_factory, db_url):
    """Three sweeps of one grid: `fast`, `slow` (half its tokens/s, all_gather ×1/3 at four
    chips) and `empty` (every trial failed), served with no scheduler."""
    fast = seed_sweep(session_factory, name="cpu fast", speed_of=all_gather_fast_on_four_chips,
                      **GRID)
    slow = seed_sweep(session_factory, name="cpu slow", speed_of=lambda t: 0.5, **GRID)
    empty = seed_sweep(session_factory, name="nothing yet", status_of=lambda t: "failed", **GRID)
    with serving(api_settings(db_url)) as url:
        yield SimpleNamespace(url=url, fast=fast, slow=slow, empty=empty)


@pytest.fixture
def page(csp_page):
    return csp_page


def api_results(url: str, sweep_id: int) -> list[dict]:
    body = httpx.get(f"{url}/api/results", params={"sweep_id": sweep_id, "limit": 1000}).json()
    assert body["count"] == len(body["data"])
    return body["data"]


def at(rows: list[dict], mode: str, chips: int, seq_len: int) -> dict:
    (row,) = [r for r in rows if (r["mode"], r["chips"], r["seq_len"]) == (mode, chips, seq_len)]
    return row


def plot_data(page, div_id: str) -> list[dict]:
    return page.evaluate("id => document.getElementById(id).data.map(t => ({name: t.name, "
                         "x: t.x, y: t.y, xaxis: t.xaxis || 'x', meta: t.meta}))", div_id)


def refusals_beyond_plotly_styles(page) -> list[dict]:
    """What the CSP refused, less the inline styles plotly's bundles try and do without (the
    maplibre CSS of map traces, never drawn; the colour bar's `style=""` resets)."""
    return [v for v in page.evaluate("window.__csp")
            if not (v["directive"] in ("style-src-elem", "style-src-attr")
                    and v["source"].split("/vendor/")[-1] in ("plotly.min.js",
                                                              "plotly-strict.min.js"))]


def no_page_scroll_sideways(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.timeout(120)
def test_scaling_view_plots_each_mode_against_chips_and_names_the_best(sweeps, page):
    rows = api_results(sweeps.url, sweeps.fast)
    page.goto(f"{sweeps.url}/sweeps/{sweeps.fast}")
    page.wait_for_selector("#scaling-view[data-state=drawn]")
    # the default: the largest global seq_len that several chip counts reach
    assert page.input_value("#scaling-slice") == "global:1024"

    def line(mode, points, efficiency):
        return {"name": f"torch {mode}", "x": [c for c, _ in points],
                "y": [at(rows, "none" if c == 1 else mode, c, s)["tokens_per_s_per_chip"] * c
                      for c, s in points], "efficiency": efficiency}

    strong = [(1, 1024), (2, 1024), (4, 1024)]
    expected = [line(m, strong, [1] + [at(rows, m, c, 1024)["scaling_efficiency"] for c in (2, 4)])
                for m in ("all_gather", "p2p")]
    check_lines(page, expected)

    best = best_table(page)
    for chips, mode, total in best:  # the mode of the highest total tokens/s at that count
        here = [r for r in rows if r["chips"] == chips and r["seq_len"] == 1024]
        top = max(here, key=lambda r: r["tokens_per_s_per_chip"] * chips)
        assert (mode, total) == (top["mode"], f"{round(top['tokens_per_s_per_chip'] * chips):,}")
    assert [c for c, _, _ in best] == [1, 2, 4] and len({m for _, m, _ in best[1:]}) == 2

    # fixed local shard: 256 tokens per chip, i.e. (1, 256), (2, 512), (4, 1024)
    page.select_option("#scaling-slice", "local:256")
    page.wait_for_selector("#scaling-view[data-slice='local:256']")
    weak = [(1, 256), (2, 512), (4, 1024)]
    one_chip = at(rows, "none", 1, 256)["tokens_per_s_per_chip"]
    check_lines(page, [line(m, weak, [1] + [at(rows, m, c, s)["tokens_per_s_per_chip"] / one_chip
                                            for c, s in weak[1:]])
                       for m in ("all_gather", "p2p")])

    breakdown = plot_data(page, "scaling-breakdown")
    flops = {t["name"]: t for t in breakdown if t["xaxis"] == "x"}
    comm = [t for t in breakdown if t["xaxis"] == "x2"]
    for mode in ("all_gather", "p2p"):
        assert flops[f"torch {mode}"]["x"] == [1, 2, 4]
        assert flops[f"torch {mode}"]["y"] == pytest.approx(
            [at(rows, "none" if c == 1 else mode, c, s)["hardware_flops_per_step"] / c
             for c, s in weak])
        for field, what in (("cp_comm_bytes_per_step_per_chip", "CP exchanges"),
                            ("grad_sync_bytes_per_step_per_chip", "gradient sync")):
            (trace,) = [t for t in comm if t["name"] == f"torch {mode} · {what}"]
            assert trace["x"] == [2, 4]  # one chip exchanges nothing
            assert trace["y"] == [at(rows, mode, c, s)[field] for c, s in weak[1:]]
    assert "No split of step time" in page.inner_text("#scaling-view .sources")

    assert page.evaluate("(el => el.scrollWidth <= el.clientWidth)"
                         "(document.getElementById('scaling-view'))")
    page.locator("#scaling-view").screenshot(path="/tmp/compare-scaling.png")
    assert refusals_beyond_plotly_styles(page) == []


def check_lines(page, expected: list[dict]) -> None:
    total = plot_data(page, "scaling-total")
    efficiency = plot_data(page, "scaling-efficiency")
    assert [t["name"] for t in total] == [e["name"] for e in expected]  # one trace per mode
    for got, eff, want in zip(total, efficiency, expected, strict=True):
        assert got["x"] == want["x"] and eff["x"] == want["x"]
        assert got["y"] == pytest.approx(want["y"])
        assert eff["y"] == pytest.approx(want["efficiency"])


def best_table(page) -> list[tuple[int, str, str]]:
    return page.locator("#scaling-best tbody tr").evaluate_all(
        "rows => rows.map(r => [Number(r.dataset.chips), r.dataset.bestMode, "
        "r.cells[2].textContent])")


@pytest.mark.timeout(120)
def test_compare_page_draws_parcoords_and_matches_points_of_two_sweeps(sweeps, page):
    fast, slow = api_results(sweeps.url, sweeps.fast), api_results(sweeps.url, sweeps.slow)
    page.goto(f"{sweeps.url}/compare?sweep={sweeps.fast}&sweep={sweeps.slow}")
    page.wait_for_selector("body[data-compare-state=ready]")

    parcoords = page.evaluate("document.getElementById('parcoords').data[0]")
    labels = [d["label"] for d in parcoords["dimensions"]]
    assert labels[:-1] == ["sweep", "framework", "kernels", "layers", "mode", "chips",
                           "seq_len", "dtype", "param sharding", "remat", "tokens/s/chip", "MFU"]
    assert labels[-1].startswith("memory/chip (")
    dims = {d["label"]: d for d in parcoords["dimensions"]}
    both = fast + slow
    assert len(parcoords["line"]["color"]) == len(both) == 30  # a line per result
    mode = dims["mode"]
    drawn_modes = Counter(mode["ticktext"][v] for v in mode["values"])
    assert drawn_modes == Counter("one chip" if r["mode"] == "none" else r["mode"] for r in both)
    assert sorted(dims["tokens/s/chip"]["values"]) == pytest.approx(
        sorted(r["tokens_per_s_per_chip"] for r in both))
    assert parcoords["line"]["color"] == dims["tokens/s/chip"]["values"]
    assert page.locator("#parcoords canvas").count() > 0
    assert "WebGL" not in page.inner_text("#parcoords-view")

    table = page.locator("#compare-table tbody tr")
    assert table.count() == 15  # every grid point of the one grid is in both sweeps
    row = page.locator("#compare-table tr[data-mode=p2p][data-chips='2'][data-seq-len='512']")
    ratio = (at(slow, "p2p", 2, 512)["tokens_per_s_per_chip"]
             / at(fast, "p2p", 2, 512)["tokens_per_s_per_chip"])
    cell = row.locator(f"td[data-ratio-of='{sweeps.slow}']")
    assert float(cell.get_attribute("data-ratio")) == pytest.approx(ratio)
    assert cell.inner_text() == f"{ratio:.2f}×"
    four = page.locator("#compare-table tr[data-mode=all_gather][data-chips='4']"
                        "[data-seq-len='1024']")
    assert four.locator(f"td[data-sweep='{sweeps.fast}']").inner_text() == \
        f"{round(at(fast, 'all_gather', 4, 1024)['tokens_per_s_per_chip']):,}"

    lines = plot_data(page, "compare-lines")
    assert sorted(t["name"] for t in lines) == sorted(
        f"#{s} torch {m}" for s in (sweeps.fast, sweeps.slow) for m in ("all_gather", "p2p"))
    for trace in lines:
        rows = fast if trace["meta"]["sweep"] == sweeps.fast else slow
        assert trace["x"] == [1, 2, 4]
        assert trace["y"] == pytest.approx([at(rows, "none" if c == 1 else trace["meta"]["mode"],
                                               c, 1024)["tokens_per_s_per_chip"]
                                            for c in (1, 2, 4)])

    assert no_page_scroll_sideways(page)
    page.screenshot(path="/tmp/compare-page.png", full_page=True)
    assert refusals_beyond_plotly_styles(page) == []


@pytest.mark.timeout(120)
def test_chosen_sweeps_are_kept_in_the_url(sweeps, page):
    page.goto(f"{sweeps.url}/compare?sweep={sweeps.slow}")
    page.wait_for_selector("body[data-compare-state=ready]")
    assert "pick two or more sweeps" in page.inner_text("#side-by-side")
    page.check(f"#sweep-picker input[value='{sweeps.fast}']")
    page.wait_for_selector("#compare-table")
    assert page.url.endswith(f"/compare?sweep={sweeps.slow}&sweep={sweeps.fast}")
    # the first chosen is the reference of the ratios
    assert page.locator("#compare-table th").all_inner_texts()[-1] == \
        f"#{sweeps.fast} ÷ #{sweeps.slow}"
    page.reload()
    page.wait_for_selector("body[data-compare-state=ready]")
    checked = page.locator("#sweep-picker input:checked").evaluate_all(
        "boxes => boxes.map(b => Number(b.value))")
    assert sorted(checked) == sorted([sweeps.slow, sweeps.fast])
    page.uncheck(f"#sweep-picker input[value='{sweeps.slow}']")
    page.wait_for_function("() => !document.getElementById('compare-table')")
    assert page.url.endswith(f"/compare?sweep={sweeps.fast}")

    page.goto(f"{sweeps.url}/compare?sweep=abc&sweep=999999&sweep={sweeps.fast}")
    page.wait_for_selector("body[data-compare-state=ready]")
    errors = page.inner_text("#compare-errors")
    assert "sweep=abc is not a sweep id" in errors and "sweep 999999 not found" in errors
    assert page.url.endswith(f"/compare?sweep={sweeps.fast}")  # what is shown, nothing else


@pytest.mark.timeout(120)
def test_an_empty_sweep_says_so_instead_of_drawing_axes(sweeps, page):
    page.goto(f"{sweeps.url}/compare?sweep={sweeps.empty}")
    page.wait_for_selector("body[data-compare-state=ready]")
    for view in ("#parcoords-view", "#side-by-side"):
        assert page.locator(f"{view} .js-plotly-plot, {view} svg, {view} canvas").count() == 0
    assert page.inner_text("#parcoords-view .empty") == "no succeeded trial in these sweeps yet"
    assert no_page_scroll_sideways(page)
    page.screenshot(path="/tmp/compare-empty.png", full_page=True)

    page.goto(f"{sweeps.url}/sweeps/{sweeps.empty}")
    page.wait_for_selector("#scaling-view[data-state=empty]")
    assert page.inner_text("#scaling-view .empty") == "no succeeded trial in this sweep yet"
    assert page.locator("#scaling-view .js-plotly-plot, #scaling-view svg").count() == 0
    assert page.is_hidden("#scaling-slice")
    page.locator("#scaling-view").screenshot(path="/tmp/compare-scaling-empty.png")


@pytest.mark.timeout(60)
def test_numbers_are_written_for_people(sweeps, page):
    page.goto(f"{sweeps.url}/compare")
    page.wait_for_selector("body[data-compare-state=ready]")
    written = page.evaluate("""() => [Cmp.num(10234.5), Cmp.num(12.345), Cmp.num(0.012345),
        Cmp.bytes(1.5 * 2 ** 30), Cmp.bytes(512), Cmp.pct(0.5432), Cmp.ratio(1.5),
        Cmp.flops(2.5e12), Cmp.tokens(65536), Cmp.tokens(1048576), Cmp.num(null)]""")
    assert written == ["10,235", "12.3", "0.0123", "1.5 GiB", "512 B", "54.3%", "1.50×",
                       "2.5 TFLOP", "64k", "1M", "—"]
