"""Interpreted runs on the dashboard, in a real browser (Debian's chromium via Playwright)
against a live server: a sweep whose fused points ran through their kernels' interpreters, ten
times "faster" than the reference beside them (seed.py). No speed plot, scaling line or
comparison draws them, and the pages say they were left out; the results and sweep tables list
them with "interpreted" in place of each speed and "(interpreted)" on their kernels."""

from __future__ import annotations

import pytest

from .conftest import api_settings, serving
from .seed import seed_sweep
from .test_dashboard import _column

SPEEDS = ("tokens/s/chip", "vs 1 chip", "step time", "MFU")


@pytest.fixture
def sweep(session_factory, db_url):
    """(base URL, sweep id): GRID's fused trials interpreted, served with no scheduler."""
    fused = lambda t: t.kernels == "fused"  # noqa: E731
    sweep_id = seed_sweep(session_factory, modes=["p2p"], chips=[1, 2], seq_lens=[256, 512],
                          kernels=["reference", "fused"], interpreted_of=fused,
                          speed_of=lambda t: 10.0 if fused(t) else 1.0)
    with serving(api_settings(db_url)) as url:
        yield url, sweep_id


def names(page, plot: str) -> set[str]:
    return set(page.evaluate("(id) => document.getElementById(id).data"
                             ".filter(t => t.x.length).map(t => t.name)", plot))


@pytest.mark.timeout(120)
def test_interpreted_runs_are_listed_but_never_drawn_as_speeds(sweep, page):
    url, sweep_id = sweep
    page.goto(f"{url}/results?sweep_id={sweep_id}&sort=id")
    page.wait_for_function("() => document.querySelectorAll('#results tbody tr').length === 8")
    kernels = _column(page, "#results", "kernels")
    assert kernels == ["reference"] * 4 + ["fused (interpreted)"] * 4
    assert _column(page, "#results", "GDN kernel")[4:] == ["seed fused torch gdn (interpreted)"] * 4
    for header in (*SPEEDS, "HFU"):
        cells = _column(page, "#results", header)
        assert cells[4:] == ["interpreted"] * 4, header
        assert "interpreted" not in cells[:4], header
    assert _column(page, "#results", "tokens/s/chip")[0] == "256"  # one chip, 256 tokens

    page.goto(f"{url}/sweeps/{sweep_id}")
    page.wait_for_selector("#plot-throughput g.trace.scatter")
    page.wait_for_selector("#scaling-view[data-state=drawn]")
    # the reference lines only: no fused series at 10× drawn as a speed
    assert names(page, "plot-throughput") == {"torch one chip", "torch p2p"}
    assert names(page, "plot-scaling") == {"torch p2p"}
    assert names(page, "plot-mfu") == {"torch one chip", "torch p2p"}
    assert names(page, "scaling-total") == {"torch p2p"}
    assert max(y for t in page.evaluate("document.getElementById('plot-throughput').data")
               for y in t["y"]) == 512  # seed.py: the reference one chip at 512 tokens
    assert "4 interpreted results not drawn" in page.inner_text("#scaling-truncated")
    # the memory plot still shows what every process measured, the fused series included
    assert "torch one chip kernels=fused · process RSS (measured)" in names(page, "plot-memory")
    fused_rows = page.locator("#trials tbody tr", has_text="fused (interpreted)")
    assert fused_rows.count() == 4
    for header in SPEEDS:
        cells = _column(page, "#trials", header)
        assert sorted(cells).count("interpreted") == 4, (header, cells)

    page.goto(f"{url}/compare?sweep={sweep_id}")
    page.wait_for_selector("body[data-compare-state=ready]")
    assert "4 interpreted results not drawn" in page.inner_text("#compare-notes")
    parcoords = page.evaluate("document.getElementById('parcoords').data[0]")
    tokens = next(d for d in parcoords["dimensions"] if d["label"] == "tokens/s/chip")
    assert sorted(tokens["values"]) == [228, 256, 356, 512]  # the reference runs alone
