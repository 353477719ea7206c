"""Series told apart in every plot, in a real browser (chromium via Playwright): two series
that differ only in their kernels (fused vs reference) never share a colour, only in their
framework (jax vs torch) or decoder (gdn_only vs hybrid) never share a dash (the memory plot,
whose dash is the quantity, a marker; the MFU bars a hatching), and every legend name is its
own. On the compare page the same, each sweep with its own marker, parallel coordinates with
kernels and layers axes and whole sweep labels; the communication plot has a legend."""

from __future__ import annotations

import itertools

import pytest

from .conftest import api_settings, serving
from .seed import seed_sweep

GRID = dict(frameworks=["jax", "torch"], modes=["p2p"], chips=[1, 2], seq_lens=[64, 128],
            layers=["gdn_only", "hybrid"], kernels=["reference", "fused"])
LONG_NAME = "a second sweep whose name is longer than its axis label"
TRACES = """(id) => document.getElementById(id).data
    .filter((t) => t.showlegend !== false && t.name && !t.name.startsWith("communication: "))
    .map((t) => ({ name: t.name, color: (t.line || {}).color, dash: (t.line || {}).dash,
                   symbol: (t.marker || {}).symbol, fill: (t.marker || {}).color,
                   pattern: ((t.marker || {}).pattern || {}).shape }))"""


@pytest.fixture
def two_sweeps(db_url, session_factory):
    first = seed_sweep(session_factory, name="every kind", **GRID)
    second = seed_sweep(session_factory, name=LONG_NAME, **GRID, speed_of=lambda t: 0.8)
    with serving(api_settings(db_url)) as url:
        yield url, first, second


def dimensions(name: str) -> tuple[str, str, str, str]:
    """(framework, decoder, kernels, the rest) of a series name (GS.series: "torch p2p hybrid
    attn_cp=ring kernels=fused", a sweep's "#3 " before it, a quantity's " · …" after it)."""
    words = name.split(" · ")[0].split()
    sweep = [words.pop(0)] if words[0].startswith("#") else []
    framework = words.pop(0)
    layers = "hybrid" if "hybrid" in words else "gdn_only"
    kernels = "fused" if "kernels=fused" in words else "reference"
    rest = [w for w in words if w not in ("hybrid", "kernels=fused") and not w.startswith("attn_cp=")]
    return framework, layers, kernels, " ".join(sweep + rest + [name.partition(" · ")[2]])


def assert_told_apart(traces: list[dict], *, by: dict[str, str], plot: str) -> None:
    """Series differing in exactly one of framework, decoder, kernels differ in the trace
    property `by` names for it; every such kind of pair occurs; no two legend names alike."""
    names = [t["name"] for t in traces]
    assert len(names) == len(set(names)), (plot, names)
    pairs = {"framework": 0, "layers": 0, "kernels": 0}
    for a, b in itertools.combinations(traces, 2):
        da, db = dimensions(a["name"]), dimensions(b["name"])
        differ = [dim for dim, x, y in zip(pairs, da, db) if x != y]
        if da[3] != db[3] or len(differ) != 1:
            continue
        (dim,) = differ
        pairs[dim] += 1
        assert a[by[dim]] != b[by[dim]], (plot, dim, a, b)
    assert all(pairs.values()), (plot, pairs)


@pytest.mark.timeout(120)
def test_every_plot_of_the_sweep_page_tells_the_series_apart(two_sweeps, page):
    url, first, _ = two_sweeps
    page.goto(f"{url}/sweeps/{first}")
    page.wait_for_selector("#plot-mfu svg.main-svg")
    page.wait_for_selector("#scaling-view[data-state=drawn]")
    lines = {"framework": "dash", "layers": "dash", "kernels": "color"}
    for plot in ("plot-throughput", "plot-scaling", "scaling-total", "scaling-efficiency",
                 "scaling-breakdown"):
        assert_told_apart(page.evaluate(TRACES, plot), by=lines, plot=plot)
    # memory: dash is the quantity (measured, estimate, prediction), so the marker says which
    assert_told_apart(page.evaluate(TRACES, "plot-memory"), plot="plot-memory",
                      by={"framework": "symbol", "layers": "symbol", "kernels": "color"})
    assert_told_apart(page.evaluate(TRACES, "plot-mfu"), plot="plot-mfu",
                      by={"framework": "pattern", "layers": "pattern", "kernels": "fill"})


@pytest.mark.timeout(120)
def test_the_communication_plot_has_a_legend(two_sweeps, page):
    url, first, _ = two_sweeps
    page.goto(f"{url}/sweeps/{first}")
    page.wait_for_selector("#scaling-view[data-state=drawn]")
    page.wait_for_load_state("networkidle")
    figure = page.evaluate("""() => { const div = document.getElementById('scaling-breakdown');
        return { shown: div._fullLayout.showlegend,
                 entries: [...div.querySelectorAll('g.legend text.legendtext')].map((t) => t.textContent),
                 comm: div.data.filter((t) => t.xaxis === 'x2' && t.x.length && t.meta && t.meta.comm)
                               .map((t) => t.legendgroup) }; }""")
    assert figure["shown"]
    entries = figure["entries"]
    assert {"communication: CP exchanges", "communication: gradient sync"} <= set(entries)
    assert figure["comm"]  # each series drawn there is named in the legend
    assert all(any(e.startswith(group) for e in entries) for group in figure["comm"])
    assert len(entries) == len(set(entries))
    box = page.evaluate("""() => { const r = (el) => el.getBoundingClientRect();
        const div = document.getElementById('scaling-breakdown');
        const legend = r(div.querySelector('g.legend')), fig = r(div);
        return legend.bottom <= fig.bottom + 1 && legend.top >= fig.top; }""")
    assert box  # the whole legend inside the figure, none scrolled away


@pytest.mark.timeout(120)
def test_the_compare_page_tells_series_and_sweeps_apart(two_sweeps, page):
    url, first, second = two_sweeps
    page.goto(f"{url}/compare?sweep={first}&sweep={second}")
    page.wait_for_selector("body[data-compare-state=ready]")
    page.wait_for_selector("#compare-lines svg.main-svg")
    traces = page.evaluate(TRACES, "compare-lines")
    assert_told_apart(traces, by={"framework": "dash", "layers": "dash", "kernels": "color"},
                      plot="compare-lines")
    by_sweep = {}
    for t in traces:
        by_sweep.setdefault(t["name"].split()[0], set()).add(t["symbol"])
    assert sorted(by_sweep) == [f"#{first}", f"#{second}"]
    assert all(len(symbols) == 1 for symbols in by_sweep.values())
    assert by_sweep[f"#{first}"] != by_sweep[f"#{second}"]  # a marker per sweep

    dims = {d["label"]: d for d in page.evaluate(
        "document.getElementById('parcoords').data[0].dimensions")}
    assert dims["kernels"]["ticktext"] == ["fused", "reference"]
    assert dims["layers"]["ticktext"] == ["gdn_only", "hybrid"]
    assert dims["sweep"]["ticktext"] == [f"#{first} every kind",  # 28 characters at most
                                         f"#{second} {LONG_NAME}"[:27] + "…"]
    clipped = page.evaluate("""() => {
        const svg = document.querySelector('#parcoords svg.main-svg').getBoundingClientRect();
        return [...document.querySelectorAll('#parcoords text')]
          .filter((t) => t.textContent.startsWith('#'))
          .map((t) => [t.textContent, t.getBoundingClientRect().left - svg.left]); }""")
    assert len(clipped) == 2 and all(left >= 0 for _, left in clipped), clipped
