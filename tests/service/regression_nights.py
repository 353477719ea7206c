"""Nights of a schedule for the regression tests: the real schedule fired by `fire_due` on a
clock the test sets (one due time a night), each sweep's trials recorded through the
database sink's own `record_result`, the sweep finished as the scheduler finishes it.

Levels are lognormal jitter around a step time (`nightly_levels`): realistic run-to-run noise
and, from night k on, a slowdown of known size.
"""

from __future__ import annotations

import datetime as dt

import numpy as np

from service.db import crud
from service.runs.db_sink import record_result
from service.runs.schedule_firing import fire_due
from service.runs.sweep_run import finish
from service.schemas.schedules import ScheduleCreate
from workers.result import TrialMetrics, TrialResult

FIRST_NIGHT = dt.datetime(2026, 11, 1, 2, 0, tzinfo=dt.UTC)
NIGHTLY = "0 2 * * *"
SPEC = {
    "name": "nightly", "frameworks": ["torch"], "modes": ["all_gather"], "chips": [1],
    "seq_lens": [64, 128], "model": {"preset": "tiny", "num_layers": 1}, "steps": 3,
    "warmup_steps": 1, "accelerator": {"kind": "cpu", "type": "cpu"}, "repeats": 2,
}
"""Two series (seq_len 64 and 128), each point run twice a night."""


def nightly_schedule(session_factory, *, name: str = "nightly", webhook_url: str | None = None,
                     spec: dict | None = None) -> int:
    """A schedule due at 02:00 UTC every night from FIRST_NIGHT on; its id."""
    with session_factory() as session:
        return crud.create_schedule(session=session, **ScheduleCreate(
            name=name, cron=NIGHTLY, spec={**(spec or SPEC), "name": name},
            webhook_url=webhook_url).columns(), now=FIRST_NIGHT - dt.timedelta(hours=1)).id


def fire_night(session_factory, night: int) -> int:
    """Fire night `night` (0, 1, …) of every due schedule; the one sweep it created."""
    fired = fire_due(session_factory=session_factory,
                     now=FIRST_NIGHT + dt.timedelta(days=night, seconds=30))
    (created,) = [f for f in fired if f.sweep_id is not None]
    return created.sweep_id


def record_night(session_factory, sweep_id: int, step_time_s, *, memory_bytes: int = 1 << 30,
                 jitter: float = 0.01, gdn_kernel_of=lambda key: None) -> None:
    """Every trial of the sweep succeeded at `step_time_s(key)` (its repeats a `jitter`
    apart, each with a measured-step spread), its GDN kernel stored as `gdn_kernel_of(key)`,
    then the sweep is finished."""
    with session_factory() as session:
        trials = crud.sweep_trials(session=session, sweep_id=sweep_id)
    for trial in trials:
        step = step_time_s(trial.key) * (1 + jitter * trial.repeat)
        tokens = trial.batch_size * trial.seq_len / step / trial.chips
        record_result(session_factory=session_factory, sweep_id=sweep_id, result=TrialResult(
            trial=trial, status="succeeded", attempts=1, metrics=TrialMetrics(
                step_time_s=step, step_time_min_s=step * 0.99, step_time_max_s=step * 1.01,
                measured_steps=3, tokens_per_s_per_chip=tokens,
                peak_memory_bytes_per_chip=memory_bytes, gdn_kernel=gdn_kernel_of(trial.key))))
    with session_factory() as session:
        assert finish(session=session, sweep_id=sweep_id, status="finished")


def nightly_levels(seed: int, nights: int, *, level_s: float = 0.05, sigma: float = 0.03,
                   slowdown_from: int | None = None, factor: float = 1.0) -> list[float]:
    """Step times: lognormal jitter (σ of its log `sigma`) around `level_s`, × `factor` from
    night `slowdown_from` on."""
    jitter = np.exp(np.random.default_rng(seed).normal(0.0, sigma, nights))
    return [float(level_s * j * (factor if slowdown_from is not None and n >= slowdown_from
                                 else 1.0)) for n, j in enumerate(jitter)]


def run_nights(session_factory, levels: dict[str, list[float]], *, first: int = 0,
               shifted: str = "seq_len=64", gdn_kernel_of=lambda key: None) -> list[int]:
    """Fire and record one night per level from night `first` on: trials whose key holds
    `shifted` take `levels['shifted']`, the others `levels['steady']`; the sweep ids."""
    sweep_ids = []
    for i in range(len(levels["shifted"])):
        sweep_id = fire_night(session_factory, first + i)
        record_night(session_factory, sweep_id, lambda key, i=i: levels[
            "shifted" if shifted in key else "steady"][i], gdn_kernel_of=gdn_kernel_of)
        sweep_ids.append(sweep_id)
    return sweep_ids


class RealNights:
    """The real ScheduleLoop on a clock the test sets, waking the real Scheduler, which runs
    each night's sweep on Ray (use as a context manager: the scheduler stops at the end)."""

    def __init__(self, session_factory, settings) -> None:
        from service.runs.schedule_firing import ScheduleLoop
        from service.runs.sweep_queue import Scheduler

        self.session_factory = session_factory
        self.clock = FIRST_NIGHT
        self.scheduler = Scheduler(session_factory=session_factory, settings=settings)
        self.loop = ScheduleLoop(session_factory=session_factory, settings=settings,
                                 clock=lambda: self.clock,
                                 on_created=lambda _: self.scheduler.wake())

    def __enter__(self) -> RealNights:
        self.scheduler.start()
        return self

    def __exit__(self, *exc) -> None:
        assert self.scheduler.stop(60), "the scheduler did not stop"

    def night(self, night: int, timeout_s: float = 120.0) -> int:
        """Fire night `night` and wait until its sweep has finished; the sweep's id."""
        import time

        from sqlalchemy import select

        from service.db.models import Sweep

        self.clock = FIRST_NIGHT + dt.timedelta(days=night, seconds=30)
        (fired,) = self.loop.tick()
        deadline = time.monotonic() + timeout_s
        while True:
            with self.session_factory() as session:
                status = session.scalar(select(Sweep.status).where(Sweep.id == fired.sweep_id))
            if status == "finished":
                return fired.sweep_id
            assert status in ("queued", "running"), f"sweep {fired.sweep_id}: {status}"
            assert time.monotonic() < deadline, f"night {night}'s sweep did not finish"
            time.sleep(0.1)
