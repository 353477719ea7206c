"""Put finished trials in a test database the way the scheduler does (crud + the sink)."""

from __future__ import annotations

import datetime as dt

from gdn_core.interpreted_kernels import INTERPRETED_SUFFIX
from service.db import crud
from service.runs.db_sink import record_result
from workers.grid import expand_trials
from workers.result import AttemptRecord, TrialMetrics, TrialResult
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP


def seed_sweep(session_factory, *, status_of=lambda t: "succeeded", attempts_of=lambda t: 1,
               speed_of=lambda t: 1.0, step_time_of=lambda t: 0.01 * t.chips,
               interpreted_of=lambda t: False, **changes) -> int:
    """Create a sweep and give every runnable trial a result with made-up, traceable metrics:
    tokens/s/chip = (seq_len / (chips / dp) + (100 for p2p) + repeat) × speed_of(trial)
    (default 1; seq_len / (chips / dp): the tokens of a replica's CP chip),
    hardware FLOPs per step = 1e6 × seq_len, mfu = chips / 100; steps spread
    ±10% around the median; JAX trials carry an XLA estimate of twice the measured peak, every
    trial a prediction of 1.5 times it; the median step takes step_time_of(trial) seconds
    (default 0.01 × chips). `attempts_of(trial)` attempts each (default 1), attempt
    k on host h<k>: the ones before the last timed out. Where `interpreted_of(trial)`, its
    kernel names end " (interpreted)", as a fused run through the kernels' interpreters
    stores them."""
    spec = SweepSpec.model_validate({**TINY_SWEEP, **changes})
    with session_factory() as session:
        sweep_id = crud.create_sweep(session=session, sweep_create=spec).id
    for trial in expand_trials(spec):
        if trial.skip_reason is not None:
            continue
        status = status_of(trial)
        metrics = TrialMetrics()
        if status == "succeeded":
            step = step_time_of(trial)
            measured = trial.seq_len * 1000
            marked = INTERPRETED_SUFFIX if interpreted_of(trial) else ""
            metrics = TrialMetrics(
                tokens_per_s_per_chip=(trial.seq_len * trial.dp / trial.chips
                                       + (100 if trial.mode == "p2p" else 0) + trial.repeat)
                * speed_of(trial), hardware_flops_per_step=1e6 * trial.seq_len,
                step_time_s=step, step_time_min_s=0.9 * step, step_time_max_s=1.1 * step,
                measured_steps=trial.steps, compile_time_s=2.0 if trial.framework == "jax" else 0,
                peak_flops_dtype=trial.dtype, device_name="seed cpu",
                gdn_kernel=f"seed {trial.kernels} {trial.framework} gdn{marked}",
                attention_kernel=(f"seed {trial.kernels} {trial.framework} attention{marked}"
                                  if trial.layers == "hybrid" else None),
                mfu=trial.chips / 100, hfu=trial.chips / 90,
                peak_memory_bytes_per_chip=measured, memory_source="process_rss_hwm",
                estimated_memory_bytes_per_chip=2 * measured if trial.framework == "jax" else None,
                estimated_memory_source="xla_memory_analysis" if trial.framework == "jax" else None,
                predicted_memory_bytes_per_chip=int(1.5 * measured),
                comm_bytes_per_step_per_chip=trial.chips * 10,
                cp_comm_bytes_per_step_per_chip=trial.chips * 6,
                grad_sync_bytes_per_step_per_chip=trial.chips * 4, loss_first=5.5, loss_last=5.0)
        error = None if status == "succeeded" else "boom"
        at = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
        attempts = attempts_of(trial)
        history = [AttemptRecord(attempt=k, status=status if k == attempts else "timeout",
                                 reason=error if k == attempts else f"attempt {k} timed out",
                                 hosts=[f"h{k}"], started_at=at + dt.timedelta(minutes=k),
                                 finished_at=at + dt.timedelta(minutes=k))
                   for k in range(1, attempts + 1)]
        record_result(session_factory=session_factory, sweep_id=sweep_id, result=TrialResult(
            trial=trial, status=status, metrics=metrics, attempts=attempts,
            hosts=[f"h{attempts}"], attempt_history=history, versions={"torch": "2.13.0"},
            error=error))
    return sweep_id
