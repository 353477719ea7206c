"""GET /api/regressions and `gdn-sweep regressions` over a schedule's real nights (fired on a
controlled clock, results through the database sink), on SQLite and PostgreSQL: a slowdown
from night 7 is one open regression of step time and of tokens/s at night 7 with its size,
the unchanged series beside it and the memory have none; `new` (and exit 3) only while the
latest night is what opened it; improvements are reported, not open; bad input is a 422 /
exit 2 naming it. Schedules take an http(s) webhook URL only."""

from __future__ import annotations

import argparse
import io

import pytest

from service.cli.regressions import run_regressions

from .regression_nights import nightly_levels, nightly_schedule, run_nights

SLOWDOWN_FROM, NIGHTS, FACTOR = 7, 12, 1.3


@pytest.fixture
def nights(session_factory):
    """A schedule's 12 nights: the seq_len=64 series 30% slower from night 7 on (σ 3%)."""
    schedule_id = nightly_schedule(session_factory)
    sweeps = run_nights(session_factory, {
        "shifted": nightly_levels(11, NIGHTS, slowdown_from=SLOWDOWN_FROM, factor=FACTOR),
        "steady": nightly_levels(12, NIGHTS)})
    return schedule_id, sweeps


def _cli(db_url: str, **options) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = argparse.Namespace(database_url=db_url, schedule=None, sweep_id=None, json=False)
    vars(args).update(options)
    return run_regressions(args, out, err), out.getvalue(), err.getvalue()


@pytest.mark.timeout(60)
def test_a_slowdown_is_one_open_regression_at_its_night(client, nights, db_url):
    schedule_id, sweeps = nights
    body = client.get("/api/regressions", params={"schedule": "nightly"}).json()
    assert body["series"] == 2 and body["count"] == 2 and body["improvements"] == []
    by_metric = {r["metric"]: r for r in body["data"]}
    assert set(by_metric) == {"step_time_s", "tokens_per_s_per_chip"}  # memory unchanged
    step = by_metric["step_time_s"]
    assert "seq_len=64/" in step["series"] and "/repeat=" not in step["series"]
    assert step["first_run"]["sweep_id"] == sweeps[SLOWDOWN_FROM]
    assert step["last_run_before"]["sweep_id"] == sweeps[SLOWDOWN_FROM - 1]
    assert step["relative_change"] == pytest.approx(FACTOR - 1, abs=0.08)
    assert step["runs_after"] == NIGHTS - SLOWDOWN_FROM and step["new"] is False
    assert step["schedule_id"] == schedule_id and step["environment_diff"] is None
    assert [p["sweep_id"] for p in step["points"]] == sweeps
    assert by_metric["tokens_per_s_per_chip"]["relative_change"] == pytest.approx(
        1 / FACTOR - 1, abs=0.06)
    # one set of sweeps named by id: the same series, no schedule
    named = client.get("/api/regressions", params=[("sweep_id", s) for s in sweeps]).json()
    assert named["count"] == 2 and named["data"][0]["schedule_id"] is None
    before = client.get("/api/regressions", params=[("sweep_id", s) for s in sweeps[:7]]).json()
    assert before["count"] == 0  # the slow nights left out: nothing
    code, out, _ = _cli(db_url, schedule="nightly")
    assert code == 0, out  # open, but not new: cron stays quiet
    assert f"{step['relative_change']:+.1%}" in out  # the API's size, as printed
    assert f"sweep {sweeps[SLOWDOWN_FROM]}" in out and "not recorded" in out


@pytest.mark.timeout(60)
def test_new_only_with_the_night_that_opened_it(client, session_factory, db_url):
    nightly_schedule(session_factory)
    levels = {"shifted": nightly_levels(21, 9, slowdown_from=7, factor=1.4),
              "steady": nightly_levels(22, 9)}
    run_nights(session_factory, {k: v[:8] for k, v in levels.items()})
    assert client.get("/api/regressions").json()["count"] == 0  # one slow night: an outlier
    run_nights(session_factory, {k: v[8:] for k, v in levels.items()}, first=8)
    body = client.get("/api/regressions").json()
    assert body["count"] == 2 and body["new"] == 2
    assert all(r["new"] for r in body["data"])
    code, out, _ = _cli(db_url)
    assert code == 3 and out.count("NEW") == 2
    code, out, _ = _cli(db_url, json=True)
    assert code == 3 and '"new": 2' in out


@pytest.mark.timeout(60)
def test_a_speedup_is_an_improvement_not_a_regression(client, session_factory):
    nightly_schedule(session_factory)
    run_nights(session_factory, {"shifted": nightly_levels(31, 10, slowdown_from=5, factor=0.6),
                                 "steady": nightly_levels(32, 10)})
    body = client.get("/api/regressions").json()
    assert body["count"] == 0
    assert {r["metric"] for r in body["improvements"]} == {"step_time_s",
                                                           "tokens_per_s_per_chip"}
    assert all(r["kind"] == "improvement" for r in body["improvements"])


@pytest.mark.timeout(60)
def test_bad_scope_is_a_422_naming_it(client, nights, db_url):
    answer = client.get("/api/regressions", params={"schedule": "weekly"})
    assert answer.status_code == 422
    assert "'weekly' names no schedule; known: 'nightly'" in answer.json()["detail"][0]["msg"]
    answer = client.get("/api/regressions", params={"sweep_id": 999999})
    assert answer.status_code == 422 and "sweep_id 999999: no such sweep" in answer.text
    answer = client.get("/api/regressions", params={"schedule": "nightly", "sweep_id": 1})
    assert answer.status_code == 422 and "not both" in answer.text
    for bad in ({"metric": "mfu"}, {"sweep_id": 0}, {"sweep_id": 2 ** 31}, {"schedule": "a\x00"}):
        answer = client.get("/api/regressions", params=bad)
        assert answer.status_code == 422, bad
    assert "step_time_s" in client.get("/api/regressions", params={"metric": "mfu"}).text
    code, _, err = _cli(db_url, schedule="weekly")
    assert code == 2 and "names no schedule" in err


@pytest.mark.timeout(60)
def test_a_schedule_takes_an_http_webhook_only(client):
    from .conftest import TINY_SWEEP

    body = {"name": "n", "cron": "0 2 * * *", "spec": TINY_SWEEP}
    for bad in ("ftp://example.com/hook", "file:///etc/passwd", "not a url", "http://"):
        answer = client.post("/api/schedules", json={**body, "webhook_url": bad})
        assert answer.status_code == 422, bad
        assert answer.json()["detail"][0]["loc"] == ["body", "webhook_url"]
    assert "scheme should be 'http' or 'https'" in client.post(
        "/api/schedules", json={**body, "webhook_url": "ftp://x.org/"}).text
    assert client.get("/api/schedules").json()["count"] == 0  # nothing written
    created = client.post("/api/schedules",
                          json={**body, "webhook_url": "http://127.0.0.1:9/hook"}).json()
    assert created["webhook_url"] == "http://127.0.0.1:9/hook"
    assert created["webhook_status"] is None and created["webhook_error"] is None
    path = f"/api/schedules/{created['id']}"
    assert client.patch(path, json={"webhook_url": "gopher://x"}).status_code == 422
    assert client.patch(path, json={"name": "m"}).json()["webhook_url"] == created["webhook_url"]
    assert client.patch(path, json={"webhook_url": ""}).json()["webhook_url"] is None
