"""Put finished trials in a test database the way the scheduler does (crud + the sink)."""

from __future__ import annotations

from service import crud
from service.sink import record_result
from workers.result import TrialMetrics, TrialResult
from workers.spec import SweepSpec, expand_trials

from .conftest import TINY_SWEEP


def seed_sweep(session_factory, *, status_of=lambda t: "succeeded", **changes) -> int:
    """Create a sweep and give every runnable trial a result with made-up, traceable metrics:
    tokens/s/chip = seq_len / chips + (100 for p2p), mfu = chips / 100."""
    spec = SweepSpec.model_validate({**TINY_SWEEP, **changes})
    with session_factory() as session:
        sweep_id = crud.create_sweep(session=session, sweep_create=spec).id
    for trial in expand_trials(spec):
        if trial.skip_reason is not None:
            continue
        status = status_of(trial)
        metrics = TrialMetrics()
        if status == "succeeded":
            metrics = TrialMetrics(
                tokens_per_s_per_chip=trial.seq_len / trial.chips + (100 if trial.mode == "p2p"
                                                                    else 0),
                step_time_s=0.01 * trial.chips, mfu=trial.chips / 100, hfu=trial.chips / 90,
                peak_memory_bytes_per_chip=trial.seq_len * 1000, memory_source="rss",
                comm_bytes_per_step_per_chip=trial.chips * 10,
                cp_comm_bytes_per_step_per_chip=trial.chips * 6,
                grad_sync_bytes_per_step_per_chip=trial.chips * 4, loss_first=5.5, loss_last=5.0)
        record_result(session_factory=session_factory, sweep_id=sweep_id, result=TrialResult(
            trial=trial, status=status, metrics=metrics, attempts=1, hosts=["h1"],
            versions={"torch": "2.13.0"}, error=None if status == "succeeded" else "boom"))
    return sweep_id
