"""A schedule's webhook against a real local HTTP server, on SQLite and PostgreSQL: nights
fired on a controlled clock and finished one by one, each followed by the alert the
scheduler sends when a sweep finishes; exactly one POST for the slowdown, at the night that
opens it, naming the night it started; none for a steady schedule; a receiver that fails is
retried, then the failure is stored and shown on the schedule; and once through the real
scheduler with real trials on Ray, the sweep finishing while the POST is still retried."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from service.db.models import RegressionAlert
from service.regressions.webhook import alert_after_sweep

from .regression_nights import (
    RealNights,
    fire_night,
    nightly_levels,
    nightly_schedule,
    record_night,
    run_nights,
)
from .webhook_receiver import webhook_receiver

FAST = {"backoff_s": 0.01, "timeout_s": 5.0}


@pytest.mark.timeout(90)
def test_one_post_per_new_regression(session_factory, client):
    with webhook_receiver() as hook:
        schedule_id = nightly_schedule(session_factory, webhook_url=hook.url)
        shifted = nightly_levels(41, 12, slowdown_from=6, factor=1.35)
        steady = nightly_levels(42, 12)
        sent, sweeps = [], []
        for night in range(12):
            sweep_id = fire_night(session_factory, night)
            record_night(session_factory, sweep_id, lambda key, n=night: (
                shifted if "seq_len=64" in key else steady)[n])
            sweeps.append(sweep_id)
            sent.append(alert_after_sweep(session_factory=session_factory, sweep_id=sweep_id,
                                          **FAST))
        # again for the night that opened it (a second process, a replay): nothing more
        assert alert_after_sweep(session_factory=session_factory, sweep_id=sweeps[7]) == 0
        assert sent == [0] * 7 + [2] + [0] * 4  # night 7: the 2nd slow night makes it a level
        (post,) = hook.posts
    body = post["body"]
    assert body["event"] == "regressions_opened" and body["count"] == 2
    assert body["schedule"] == {"id": schedule_id, "name": "nightly"}
    assert body["sweep"]["id"] == sweeps[7]
    assert {r["metric"] for r in body["regressions"]} == {"step_time_s",
                                                          "tokens_per_s_per_chip"}
    for regression in body["regressions"]:
        assert regression["first_run"]["sweep_id"] == sweeps[6] and regression["new"]
        assert "seq_len=64/" in regression["series"] and regression["environment_diff"] is None
        assert "points" not in regression
    step = next(r for r in body["regressions"] if r["metric"] == "step_time_s")
    assert step["relative_change"] == pytest.approx(0.35, abs=0.08)
    assert post["headers"]["Idempotency-Key"] == f"gdn-sweep-regressions-{schedule_id}-" \
                                                 f"{sweeps[7]}"
    shown = client.get(f"/api/schedules/{schedule_id}").json()
    assert shown["webhook_status"] == "delivered" and shown["webhook_error"] is None
    with session_factory() as session:
        alerts = session.scalars(select(RegressionAlert)).all()
    assert sorted((a.metric, a.first_sweep_id, a.status, a.attempts) for a in alerts) == [
        ("step_time_s", sweeps[6], "delivered", 1),
        ("tokens_per_s_per_chip", sweeps[6], "delivered", 1)]


@pytest.mark.timeout(90)
def test_a_failing_receiver_is_retried_then_shown_on_the_schedule(session_factory, client):
    with webhook_receiver([500, 503, 502]) as hook:
        schedule_id = nightly_schedule(session_factory, webhook_url=hook.url)
        sweeps = run_nights(session_factory, {
            "shifted": nightly_levels(51, 9, slowdown_from=7, factor=1.5),
            "steady": nightly_levels(52, 9)})
        sent = alert_after_sweep(session_factory=session_factory, sweep_id=sweeps[-1], tries=3,
                                 **FAST)
        assert sent == 0 and len(hook.posts) == 3  # three tries, each refused
    shown = client.get(f"/api/schedules/{schedule_id}").json()
    assert shown["webhook_status"] == "failed"
    assert shown["webhook_error"].startswith(f"HTTP 502 from {hook.url}")
    # the receiver gone: a connection error, stored the same way; nothing re-sent
    assert alert_after_sweep(session_factory=session_factory, sweep_id=sweeps[-1]) == 0
    with session_factory() as session:
        assert {a.status for a in session.scalars(select(RegressionAlert))} == {"failed"}


@pytest.mark.timeout(60)
def test_a_steady_schedule_posts_nothing(session_factory):
    with webhook_receiver() as hook:
        nightly_schedule(session_factory, webhook_url=hook.url)
        levels = {"shifted": nightly_levels(61, 12), "steady": nightly_levels(62, 12)}
        for night in range(12):
            (sweep_id,) = run_nights(session_factory, {k: v[night:night + 1]
                                                       for k, v in levels.items()}, first=night)
            assert alert_after_sweep(session_factory=session_factory, sweep_id=sweep_id) == 0
        assert hook.posts == []


@pytest.mark.slow  # a real sweep; by default: one POST per new regression, the scheduler firing: test_schedules
@pytest.mark.timeout(180)
def test_the_scheduler_alerts_after_a_real_sweep_without_waiting(local_ray, tmp_path):
    """Eight nights at a made-up 0.1 ms step, then two real nights fired by the ScheduleLoop
    on a controlled clock and run by the Scheduler on Ray: the real step is far slower, one
    POST names the first real night. The receiver fails the first try and the second comes
    2 s later: the sweep is finished before that, not held."""
    from service.core.config import Settings
    from service.db.engine import make_engine, make_session_factory, upgrade_database

    from .conftest import TINY_SWEEP

    url = f"sqlite:///{tmp_path / 'alerts.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    session_factory = make_session_factory(engine)
    settings = Settings(database_url=url, upgrade_on_start=False, scheduler_poll_s=0.2,
                        cpu_chips=4, spool_dir=str(tmp_path / "spool"))
    with webhook_receiver([503]) as hook:
        nightly_schedule(session_factory, webhook_url=hook.url, spec=TINY_SWEEP)
        run_nights(session_factory, {"shifted": [1e-4 * (1 + 0.01 * (n % 3)) for n in range(8)],
                                     "steady": []}, shifted="")
        try:
            with RealNights(session_factory, settings) as nights:
                nights.night(8)
                nights.night(9)
                finished = time.monotonic()
                (post, retried) = hook.wait_for(2, timeout_s=30)
                assert time.monotonic() - finished > 1.5  # the retry came after the end
        finally:
            engine.dispose()
    assert post["body"] == retried["body"]
    regression = next(r for r in retried["body"]["regressions"] if r["metric"] == "step_time_s")
    assert regression["relative_change"] > 10  # milliseconds, not 0.1 ms
    assert regression["first_run"]["sweep_name"].startswith("nightly 2026-11-09 02:00")

