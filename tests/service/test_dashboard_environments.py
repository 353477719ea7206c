"""The sweep page's Environments section in a real browser (Debian's chromium via Playwright)
against a live server: each trial's environment id in the trial table, one column per distinct
environment with how many trials measured in it, the keys that differ marked, a value the
environment holds shown as text (no markup), and nothing refused by the CSP."""

from __future__ import annotations

import pytest

from service.db.engine import make_engine, make_session_factory
from service.runs.db_sink import record_result
from workers.result import TrialResult

from .conftest import api_settings, serving
from .test_dashboard_planner import csp_refusals
from .test_environments import _environment, _sweep, _trial_ids

EVIL = '<img src=x onerror="window.__pwned = 1">'


@pytest.mark.timeout(120)
def test_the_sweep_page_shows_each_environment_and_marks_what_changed(db_url, csp_page):
    engine = make_engine(db_url)
    session_factory = make_session_factory(engine)
    sweep_id, trials = _sweep(session_factory, name="envs", seq_lens=[64, 128, 256, 512])
    before, after = _environment(), _environment(torch="2.14.0")
    after["accelerator"]["device_name"] = EVIL
    for trial, env in zip(trials, (before, before, after, None)):
        record_result(session_factory=session_factory, sweep_id=sweep_id,
                      result=TrialResult(trial=trial, status="succeeded", attempts=1,
                                         environment=env))
    ids = _trial_ids(session_factory, sweep_id)
    engine.dispose()

    with serving(api_settings(db_url)) as url:
        page = csp_page
        page.goto(f"{url}/sweeps/{sweep_id}")
        page.wait_for_selector("#environment-table tbody tr")
        heads = page.locator("#environment-table thead th").all_inner_texts()
        assert heads[0] == "key" and len(heads) == 3
        assert heads[1].endswith("· 2 trials") and heads[2].endswith("· 1 trial")
        changed = page.locator("#environment-table tr.changed")
        assert sorted(changed.evaluate_all("rows => rows.map(r => r.dataset.key)")) == [
            "accelerator.device_name", "packages.torch"]
        torch = page.locator("#environment-table tr[data-key='packages.torch'] td")
        assert torch.all_inner_texts() == ["packages.torch", "2.13.0", "2.14.0"]
        evil = page.locator("#environment-table tr[data-key='accelerator.device_name'] td").nth(2)
        assert evil.inner_text() == EVIL  # shown as text
        assert page.locator("#environment-table tr[data-key='runtime.cuda'] td").nth(1) \
            .inner_text() == "null"
        env_column = page.locator("#trials thead th").all_inner_texts().index("env")
        env_cells = {int(row.get_attribute("data-trial-id")): row.locator("td").nth(env_column)
                     .inner_text() for row in page.locator("#trials tbody tr").all()}
        first, _, third, none = (ids[t.key] for t in trials)
        assert env_cells[none] == "" and env_cells[first] != env_cells[third]
        assert env_cells[first].startswith("#")
        assert page.evaluate("window.__pwned") is None
        assert csp_refusals(page) == []
