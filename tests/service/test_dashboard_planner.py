"""The capacity planner's page in a real browser (Debian's chromium via Playwright) against a
live server on SQLite and PostgreSQL, over a sweep seeded with traceable figures (seed.py):
the form kept in the link, the API's answer as picks, tables and a Pareto plot whose measured
points are told apart from the fitted ones, and the API's 422 beside the field it names. Every
expected figure comes from a direct GET /api/capacity; the page's are read from the DOM and
the plotly graph div's `data`. Screenshots at 1400×900 go to /tmp/planner-*.png."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from .browser import WINDOW
from .conftest import api_settings, serving
from .seed import seed_sweep

MIB = 2 ** 20
QUERY = {"preset": "tiny", "seq_len": 1024, "accelerator": "cpu", "num_layers": 1,
         "dtype": "float32", "max_chips": 8, "chip_memory_bytes": 6 * MIB}
"""Chips 1 and 2 measured (1 MB each), the fits' 4 and 8 chips; 6 MiB chips leave some out."""
FIGURES = ("memory_bytes_per_chip", "tokens_per_s_per_chip", "tokens_per_s", "mfu",
           "comm_bytes_per_step_per_chip", "step_time_s")
BINARY_BYTES = re.compile(r"\d+(\.\d+)? (B|KiB|MiB|GiB)")
BASIS_LABEL = {"measured": "measured", "interpolated": "interp.", "extrapolated": "extrap."}


def faster_on_more_chips(trial) -> float:
    """Step time falling as √chips, so the frontier holds more than the one-chip point."""
    return 0.01 / trial.chips ** 0.5


@pytest.fixture
def planner_url(session_factory, db_url):
    seed_sweep(session_factory, name="cpu p2p", frameworks=["jax"], modes=["p2p"], chips=[1, 2],
               seq_lens=[256, 512, 1024], step_time_of=faster_on_more_chips)
    with serving(api_settings(db_url)) as url:
        yield url


@pytest.fixture
def page(csp_page):
    return csp_page


def capacity(url: str, query: dict) -> httpx.Response:
    return httpx.get(f"{url}/api/capacity", params=query, timeout=60)


def open_planner(page, url: str, query: dict, state: str = "answered") -> None:
    page.goto(f"{url}/planner?{urlencode(query, doseq=True)}")
    page.wait_for_selector(f"body[data-planner-state={state}]")


def csp_refusals(page) -> list[dict]:
    """What the CSP refused, less plotly's own injected CSS (refused by design, guards.py)."""
    return [v for v in page.evaluate("window.__csp")
            if not (v["directive"] in ("style-src-elem", "style-src-attr")
                    and v["source"].endswith("/vendor/plotly.min.js"))]


def table_rows(page, table: str) -> list[dict]:
    return page.evaluate("""(table) => [...document.querySelectorAll(table + " tbody tr")].map(r => ({
        key: [r.dataset.framework, r.dataset.mode, Number(r.dataset.chips), Number(r.dataset.dp),
              r.dataset.paramSharding, r.dataset.remat],
        mesh: r.querySelector("td[data-mesh]").textContent,
        figures: Object.fromEntries([...r.querySelectorAll("td[data-figure]")].map(td => [
            td.dataset.figure, { value: td.dataset.value === "" ? null : Number(td.dataset.value),
                                 basis: td.dataset.basis, text: td.textContent, title: td.title }])),
    }))""", table)


def key(candidate: dict) -> list:
    return [candidate["framework"], candidate["mode"], candidate["chips"], candidate["dp"],
            candidate["param_sharding"], candidate["remat"]]


