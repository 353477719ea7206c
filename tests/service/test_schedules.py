"""Schedules fired with an injected clock (service/runs/schedule_firing.py, core/cron.py): one
sweep per due time on SQLite and PostgreSQL, whatever the number of schedulers, restarts and
outages; missed ticks fire once; paused and overlapping ticks create none; cron read in the
schedule's IANA zone, DST included."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

import pytest
from alembic import command
from sqlalchemy import func, select, text

from service.core.config import Settings
from service.core.cron import check_cron, latest_due, next_due
from service.db import crud
from service.db.engine import alembic_config, make_engine, make_session_factory
from service.db.errors import is_transient
from service.db.models import Schedule, ScheduleRun, Sweep, Trial
from service.runs.schedule_firing import ScheduleLoop, fire_due, sweep_name
from service.schemas.schedules import SchedulePublic, ScheduleCreate, ScheduleUpdate
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP

UTC = dt.UTC
T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
"""Winter: Europe/Berlin is UTC+1 (CET)."""
SKIPPED_ONLY = {**TINY_SWEEP, "name": "skip", "modes": ["p2p"], "chips": [2], "seq_lens": [63]}
"""Its one trial is recorded skipped (63 tokens do not split over 2 chips): nothing runs."""


@pytest.fixture
def factory(db_url):
    engine = make_engine(db_url)
    yield make_session_factory(engine)
    engine.dispose()


def add_schedule(factory, *, cron="0 2 * * *", timezone="UTC", now=T0, spec=SKIPPED_ONLY,
                 **fields) -> int:
    with factory() as session:
        return crud.create_schedule(session=session, now=now, **ScheduleCreate(
            name="nightly", cron=cron, timezone=timezone, spec=SweepSpec(**spec),
            **fields).columns()).id


def counts(factory) -> tuple[int, int]:
    """(sweeps, schedule runs) in the database."""
    with factory() as session:
        return (session.scalar(select(func.count()).select_from(Sweep)),
                session.scalar(select(func.count()).select_from(ScheduleRun)))


def schedule_row(factory, schedule_id: int) -> Schedule:
    with factory() as session:
        return session.get(Schedule, schedule_id)


def as_utc(value: dt.datetime | None) -> dt.datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


# --- cron in a time zone (no database) ---

def test_nightly_berlin_job_fires_at_0100_utc_in_winter_and_0000_in_summer():
    assert next_due("0 2 * * *", "Europe/Berlin", T0) == dt.datetime(2026, 12, 2, 1, 0,
                                                                      tzinfo=UTC)
    summer = dt.datetime(2026, 7, 1, 12, tzinfo=UTC)
    assert next_due("0 2 * * *", "Europe/Berlin", summer) == dt.datetime(2026, 7, 2, 0, 0,
                                                                         tzinfo=UTC)


def test_dst_gap_fires_once_after_it_and_the_fold_once_for_fixed_hours():
    def ticks(cron, start, n):
        out = [next_due(cron, "Europe/Berlin", start)]
        while len(out) < n:
            out.append(next_due(cron, "Europe/Berlin", out[-1]))
        return out

    # 2026-03-29: 02:00 CET → 03:00 CEST. 02:30 does not exist: that night's tick is 03:00
    # CEST (01:00 UTC), once; the nights around it are 02:30 local.
    assert ticks("30 2 * * *", dt.datetime(2026, 3, 28, 12, tzinfo=UTC), 2) == [
        dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC), dt.datetime(2026, 3, 30, 0, 30, tzinfo=UTC)]
    # 2026-10-25: 03:00 CEST → 02:00 CET. 02:30 happens twice: a nightly job fires once
    # (the first), an hourly one every real hour (no hour lost or doubled).
    assert ticks("30 2 * * *", dt.datetime(2026, 10, 24, 12, tzinfo=UTC), 2) == [
        dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC), dt.datetime(2026, 10, 26, 1, 30, tzinfo=UTC)]
    hourly = ticks("0 * * * *", dt.datetime(2026, 10, 24, 23, 30, tzinfo=UTC), 4)
    assert [t.hour for t in hourly] == [0, 1, 2, 3]
    # the latest due time agrees with the next ones, across both changes
    for cron, start in (("30 2 * * *", dt.datetime(2026, 3, 28, tzinfo=UTC)),
                        ("30 2 * * *", dt.datetime(2026, 10, 24, tzinfo=UTC)),
                        ("*/20 * * * *", dt.datetime(2026, 10, 24, 23, tzinfo=UTC))):
        for due in ticks(cron, start, 6):
            assert latest_due(cron, "Europe/Berlin", due) == due
            assert latest_due(cron, "Europe/Berlin", due + dt.timedelta(seconds=59)) == due


@pytest.mark.parametrize("cron", ["0 2 * *", "* * * * * *", "61 * * * *", "0 0 31 2 *", ""])
def test_bad_cron_is_refused_naming_it_and_the_form(cron):
    with pytest.raises(ValueError, match="five fields") as refused:
        check_cron(cron)
    assert repr(cron) in str(refused.value)


def test_sweep_name_is_the_due_time_in_the_zone_and_fits_the_column():
    due = dt.datetime(2026, 12, 3, 1, 0, tzinfo=UTC)
    assert sweep_name("nightly", due, "Europe/Berlin") == "nightly 2026-12-03 02:00 CET"
    assert sweep_name("n", due, "UTC") == "n 2026-12-03 01:00 UTC"
    long = sweep_name("x" * 200, due, "UTC")
    assert len(long) == 200 and long.endswith(" 2026-12-03 01:00 UTC")


# --- firing, on both databases ---

def test_a_due_schedule_creates_one_sweep_named_for_its_due_time(factory):
    schedule_id = add_schedule(factory, timezone="Europe/Berlin")
    due = dt.datetime(2026, 12, 2, 1, 0, tzinfo=UTC)  # 02:00 CET
    assert as_utc(schedule_row(factory, schedule_id).next_run_at) == due
    assert fire_due(session_factory=factory, now=due - dt.timedelta(seconds=1)) == []
    (fired,) = fire_due(session_factory=factory, now=due + dt.timedelta(seconds=3))
    assert (fired.outcome, fired.due_at) == ("created", due)
    assert fire_due(session_factory=factory, now=due + dt.timedelta(seconds=4)) == []
    with factory() as session:
        sweep = session.get(Sweep, fired.sweep_id)
        assert (sweep.name, sweep.status, sweep.schedule_id) == (
            "skip 2026-12-02 02:00 CET", "queued", schedule_id)
        assert sweep.spec["name"] == sweep.name
        trials = session.scalars(select(Trial).where(Trial.sweep_id == sweep.id)).all()
        assert [t.status for t in trials] == ["skipped"]
        (shown,) = SchedulePublic.from_rows(
            [session.get(Schedule, schedule_id)],
            crud.schedule_activity(session=session, schedule_ids=[schedule_id]))
    assert as_utc(shown.last_run_at) == due and shown.sweeps_created == 1
    assert shown.next_run_at == due + dt.timedelta(days=1)
    assert [(r.outcome, r.sweep_id) for r in shown.runs] == [("created", fired.sweep_id)]
    assert counts(factory) == (1, 1)


def test_two_schedulers_on_one_database_create_one_sweep_per_due_time(db_url, factory):
    # Two loops, each with its own engine (as two processes have), tick at the same instant,
    # released together, for five due times of a minutely schedule (overlap allowed: every
    # due time makes a sweep, so a second one for any of them would show).
    schedule_id = add_schedule(factory, cron="* * * * *", allow_overlap=True)
    engines = [make_engine(db_url) for _ in range(2)]
    clock = {"now": T0}
    loops = [ScheduleLoop(session_factory=make_session_factory(e), settings=Settings(
        database_url=db_url), clock=lambda: clock["now"]) for e in engines]
    fired: list = []
    try:
        for minute in range(1, 6):
            clock["now"] = T0 + dt.timedelta(minutes=minute, seconds=1)
            barrier = threading.Barrier(2)

            def tick(loop):
                barrier.wait()
                for _ in range(50):  # SQLite may answer "database is locked": poll again
                    try:
                        fired.extend(loop.tick())
                        return
                    except Exception as err:
                        if not is_transient(err):
                            raise
                        time.sleep(0.05)

            threads = [threading.Thread(target=tick, args=(loop,)) for loop in loops]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
    finally:
        for engine in engines:
            engine.dispose()
    assert sorted(f.due_at for f in fired) == [T0 + dt.timedelta(minutes=m) for m in range(1, 6)]
    assert {f.outcome for f in fired} == {"created"}
    assert counts(factory) == (5, 5)
    with factory() as session:
        names = session.scalars(select(Sweep.name).where(Sweep.schedule_id == schedule_id)
                                .order_by(Sweep.name)).all()
    assert names == [f"skip 2026-12-01 12:0{m} UTC" for m in range(1, 6)]


def test_a_restart_after_missed_ticks_fires_once_for_the_latest(factory):
    schedule_id = add_schedule(factory, cron="*/10 * * * *")
    # down from 12:00 to 13:05: six ticks missed (12:10 … 13:00); one sweep, for 13:00
    (fired,) = fire_due(session_factory=factory, now=T0 + dt.timedelta(minutes=65))
    assert (fired.outcome, fired.due_at) == ("created", T0 + dt.timedelta(hours=1))
    assert counts(factory) == (1, 1)
    assert as_utc(schedule_row(factory, schedule_id).next_run_at) == T0 + dt.timedelta(
        minutes=70)


def test_paused_creates_nothing_and_resume_skips_what_was_missed(factory):
    schedule_id = add_schedule(factory, cron="*/10 * * * *", paused=True)
    assert schedule_row(factory, schedule_id).next_run_at is None
    assert fire_due(session_factory=factory, now=T0 + dt.timedelta(days=3)) == []
    with factory() as session:
        crud.update_schedule(session=session, schedule=session.get(Schedule, schedule_id),
                             changes=ScheduleUpdate(paused=False).changes(),
                             now=T0 + dt.timedelta(hours=5, minutes=1))
    assert fire_due(session_factory=factory, now=T0 + dt.timedelta(hours=5, minutes=2)) == []
    (fired,) = fire_due(session_factory=factory, now=T0 + dt.timedelta(hours=5, minutes=10))
    assert fired.due_at == T0 + dt.timedelta(hours=5, minutes=10)
    assert counts(factory) == (1, 1)


@pytest.mark.parametrize("allow_overlap", [False, True])
def test_a_tick_while_the_last_sweep_runs_is_skipped_unless_overlap_is_allowed(
        factory, allow_overlap):
    add_schedule(factory, cron="0 * * * *", allow_overlap=allow_overlap)
    (first,) = fire_due(session_factory=factory, now=T0 + dt.timedelta(hours=1))
    with factory() as session:
        session.get(Sweep, first.sweep_id).status = "running"
        session.commit()
    (second,) = fire_due(session_factory=factory, now=T0 + dt.timedelta(hours=2))
    assert second.outcome == ("created" if allow_overlap else "skipped_overlap")
    assert (second.sweep_id is None) != allow_overlap
    with factory() as session:
        session.execute(text("UPDATE sweeps SET status = 'finished'"))
        session.commit()
    (third,) = fire_due(session_factory=factory, now=T0 + dt.timedelta(hours=3))
    assert third.outcome == "created"
    assert counts(factory) == (3 if allow_overlap else 2, 3)


def test_a_failed_write_leaves_neither_claim_nor_sweep(factory):
    # The transaction dies at its commit (as when the database goes away there): no claim,
    # no sweep, no half of either; the next poll fires the same due time once.
    add_schedule(factory)
    due = dt.datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
    failing = make_session_factory(factory.kw["bind"])

    def broken_commit():
        from sqlalchemy.exc import OperationalError

        raise OperationalError("COMMIT", {}, Exception("server closed the connection"))

    def session_that_fails_to_commit():
        session = failing()
        session.commit = broken_commit
        return session

    with pytest.raises(Exception) as failed:
        fire_due(session_factory=session_that_fails_to_commit, now=due)
    assert is_transient(failed.value)
    assert counts(factory) == (0, 0)
    (fired,) = fire_due(session_factory=factory, now=due)
    assert fired.outcome == "created" and counts(factory) == (1, 1)


def test_a_spec_that_no_longer_makes_a_sweep_records_the_tick_failed(factory):
    schedule_id = add_schedule(factory)
    with factory() as session:  # as if a preset was renamed since the schedule was saved
        session.get(Schedule, schedule_id).spec = {**SKIPPED_ONLY, "model": {"preset": "gone"}}
        session.commit()
    (fired,) = fire_due(session_factory=factory, now=T0 + dt.timedelta(days=1))
    assert fired.outcome == "failed" and "gone" in fired.error and fired.sweep_id is None
    assert counts(factory) == (0, 1)
    assert schedule_row(factory, schedule_id).next_run_at is not None


# --- the thread ---

@pytest.mark.timeout(60)
def test_the_loop_fires_in_its_thread_wakes_the_scheduler_and_stops(db_url, factory):
    add_schedule(factory, cron="*/5 * * * *")
    woken = []
    clock = {"now": T0}
    loop = ScheduleLoop(session_factory=factory, on_created=woken.append,
                        clock=lambda: clock["now"],
                        settings=Settings(database_url=db_url, schedule_poll_s=0.05))
    loop.start()
    try:
        time.sleep(0.3)
        assert counts(factory) == (0, 0)
        clock["now"] = T0 + dt.timedelta(minutes=5)
        deadline = time.monotonic() + 20
        while counts(factory) != (1, 1):
            assert time.monotonic() < deadline, "the loop did not fire"
            time.sleep(0.05)
        time.sleep(0.3)  # more polls at the same instant fire nothing more
        assert counts(factory) == (1, 1) and len(woken) == 1
    finally:
        assert loop.stop(timeout_s=5)


@pytest.mark.timeout(120)
def test_the_loop_survives_a_database_outage_and_fires_once_it_is_back(caplog):
    from .private_postgres import PrivatePostgres

    with PrivatePostgres() as pg:
        from service.db.engine import upgrade_database

        upgrade_database(pg.url)
        engine = make_engine(pg.url)
        factory = make_session_factory(engine)
        add_schedule(factory, cron="*/5 * * * *")
        loop = ScheduleLoop(session_factory=factory, clock=lambda: T0 + dt.timedelta(minutes=5),
                            settings=Settings(database_url=pg.url, schedule_poll_s=0.1))
        pg.stop()
        caplog.set_level(logging.WARNING, logger="service.runs.schedule_firing")
        loop.start()
        try:
            deadline = time.monotonic() + 30
            while "database unavailable" not in caplog.text:
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.1)
            assert loop.join(0) is False  # still running
            pg.start()
            deadline = time.monotonic() + 30
            while True:
                try:
                    if counts(factory) == (1, 1):
                        break
                except Exception as err:  # noqa: BLE001 - the pool reconnecting
                    assert is_transient(err)
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.1)
        finally:
            assert loop.stop(timeout_s=15)
            engine.dispose()
        assert "Traceback" not in caplog.text


def test_0007_keeps_existing_sweeps_and_trials_both_ways(tmp_path):
    # SQLite rebuilds `sweeps` to add schedule_id: its trials and results must survive that.
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0006_plan_trials")
    engine = make_engine(url)
    with engine.begin() as conn:  # rows as 0006 wrote them (today's models have schedule_id)
        conn.execute(text("INSERT INTO sweeps (id, name, status, spec, trials_total, "
                          "trials_skipped, created_at) VALUES (1, 'old', 'finished', '{}', 1, "
                          "0, '2026-01-01')"))
        conn.execute(text(
            "INSERT INTO trials (id, sweep_id, key, framework, mode, chips, seq_len, batch_size, "
            "preset, num_layers, vocab_size, dtype, steps, warmup_steps, accelerator_kind, "
            "accelerator_type, verify, timeout_s, status, created_at) VALUES (1, 1, 'k', "
            "'torch', 'p2p', 2, 256, 1, 'tiny', 2, 256, 'float32', 3, 1, 'cpu', 'cpu', 0, 600, "
            "'succeeded', '2026-01-01')"))
        conn.execute(text(
            "INSERT INTO results (trial_id, sweep_id, framework, mode, chips, seq_len, "
            "batch_size, preset, num_layers, dtype, accelerator_kind, accelerator_type, status, "
            "attempts, hosts, versions) VALUES (1, 1, 'torch', 'p2p', 2, 256, 1, 'tiny', 2, "
            "'float32', 'cpu', 'cpu', 'succeeded', 1, '[]', '{}')"))
    engine.dispose()
    sweep_id = 1

    def rows():
        engine = make_engine(url)
        with engine.connect() as conn:
            found = tuple(conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar()
                          for table in ("sweeps", "trials", "results"))
        engine.dispose()
        return found

    assert rows() == (1, 1, 1)
    command.upgrade(alembic_config(url), "head")
    assert rows() == (1, 1, 1)
    engine = make_engine(url)
    with make_session_factory(engine)() as session:
        assert session.get(Sweep, sweep_id).schedule_id is None
    engine.dispose()
    command.downgrade(alembic_config(url), "0006_plan_trials")
    assert rows() == (1, 1, 1)
