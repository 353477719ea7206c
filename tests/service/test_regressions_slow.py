"""The whole path with real trials, slow tier: a schedule fired night after night by the real
ScheduleLoop on a controlled clock, each night's sweep run by the real Scheduler on Ray; from
night 6 on the schedule's spec trains 4 layers instead of 1 (a real setting, the trial key
unchanged). The regression of step time is found at night 6 with the size the real runs
show, the webhook (a local HTTP server) gets exactly one POST per regression, and a steady
schedule's twelve real nights report no shift of step time or tokens/s."""

from __future__ import annotations

import math
import statistics
import time

import pytest

from service.db import crud
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.regressions.report import regressions_report
from service.schemas.schedules import ScheduleUpdate
from workers.sweep_spec import SweepSpec

from .regression_nights import RealNights, nightly_schedule
from .webhook_receiver import webhook_receiver

SPEC = {"name": "nightly", "frameworks": ["torch"], "modes": ["all_gather"], "chips": [1],
        "seq_lens": [256], "model": {"preset": "tiny", "num_layers": 1}, "steps": 4,
        "warmup_steps": 1, "accelerator": {"kind": "cpu", "type": "cpu"}}
NIGHTS, DEEPER_FROM = 12, 6


@pytest.fixture
def real_db(tmp_path):
    from service.core.config import Settings

    url = f"sqlite:///{tmp_path / 'nights.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    settings = Settings(database_url=url, upgrade_on_start=False, scheduler_poll_s=0.2,
                        cpu_chips=4, spool_dir=str(tmp_path / "spool"))
    yield make_session_factory(engine), settings
    engine.dispose()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_four_layers_from_night_6_is_one_regression_at_night_6(local_ray, real_db):
    session_factory, settings = real_db
    with webhook_receiver() as hook:
        schedule_id = nightly_schedule(session_factory, webhook_url=hook.url, spec=SPEC)
        with RealNights(session_factory, settings) as nights:
            sweeps = []
            for night in range(NIGHTS):
                if night == DEEPER_FROM:
                    deeper = SweepSpec.model_validate({**SPEC, "model": {"preset": "tiny",
                                                                         "num_layers": 4}})
                    with session_factory() as session:
                        crud.update_schedule(session=session, schedule=crud.get_schedule(
                            session=session, schedule_id=schedule_id),
                            changes=ScheduleUpdate(spec=deeper).changes())
                sweeps.append(nights.night(night))
            hook.wait_for(1, timeout_s=60)
        time.sleep(2)  # any later POST (none expected) has arrived
        posts = list(hook.posts)
    with session_factory() as session:
        report = regressions_report(session=session, schedule_ids=[schedule_id])
    step = next(r for r in report.data if r.metric == "step_time_s")
    assert step.first_run.sweep_id == sweeps[DEEPER_FROM]
    # each level the median of its runs (in log space, as the detector takes the series)
    logs = [math.log(p.value) for p in step.points]
    measured = math.exp(statistics.median(logs[DEEPER_FROM:])
                        - statistics.median(logs[:DEEPER_FROM])) - 1
    assert step.relative_change == pytest.approx(measured, rel=1e-9)
    assert step.relative_change > 0.5  # 4 layers: far more than one's step
    # one POST per regression: the slowdown's (step time and tokens/s, with whatever the
    # memory did) in the POST of the night that confirmed it, and no regression twice
    sent = [(r["metric"], r["series"], r["first_run"]["sweep_id"])
            for p in posts for r in p["body"]["regressions"]]
    assert len(sent) == len(set(sent)), sent
    (post,) = [p for p in posts if any(r["metric"] == "step_time_s"
                                       for r in p["body"]["regressions"])]
    posted = {r["metric"]: r for r in post["body"]["regressions"]}
    assert posted["step_time_s"]["first_run"]["sweep_id"] == sweeps[DEEPER_FROM]
    assert posted["tokens_per_s_per_chip"]["first_run"]["sweep_id"] == sweeps[DEEPER_FROM]
    assert post["body"]["sweep"]["id"] == sweeps[DEEPER_FROM + 1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_twelve_unchanged_real_nights_report_no_shift(local_ray, real_db):
    session_factory, settings = real_db
    schedule_id = nightly_schedule(session_factory, spec=SPEC)
    with RealNights(session_factory, settings) as nights:
        for night in range(NIGHTS):
            nights.night(night)
    with session_factory() as session:
        report = regressions_report(session=session, schedule_ids=[schedule_id])
    assert report.series == 1
    # peak memory is the process RSS on CPU, which reused workers carry from night to night:
    # its shifts are real; step time and tokens/s must have none
    timing = {"step_time_s", "tokens_per_s_per_chip"}
    assert [r for r in report.data + report.improvements if r.metric in timing] == [], report