def pareto_frontier(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The points no other beats with as few chips or fewer and as many tokens/s or more."""
    return sorted({p for p in points
                   if not any(q != p and q[0] <= p[0] and q[1] >= p[1] for q in points)})


def assert_rows_match(rows: list[dict], candidates: list[dict]) -> None:
    assert [r["key"] for r in rows] == [key(c) for c in candidates]
    assert [r["mesh"] for r in rows] == [f"{c['dp']}×{c['cp_chips']}" for c in candidates]
    for row, candidate in zip(rows, candidates, strict=True):
        for field in FIGURES:
            shown, figure = row["figures"][field], candidate[field]
            assert shown["basis"] == figure["basis"], (row["key"], field)
            assert shown["value"] == pytest.approx(figure["value"]), (row["key"], field)
            assert shown["title"].startswith(figure["basis"]), (row["key"], field)
            if figure["note"]:
                assert figure["note"] in shown["title"], (row["key"], field)


@pytest.mark.timeout(180)
def test_planner_page_draws_the_apis_answer(planner_url, page):
    answer = capacity(planner_url, QUERY).json()
    fitting = [c for c in answer["candidates"] if c["fits"]]
    over = [c for c in answer["candidates"] if not c["fits"]]
    assert fitting and over  # the fixture's premise: some fit 6 MiB chips, some do not
    open_planner(page, planner_url, QUERY)

    assert_rows_match(table_rows(page, "#fitting"), fitting)
    # people's numbers: "145,000 measured", binary memory units
    first = next(r["figures"] for r in table_rows(page, "#fitting")
                 if r["figures"]["tokens_per_s"]["value"] is not None)
    tokens = first["tokens_per_s"]  # three significant digits, en-US separators, the badge
    three_digits = float(f"{tokens['value']:.3g}")
    assert tokens["value"] >= 1000 and tokens["text"] == \
        f"{three_digits:,.0f} {BASIS_LABEL[tokens['basis']]}", tokens
    assert BINARY_BYTES.match(first["memory_bytes_per_chip"]["text"]), first
    # those that do not fit: behind a closed toggle, all of them
    assert page.evaluate("document.getElementById('not-fitting').open") is False
    assert page.inner_text("#not-fitting-summary").startswith(f"{len(over)} candidates")
    assert_rows_match(table_rows(page, "#not-fitting-table"), over)

    for pick in ("fewest_chips", "cheapest", "fastest"):
        card = page.locator(f".pick[data-pick={pick}]")
        expected = answer[pick]
        assert [card.get_attribute(f"data-{a}") for a in ("framework", "mode", "chips", "dp",
                                                          "param-sharding", "remat")] == \
            [str(v) for v in key(expected)], pick
        links = card.locator("dd[data-figure=tokens_per_s] a").evaluate_all(
            "links => links.map(a => a.getAttribute('href'))")
        assert links == [f"/api/trials/{i}" for i in expected["tokens_per_s"]["trial_ids"][:6]]
    assert answer["fewest_chips"]["chips"] == 1
    trial = httpx.get(planner_url + page.locator(".pick[data-pick=fewest_chips] a").first
                      .get_attribute("href")).json()  # the link leads to the trial it names
    assert trial["id"] == answer["fewest_chips"]["memory_bytes_per_chip"]["trial_ids"][0]

    traces = page.evaluate("document.getElementById('pareto').data.map(t => ({name: t.name, "
                           "x: t.x, y: t.y, meta: t.meta, symbol: t.marker && t.marker.symbol}))")
    timed = [(c["chips"], c["tokens_per_s"]["value"], c["tokens_per_s"]["basis"]) for c in fitting
             if c["tokens_per_s"]["value"] is not None]
    (measured,) = [t for t in traces if (t["meta"] or {}).get("basis") == "measured"]
    assert measured["symbol"] == "circle"
    assert sorted(zip(measured["x"], measured["y"], strict=True)) == pytest.approx(
        sorted((x, y) for x, y, basis in timed if basis == "measured"))
    assert {x for x, _ in zip(measured["x"], measured["y"], strict=True)} == {1, 2}
    fitted = [t for t in traces if (t["meta"] or {}).get("basis") not in (None, "measured")]
    assert fitted and all(t["symbol"].endswith("-open") for t in fitted)  # told apart
    assert sum(len(t["x"]) for t in fitted) == sum(1 for *_, b in timed if b != "measured")
    (frontier,) = [t for t in traces if (t["meta"] or {}).get("frontier")]
    expected_front = pareto_frontier([(x, y) for x, y, _ in timed])
    assert len(expected_front) >= 2
    assert list(zip(frontier["x"], frontier["y"], strict=True)) == pytest.approx(expected_front)
    assert page.locator("#pareto .legendtext").all_text_contents()[0].startswith("measured")

    assert answer["chip_memory_source"] in page.inner_text("#chip-memory-source")
    assert page.locator("#caveats li").all_text_contents() == answer["caveats"]
    checks = page.locator("#plan-checks li").all_text_contents()
    assert len(checks) == len(answer["plan_checks"])
    assert page.locator("#plan-checks-title").is_hidden() == (not answer["plan_checks"])
    assert page.evaluate("document.scrollingElement.scrollWidth") <= WINDOW["width"]
    assert csp_refusals(page) == []
    page.screenshot(path="/tmp/planner-answer.png")
    page.screenshot(path="/tmp/planner-answer-full.png", full_page=True)

    # the form's values go to the link, and the link gives the same answer back
    page.fill("#f-max_chips", "2")
    page.select_option("#f-kernels", "fused")
    page.click("#plan-submit")
    page.wait_for_function("() => document.body.dataset.plannerState === 'answered' && "
                           "[...document.querySelectorAll('#fitting tbody tr')]"
                           ".every(r => Number(r.dataset.chips) <= 2)")
    link = page.url
    assert parse_qs(urlsplit(link).query)["max_chips"] == ["2"]
    assert parse_qs(urlsplit(link).query)["kernels"] == ["fused"]
    smaller = capacity(planner_url, {**QUERY, "max_chips": 2, "kernels": "fused"}).json()
    assert smaller["request"]["kernels"] == "fused"
    page.goto(link)
    page.wait_for_selector("body[data-planner-state=answered]")
    assert_rows_match(table_rows(page, "#fitting"),
                      [c for c in smaller["candidates"] if c["fits"]])
    assert page.input_value("#f-max_chips") == "2"
    assert page.input_value("#f-kernels") == "fused"
    assert float(page.input_value("#f-chip_memory_gib")) * 2 ** 30 == QUERY["chip_memory_bytes"]


@pytest.mark.timeout(180)
def test_planner_page_shows_the_apis_422_beside_the_field(planner_url, page):
    for bad, field in (({**QUERY, "accelerator": "h900"}, "accelerator"),
                       ({k: v for k, v in QUERY.items() if k != "preset"}, "preset")):
        refusal = capacity(planner_url, bad)
        assert refusal.status_code == 422
        (detail,) = refusal.json()["detail"]
        assert detail["loc"] == ["query", field]
        open_planner(page, planner_url, bad, state="error")
        assert page.inner_text(f"#e-{field}") == detail["msg"].removeprefix("Value error, ")
        assert page.get_attribute(f"#f-{field}", "aria-invalid") == "true"
        assert page.locator("#candidates-section").is_hidden()
    page.screenshot(path="/tmp/planner-error.png")

    # typed into the form: the API's bounds, beside the field
    open_planner(page, planner_url, QUERY)
    page.fill("#f-seq_len", "0")
    page.click("#plan-submit")
    page.wait_for_selector("body[data-planner-state=error]")
    (detail,) = capacity(planner_url, {**QUERY, "seq_len": 0}).json()["detail"]
    assert page.inner_text("#e-seq_len") == detail["msg"]
    assert page.inner_text("#e-accelerator") == ""  # the earlier message is gone
    assert "seq_len=0" in page.url

    # a parameter the form has no field for travels in the link, and its 422 is still shown
    open_planner(page, planner_url, {**QUERY, "modes": "ring"}, state="error")
    (detail,) = capacity(planner_url, {**QUERY, "modes": "ring"}).json()["detail"]
    assert f"modes: {detail['msg']}" in page.inner_text("#plan-errors")

    # an answer where nothing fits says so, and what to change
    tiny_chips = {**QUERY, "chip_memory_bytes": 1}
    answer = capacity(planner_url, tiny_chips).json()
    assert answer["candidates"] and not any(c["fits"] for c in answer["candidates"])
    assert answer["fewest_chips"] is None
    open_planner(page, planner_url, tiny_chips)
    assert page.inner_text("#nothing-fits").startswith("Nothing fits")
    assert page.locator("#fitting tbody tr").count() == 0
    assert page.evaluate("document.getElementById('not-fitting').open") is True
    assert page.locator("#not-fitting-table tbody tr").count() == len(answer["candidates"])
    assert "No candidate fits" in page.inner_text(".pick[data-pick=fewest_chips]")
    assert "No candidate" in page.inner_text("#pareto")
    assert csp_refusals(page) == []
    page.screenshot(path="/tmp/planner-nothing-fits.png")


DEMO_LIKE = {"frameworks": ["jax", "torch"], "modes": ["all_gather", "p2p"], "chips": [1, 2],
             "seq_lens": [384, 768, 1536], "dtypes": ["float32"], "model": {"preset": "tiny"}}
"""service.demo's grid on a 2-core host: tiny, float32, both frameworks, chips 1 and 2."""


@pytest.mark.timeout(180)
def test_planner_form_starts_from_the_stored_trials_and_answers_speed(session_factory, db_url,
                                                                      page):
    """After the float32 demo the page opened bare asks what the trials can answer (their
    dtype, frameworks, chip, longest length) and shows measured speed; the form's old
    defaults (bfloat16, JAX) are refused, and the page says why."""
    seed_sweep(session_factory, name="demo-like", **DEMO_LIKE)
    with serving(api_settings(db_url)) as url:
        form = httpx.get(f"{url}/api/capacity/defaults").json()
        assert form["defaults"] | {"frameworks": sorted(form["defaults"]["frameworks"])} == {
            "preset": "tiny", "accelerator": "cpu", "dtype": "float32", "kernels": "reference",
            "layers": ["gdn_only"], "num_layers": None, "frameworks": ["jax", "torch"],
            "seq_len": 1536, "max_chips": 2}
        assert form["layers"] == ["gdn_only", "hybrid"] and "zigzag" in form["layouts"]
        page.goto(f"{url}/planner")
        page.wait_for_selector("body[data-planner-state=answered]")
        assert page.input_value("#f-dtype") == "float32"
        assert page.input_value("#f-accelerator") == "cpu"
        checked = page.eval_on_selector_all("#f-frameworks input:checked",
                                            "els => els.map(e => e.value)")
        assert sorted(checked) == ["jax", "torch"]
        assert "stored measured trials" in page.inner_text("#form-source")
        rows = table_rows(page, "#fitting")
        # every point the demo ran is measured (other modes and shardings may be refused)
        ran = [r["figures"]["tokens_per_s_per_chip"] for r in rows
               if r["key"][1] in ("none", "all_gather", "p2p") and r["key"][3:] == [
                   1, "replicated", "none"]]
        assert len(ran) == 2 * (1 + 2)  # per framework: one chip, and both modes on two
        assert all(s["value"] is not None and s["basis"] == "measured" for s in ran)
        answer = capacity(url, dict(parse_qs(urlsplit(page.url).query))).json()
        assert_rows_match(rows, [c for c in answer["candidates"] if c["fits"]])
        assert page.locator(".pick[data-pick=cheapest] dd[data-figure=tokens_per_s_per_chip]")\
            .count() == 1
        assert page.locator("#no-speed").is_hidden()
        page.screenshot(path="/tmp/planner-from-trials.png", full_page=True)

        old = {"preset": "tiny", "seq_len": 1536, "accelerator": "cpu"}
        refused = capacity(url, old).json()
        fitting = [c for c in refused["candidates"] if c["fits"]]
        assert fitting and all(c["step_time_s"]["value"] is None for c in fitting)
        open_planner(page, url, old)
        why = page.inner_text("#no-speed")
        assert why.startswith("No candidate that fits has a step time")
        assert fitting[0]["step_time_s"]["note"] in why  # the API's own reason
        assert "no one-chip measured trial" in page.inner_text(".pick[data-pick=cheapest]")
        assert "The stored trials ran dtype float32 (asked: bfloat16)" in why
        assert "frameworks jax, torch (asked: jax)" in why
        with page.expect_navigation():
            page.click("#plan-as-trials")  # the link asks what the trials answer
        page.wait_for_selector("body[data-planner-state=answered]")
        assert page.input_value("#f-dtype") == "float32" and page.locator("#no-speed").is_hidden()
        page.screenshot(path="/tmp/planner-refused.png", full_page=True)


@pytest.mark.timeout(180)
def test_planner_page_shows_roofline_figures_and_their_basis(planner_url, page):
    query = {"preset": "qwen3.5-9b", "seq_len": 2 ** 20, "accelerator": "v5p",
             "max_chips": 64, "dp": 1}
    answer = capacity(planner_url, query).json()
    open_planner(page, planner_url, query)
    assert answer["speed_basis"]["label"] in page.inner_text("#speed-basis")
    rows = table_rows(page, "#fitting")
    assert_rows_match(rows, [c for c in answer["candidates"] if c["fits"]])
    hours = [r["figures"]["chip_hours_per_billion_tokens"] for r in rows]
    assert hours and all(h["basis"] == "roofline" and h["text"].endswith("roofline")
                         for h in hours)
    splits = page.eval_on_selector_all("#fitting td[data-split]",
                                       "els => els.map(e => e.textContent)")
    assert any("ring · zigzag" in s for s in splits)
    assert page.evaluate("document.getElementById('pareto').data.some(t => t.meta && "
                         "t.meta.basis === 'roofline' && t.marker.symbol === 'star-open')")
    page.screenshot(path="/tmp/planner-roofline.png", full_page=True)
