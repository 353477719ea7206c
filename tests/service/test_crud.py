"""Data layer on SQLite and PostgreSQL: one result per trial, the planning views, sweep claims."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.exc import IntegrityError

from service.db import crud
from service.db.models import Result, Sweep, Trial, TrialAttempt, result_for, utcnow
from service.runs import sweep_run
from service.runs.db_sink import DatabaseSink, record_result
from workers.grid import expand_trials
from workers.result import AttemptRecord, TrialMetrics, TrialResult
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP
from .seed import seed_sweep


def make_sweep(session_factory, **changes) -> tuple[int, list]:
    spec = SweepSpec.model_validate({**TINY_SWEEP, **changes})
    with session_factory() as session:
        return crud.create_sweep(session=session, sweep_create=spec).id, expand_trials(spec)


def test_a_trial_keeps_its_first_result(session_factory):
    sweep_id, (trial,) = make_sweep(session_factory)
    sink = DatabaseSink(session_factory, sweep_id)
    sink.trial_started(trial)
    with session_factory() as s:
        assert s.scalar(select(Trial.status)) == "running"
    first = TrialResult(trial=trial, status="succeeded",
                        metrics=TrialMetrics(tokens_per_s_per_chip=10.0),
                        error="\x1b[36mray::Actor\x1b[39m fine")
    sink.trial_finished(first)
    assert sink.finished_keys() == {trial.key}
    second = TrialResult(trial=trial, status="failed", error="late duplicate")
    assert record_result(session_factory=session_factory, sweep_id=sweep_id,
                         result=second) is False
    with session_factory() as s:
        (result,) = s.scalars(select(Result)).all()
        assert (result.status, result.tokens_per_s_per_chip) == ("succeeded", 10.0)
        assert result.error == "ray::Actor fine"  # terminal colours stripped
        assert s.scalar(select(Trial.status)) == "succeeded"


def test_detached_sink_records_nothing(session_factory):
    sweep_id, (trial,) = make_sweep(session_factory)
    sink = DatabaseSink(session_factory, sweep_id)
    sink.detach()
    sink.trial_started(trial)
    sink.trial_finished(TrialResult(trial=trial, status="cancelled"))
    with session_factory() as s:
        assert s.scalar(select(Trial.status)) == "pending"
        assert s.scalar(select(func.count()).select_from(Result)) == 0


def test_a_sweeps_trials_are_read_from_its_rows_as_they_were_expanded(session_factory):
    """What a runner hands the driver: the expansion made when the sweep was created, read
    back from its rows (repeats, plans and skipped points included), in grid order."""
    sweep_id, trials = make_sweep(session_factory, frameworks=["jax"], kinds=["measure", "plan"],
                                  chips=[1, 2, 3], repeats=2)
    assert any(t.skip_reason for t in trials) and any(t.kind == "plan" for t in trials)
    with session_factory() as s:
        assert crud.sweep_trials(session=s, sweep_id=sweep_id) == trials


def test_a_sweep_is_created_from_the_trials_its_caller_expanded(session_factory):
    spec = SweepSpec.model_validate({**TINY_SWEEP, "seq_lens": [64, 128]})
    given = [t.model_copy(update={"timeout_s": 5.0}) for t in expand_trials(spec)]
    with session_factory() as s:
        sweep_id = crud.create_sweep(session=s, sweep_create=spec, trials=given).id
        assert crud.sweep_trials(session=s, sweep_id=sweep_id) == given


def test_constraints_refuse_a_second_result_or_grid_point(session_factory):
    sweep_id, _ = make_sweep(session_factory)
    with session_factory() as s:
        trial = s.scalars(select(Trial)).one()
        s.add(result_for(trial, status="succeeded"))
        s.commit()
        s.expunge_all()
        s.add(result_for(trial, status="failed"))
        with pytest.raises(IntegrityError):
            s.commit()
        s.rollback()
        dup = {c: getattr(trial, c) for c in ("framework", "mode", "chips", "seq_len",
               "batch_size", "preset", "num_layers", "vocab_size", "dtype", "steps",
               "warmup_steps", "accelerator_kind", "accelerator_type", "verify", "timeout_s")}
        s.add(Trial(sweep_id=sweep_id, key=trial.key, status="pending", created_at=utcnow(),
                    **dup))
        with pytest.raises(IntegrityError):
            s.commit()


def test_close_unfinished_gives_each_open_trial_one_result(session_factory):
    sweep_id, trials = make_sweep(session_factory, seq_lens=[64, 128, 192])
    record_result(session_factory=session_factory, sweep_id=sweep_id,
                  result=TrialResult(trial=trials[0], status="succeeded"))
    with session_factory() as s:
        assert crud.close_unfinished(session=s, sweep_id=sweep_id, status="cancelled",
                                     error="stop") == 2
        statuses = dict(s.execute(select(Trial.key, Result.status).join(Result)).all())
    assert sorted(statuses.values()) == ["cancelled", "cancelled", "succeeded"]


def test_capacity_planning_views(session_factory):
    seed_sweep(session_factory, modes=["all_gather", "p2p"], chips=[1, 2, 4],
               seq_lens=[64, 128, 256, 512],
               status_of=lambda t: "oom" if t.seq_len >= 256 and t.chips == 1 else "succeeded")
    with session_factory() as s:
        best = s.execute(text(
            "SELECT seq_len, mode, chips, tokens_per_s_per_chip FROM best_tokens_per_s_per_chip "
            "WHERE preset = 'tiny' AND accelerator_type = 'cpu' ORDER BY seq_len")).all()
        fit = s.execute(text(
            "SELECT mode, chips, max_seq_len_succeeded, min_seq_len_oom FROM max_seq_len_fit "
            "WHERE preset = 'tiny' ORDER BY mode, chips")).all()
    # tokens/s/chip = seq_len / chips + 100 for p2p (the one-chip baseline, mode none, has no
    # bonus): two p2p chips win everywhere
    assert [tuple(r) for r in best] == [(64, "p2p", 2, 132.0), (128, "p2p", 2, 164.0),
                                        (256, "p2p", 2, 228.0), (512, "p2p", 2, 356.0)]
    # chips=1 ran once per seq_len as the baseline: one row, mode none
    assert [tuple(r) for r in fit] == [
        ("all_gather", 2, 512, None), ("all_gather", 4, 512, None), ("none", 1, 128, 256),
        ("p2p", 2, 512, None), ("p2p", 4, 512, None)]
    with session_factory() as s:
        best = s.execute(text(
            "SELECT step_time_min_s, step_time_s, step_time_max_s, measured_steps, memory_source, "
            "estimated_memory_bytes_per_chip, predicted_memory_bytes_per_chip, device_name, "
            "peak_flops_dtype FROM best_tokens_per_s_per_chip WHERE seq_len = 64")).one()
        fit = s.execute(text(
            "SELECT max_peak_memory_bytes_per_chip, memory_source, "
            "max_estimated_memory_bytes_per_chip, max_predicted_memory_bytes_per_chip "
            "FROM max_seq_len_fit WHERE mode = 'p2p' AND chips = 2")).one()
    # a planner sees how spread the measurement is and which memory figure is which
    assert tuple(best) == pytest.approx((0.018, 0.02, 0.022, 1, "process_rss_hwm", None,
                                         96_000, "seed cpu", "float32"))
    assert tuple(fit) == (512_000, "process_rss_hwm", None, 768_000)


def test_claims_one_runner_at_a_time_and_resumes_running_trials(session_factory):
    sweep_id, trials = make_sweep(session_factory, seq_lens=[64, 128])
    a, b = "a@host-a:10:1", "b@host-b:20:2"  # runners on other hosts: alive as far as we know
    with session_factory() as s:
        assert sweep_run.next_sweep_id(session=s, lease_s=60) == sweep_id
        assert sweep_run.claim(session=s, sweep_id=sweep_id, runner_id=a, lease_s=60) == "running"
        s.execute(update(Trial).where(Trial.key == trials[0].key).values(status="running"))
        s.commit()
        # a live runner's sweep is not for others, nor for a second claim by the same name
        assert sweep_run.next_sweep_id(session=s, lease_s=60) is None
        assert sweep_run.claim(session=s, sweep_id=sweep_id, runner_id=b, lease_s=60) is None
        assert sweep_run.claim(session=s, sweep_id=sweep_id, runner_id=a, lease_s=60) is None
        assert sweep_run.heartbeat(session=s, sweep_id=sweep_id, runner_id=a) == "running"
        # a runner that stopped renewing loses the sweep after the lease; its running trial
        # re-runs
        s.execute(update(Sweep).values(heartbeat_at=utcnow() - dt.timedelta(seconds=120)))
        s.commit()
        assert sweep_run.next_sweep_id(session=s, lease_s=60) == sweep_id
        assert sweep_run.claim(session=s, sweep_id=sweep_id, runner_id=b, lease_s=60) == "running"
        assert set(s.scalars(select(Trial.status))) == {"pending"}
        assert sweep_run.heartbeat(session=s, sweep_id=sweep_id, runner_id=a) is None
        # a cancelling sweep whose runner vanished is taken only to be closed
        s.execute(update(Sweep).values(status="cancelling", heartbeat_at=None))
        s.commit()
        claimed = sweep_run.claim(session=s, sweep_id=sweep_id, runner_id=a, lease_s=60)
        assert claimed == "cancelling"
        sweep_run.finish(session=s, sweep_id=sweep_id, status="cancelled")
        sweep = s.get(Sweep, sweep_id)
        s.refresh(sweep)
        assert sweep.status == "cancelled" and sweep.finished_at is not None
        assert s.scalar(select(func.count()).select_from(Result)) == 2


def _attempts(session_factory) -> list[tuple]:
    with session_factory() as s:
        return [tuple(r) for r in s.execute(select(
            TrialAttempt.attempt, TrialAttempt.status, TrialAttempt.reason, TrialAttempt.hosts)
            .order_by(TrialAttempt.attempt))]


def test_attempts_are_stored_with_the_result_once(session_factory):
    sweep_id, (trial,) = make_sweep(session_factory)
    at = utcnow()
    retried = TrialResult(trial=trial, status="succeeded", attempts=2, attempt_history=[
        AttemptRecord(attempt=1, status="failed", reason="\x1b[31mActorDiedError\x1b[0m: rank 1",
                      hosts=["h1"], started_at=at, finished_at=at),
        AttemptRecord(attempt=2, status="succeeded", hosts=["h2"], started_at=at,
                      finished_at=at)])
    assert record_result(session_factory=session_factory, sweep_id=sweep_id, result=retried)
    expected = [(1, "failed", "ActorDiedError: rank 1", ["h1"]), (2, "succeeded", None, ["h2"])]
    assert _attempts(session_factory) == expected
    late = TrialResult(trial=trial, status="failed", attempts=1, attempt_history=[
        AttemptRecord(attempt=1, status="failed", reason="late duplicate")])
    assert record_result(session_factory=session_factory, sweep_id=sweep_id,
                         result=late) is False
    assert _attempts(session_factory) == expected  # kept with the first result


def test_a_retried_cancelled_trial_replaces_its_attempts(session_factory):
    sweep_id, (trial,) = make_sweep(session_factory)
    cancelled = TrialResult(trial=trial, status="cancelled", attempts=1, attempt_history=[
        AttemptRecord(attempt=1, status="cancelled", reason="sweep cancelled")])
    assert record_result(session_factory=session_factory, sweep_id=sweep_id, result=cancelled)
    rerun = TrialResult(trial=trial, status="succeeded", attempts=1, attempt_history=[
        AttemptRecord(attempt=1, status="succeeded", hosts=["h1"])])
    assert record_result(session_factory=session_factory, sweep_id=sweep_id, result=rerun)
    assert _attempts(session_factory) == [(1, "succeeded", None, ["h1"])]


def test_attempts_go_with_their_trial(session_factory):
    sweep_id, (trial,) = make_sweep(session_factory)
    record_result(session_factory=session_factory, sweep_id=sweep_id, result=TrialResult(
        trial=trial, status="failed", attempts=1,
        attempt_history=[AttemptRecord(attempt=1, status="failed", reason="x")]))
    with session_factory() as s:  # (core.db turns SQLite's foreign keys on)
        s.execute(text("DELETE FROM sweeps"))
        s.commit()
        assert s.scalar(select(func.count()).select_from(TrialAttempt)) == 0
