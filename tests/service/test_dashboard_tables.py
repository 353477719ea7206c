"""The results table and the sweep page's trial table in a real browser (chromium via
Playwright): each row leads with its status, why it did not succeed, tokens/s/chip, MFU, step
time and peak memory, so the reason a point was skipped or failed is on screen at 1400 px
without scrolling; a torch trial's compile column reads "—" (torch compiles nothing), a JAX
trial's its seconds. And GET /api/results' `status` filter that shows the others."""

from __future__ import annotations

import pytest

from .conftest import api_settings, serving
from .seed import seed_sweep

LEADING = ["status", "reason", "tokens/s/chip", "MFU", "step time", "peak mem/chip"]
GRID = dict(frameworks=["jax", "torch"], modes=["p2p", "ulysses"], chips=[1, 2, 8],
            seq_lens=[64])
"""ulysses on 8 chips is skipped: the tiny model's 4 value heads do not split 8 ways."""
SKIPPED = "mode='ulysses' needs value heads (4) divisible by chips=8"


def failed_p2p(trial) -> str:
    return "failed" if trial.mode == "p2p" and trial.chips == 8 else "succeeded"


@pytest.fixture
def tables_server(db_url, session_factory):
    sweep_id = seed_sweep(session_factory, **GRID, status_of=failed_p2p)
    with serving(api_settings(db_url)) as url:
        yield url, sweep_id


def rows(page, table: str) -> list[dict]:
    """Each body row of `table` as {header: {text, left, right}} (the cell's place on screen)."""
    return page.evaluate("""(table) => {
        const heads = [...document.querySelectorAll(table + " thead th")].map((th) => th.textContent);
        return [...document.querySelectorAll(table + " tbody tr")].map((r) => Object.fromEntries(
          [...r.cells].map((c, i) => { const b = c.getBoundingClientRect();
            return [heads[i], { text: c.textContent, title: c.title, left: b.left, right: b.right }]; })));
    }""", table)


def assert_reasons_on_screen(page, table: str) -> list[dict]:
    """The table leads with LEADING; every row that did not succeed says why, inside the
    1400 px window; returns the rows."""
    heads = page.locator(f"{table} thead th").all_inner_texts()
    assert heads[1:1 + len(LEADING)] == LEADING, heads
    got = rows(page, table)
    others = [r for r in got if r["status"]["text"] != "succeeded"]
    assert {r["status"]["text"] for r in others} == {"failed", "skipped"}
    for row in others:
        reason = row["reason"]
        assert reason["text"] and reason["title"].startswith(reason["text"].rstrip("…"))
        assert 0 <= reason["left"] and reason["right"] <= 1400, reason  # no scrolling needed
    assert {r["reason"]["title"] for r in others if r["status"]["text"] == "skipped"} \
        and all(r["reason"]["title"].startswith(SKIPPED) for r in others
                if r["status"]["text"] == "skipped")
    assert {r["reason"]["text"] for r in others if r["status"]["text"] == "failed"} == {"boom"}
    assert all(r["reason"]["text"] == "" for r in got if r["status"]["text"] == "succeeded")
    return got


def assert_compile_column(got: list[dict], framework_of) -> None:
    ran = [r for r in got if r["status"]["text"] == "succeeded"]
    assert ran
    for row in ran:  # seed.py: a JAX trial compiled for 2 s; torch records 0 (nothing compiles)
        expected = "2 s" if framework_of(row) == "jax" else "—"
        assert row["compile"]["text"] == expected, row["compile"]
    assert any(framework_of(r) == "torch" for r in ran) and any(framework_of(r) == "jax" for r in ran)


@pytest.mark.timeout(120)
def test_the_sweep_page_leads_with_status_reason_and_speed(tables_server, page):
    url, sweep_id = tables_server
    page.goto(f"{url}/sweeps/{sweep_id}")
    page.wait_for_selector("#trials tbody tr[data-status=skipped]")
    got = assert_reasons_on_screen(page, "#trials")
    assert len(got) == 10  # 2 frameworks × (one chip + 2 modes × 2 chip counts)
    assert_compile_column(got, lambda r: r["framework"]["text"])
    torch_compile = [r["compile"]["title"] for r in got if r["framework"]["text"] == "torch"]
    assert all("nothing compiles" in title for title in torch_compile)


@pytest.mark.timeout(120)
def test_the_results_table_leads_with_status_reason_and_speed(tables_server, page):
    url, sweep_id = tables_server
    page.goto(f"{url}/results?sort=id")
    page.wait_for_selector("#results tbody tr")
    succeeded = rows(page, "#results")
    assert [r["status"]["text"] for r in succeeded] == ["succeeded"] * 6  # the default
    assert page.locator("#results thead th").all_inner_texts()[1:1 + len(LEADING)] == LEADING
    assert_compile_column(succeeded, lambda r: r["framework"]["text"])
    # the trials that did not succeed, from the form: why, on screen
    page.select_option("#f-status", label="did not succeed (why: the reason column)")
    page.click("#filters button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('#results tbody tr').length === 4")
    assert "status=failed&status=oom" in page.url
    assert_reasons_on_screen(page, "#results")


@pytest.mark.timeout(60)
def test_results_api_filters_by_status(client, session_factory):
    sweep_id = seed_sweep(session_factory, **GRID, status_of=failed_p2p)
    default = client.get("/api/results", params={"sweep_id": sweep_id}).json()
    assert default["count"] == 6 and {r["status"] for r in default["data"]} == {"succeeded"}
    skipped = client.get("/api/results", params={"sweep_id": sweep_id, "status": "skipped"}).json()
    assert skipped["count"] == 2
    assert all(r["error"].startswith(SKIPPED) and r["tokens_per_s_per_chip"] is None
               for r in skipped["data"])
    both = client.get("/api/results", params=[("sweep_id", sweep_id), ("status", "failed"),
                                              ("status", "skipped"), ("sort", "-tokens_per_s_per_chip")])
    assert sorted(r["status"] for r in both.json()["data"]) == ["failed"] * 2 + ["skipped"] * 2
    bad = client.get("/api/results", params={"status": "done"})
    assert bad.status_code == 422
    assert "status" in bad.text and "'succeeded'" in bad.text and "'skipped'" in bad.text
