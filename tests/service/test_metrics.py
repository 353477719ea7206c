"""GET /metrics: Prometheus' text format that its own parser reads; request counters by route
template that move with requests; gauges read from the database at scrape time (trials by
status, queue depth, schedule lag) that match it; the spool's backlog; and a database that
cannot be reached scraped as `gdn_sweep_db_up 0`, not as a failed scrape."""

from __future__ import annotations

import datetime as dt

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select, update

from service.db.models import Schedule, Trial
from service.main import create_app
from service.runs.spool import Spool
from workers.grid import expand_trials
from workers.result import TRIAL_STATUSES, TrialResult
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP, api_settings
from .private_postgres import free_port


def scrape(client: TestClient) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape, parsed by prometheus_client."""
    answer = client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def _requests(samples, route: str, status: str) -> float:
    return samples.get(("gdn_sweep_http_requests_total",
                        (("method", "GET"), ("route", route), ("status", status))), 0.0)


@pytest.fixture
def metrics_client(db_url, tmp_path):
    with TestClient(create_app(api_settings(db_url, spool_dir=str(tmp_path / "spool")))) as c:
        yield c


def test_request_counters_move_by_route_template_and_status(metrics_client):
    before = scrape(metrics_client)
    for sweep_id in (9998, 9999):
        assert metrics_client.get(f"/api/sweeps/{sweep_id}").status_code == 404
    assert metrics_client.get("/api/sweeps").status_code == 200
    assert metrics_client.get("/no/such/page").status_code == 404
    after = scrape(metrics_client)
    assert _requests(after, "/api/sweeps/{sweep_id}", "404") == \
        _requests(before, "/api/sweeps/{sweep_id}", "404") + 2
    assert _requests(after, "/api/sweeps", "200") == _requests(before, "/api/sweeps", "200") + 1
    assert _requests(after, "unmatched", "404") == _requests(before, "unmatched", "404") + 1
    assert _requests(after, "/metrics", "200") >= 1  # the first scrape, counted once it ended
    routes = {dict(labels).get("route") for _, labels in after}
    assert not {"/api/sweeps/9998", "/api/sweeps/9999", "/no/such/page"} & routes  # no raw paths
    latency = ("gdn_sweep_http_request_duration_seconds_count",
               (("method", "GET"), ("route", "/api/sweeps/{sweep_id}")))
    assert after[latency] == before.get(latency, 0.0) + 2


def test_trials_by_status_and_the_queue_match_the_database(metrics_client, session_factory):
    body = {**TINY_SWEEP, "name": "counted", "modes": ["ulysses", "p2p"], "chips": [1, 2, 3],
            "seq_lens": [64, 128]}  # ulysses and p2p on 3 chips cannot split 64: skipped
    created = metrics_client.post("/api/sweeps", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["skipped"] > 0
    samples = scrape(metrics_client)
    with session_factory() as session:
        in_db = dict(session.execute(select(Trial.status, func.count()).group_by(Trial.status))
                     .all())
    for status in TRIAL_STATUSES:
        assert samples[("gdn_sweep_trials", (("status", status),))] == in_db.get(status, 0), status
    assert samples[("gdn_sweep_queued_trials", ())] == in_db["pending"] > 0
    assert samples[("gdn_sweep_queued_sweeps", ())] == 1
    assert samples[("gdn_sweep_sweeps", (("status", "queued"),))] == 1
    assert samples[("gdn_sweep_db_up", ())] == 1


def test_schedule_lag_is_how_late_the_most_overdue_schedule_is(metrics_client, session_factory):
    spec = {**TINY_SWEEP, "name": "nightly"}
    for name in ("late", "later"):
        made = metrics_client.post("/api/schedules", json={"name": name, "cron": "0 2 * * *",
                                                           "spec": spec})
        assert made.status_code == 201, made.text
    assert scrape(metrics_client)[("gdn_sweep_schedule_lag_seconds", ())] == 0  # none due yet
    now = dt.datetime.now(dt.UTC)
    with session_factory() as session:
        for name, late_s in (("late", 600), ("later", 3600)):
            session.execute(update(Schedule).where(Schedule.name == name)
                            .values(next_run_at=now - dt.timedelta(seconds=late_s)))
        session.commit()
    lag = scrape(metrics_client)[("gdn_sweep_schedule_lag_seconds", ())]
    assert 3600 <= lag < 3600 + 60


def test_the_spool_backlog_counts_results_the_database_does_not_have(db_url, tmp_path):
    settings = api_settings(db_url, spool_dir=str(tmp_path / "spool"))
    journal = Spool(settings.spool_dir, settings.database_url).journal(sweep_id=1)
    trials = expand_trials(SweepSpec.model_validate({**TINY_SWEEP, "seq_lens": [64, 128]}))
    with TestClient(create_app(settings)) as client:
        empty = scrape(client)
        assert (empty[("gdn_sweep_spool_files", ())],
                empty[("gdn_sweep_spool_unstored_results", ())]) == (0, 0)
        seqs = [journal.append(TrialResult(trial=t, status="succeeded")) for t in trials]
        waiting = scrape(client)
        assert (waiting[("gdn_sweep_spool_files", ())],
                waiting[("gdn_sweep_spool_unstored_results", ())]) == (1, 2)
        journal.mark_stored(seqs[0])
        assert scrape(client)[("gdn_sweep_spool_unstored_results", ())] == 1
        journal.mark_stored(seqs[1])
        assert scrape(client)[("gdn_sweep_spool_files", ())] == 0
    journal.close()


@pytest.mark.timeout(60)
def test_a_database_that_cannot_be_reached_is_db_up_0_not_a_failed_scrape(tmp_path):
    closed = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/gdn_sweep"
    settings = api_settings(closed, spool_dir=str(tmp_path / "spool"))
    with TestClient(create_app(settings)) as client:
        samples = scrape(client)
    assert samples[("gdn_sweep_db_up", ())] == 0
    assert not any(name in ("gdn_sweep_trials", "gdn_sweep_queued_trials",
                            "gdn_sweep_schedule_lag_seconds") for name, _ in samples)
    assert samples[("gdn_sweep_spool_files", ())] == 0  # read from disk: still there
