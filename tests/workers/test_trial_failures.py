"""Failures are results: OOM, timeout, a killed rank (retried, or given up), and no leaks."""

from __future__ import annotations

import os
import signal
import time

import pytest

from workers.driver import run_sweep
from workers.events import TrialRetrying, TrialStarted
from workers.options import DriverOptions

from .conftest import MemorySink, assert_consistent_metrics, assert_no_leaks, tiny_spec


@pytest.mark.slow  # a fault run (4-12 s); a rank's OOM is `oom` by default:
# test_failures.py::test_rank_oom_is_oom_with_memory
@pytest.mark.timeout(180)
def test_out_of_memory_is_oom_and_the_sweep_goes_on(local_ray):
    # 64 × 8192 tokens make 512 MiB of fp32 logits (and as much again for their gradient):
    # past a 1 GiB address-space cap that 64 × 64 tokens fit in easily.
    # admit_over_memory: on a host under ~7 GiB the prediction would skip the point instead.
    spec = tiny_spec(batch_size=64, seq_lens=[64, 8192], admit_over_memory=True)
    options = DriverOptions(rank_memory_limit_bytes=1 << 30)
    results = run_sweep(spec, MemorySink(), options=options)
    small, big = sorted(results, key=lambda r: r.trial.seq_len)
    assert_consistent_metrics(small)
    assert big.status == "oom", big.error
    assert "memory" in big.error.lower() and "rank_memory_limit_bytes" in big.error
    assert big.metrics.peak_memory_bytes_per_chip > 0 and big.metrics.memory_source
    assert big.attempts == 1
    assert_no_leaks()


@pytest.mark.timeout(180)
def test_trial_past_its_timeout_is_timeout(local_ray):
    started = time.monotonic()
    (result,) = run_sweep(tiny_spec(steps=10_000, trial_timeout_s=3.0), MemorySink())
    assert result.status == "timeout" and "timeout_s=3" in result.error
    assert time.monotonic() - started < 90
    assert_no_leaks()


def _kill_rank(rank: int, attempts: set[int]):
    def on_event(event):
        if isinstance(event, TrialStarted) and event.attempt in attempts:
            os.kill(event.workers[rank].pid, signal.SIGKILL)
    return on_event


@pytest.mark.timeout(240)
def test_killed_rank_is_retried(local_ray):
    events = []

    def on_event(event):
        events.append(event)
        _kill_rank(1, {1})(event)

    (result,) = run_sweep(tiny_spec(chips=[2], steps=20), MemorySink(), on_event=on_event)
    assert_consistent_metrics(result)
    assert result.attempts == 2 and result.error is None
    # The first attempt's reason is kept in the history, beside the success that followed.
    first, second = result.attempt_history
    assert (first.attempt, first.status) == (1, "failed") and "died" in first.reason.lower()
    assert first.hosts and first.started_at <= first.finished_at <= second.started_at
    assert (second.attempt, second.status, second.reason) == (2, "succeeded", None)
    assert second.hosts == result.hosts and second.finished_at <= result.finished_at
    retry = [e for e in events if isinstance(e, TrialRetrying)]
    assert len(retry) == 1 and "died" in retry[0].error.lower()
    pids = [tuple(w.pid for w in e.workers) for e in events if isinstance(e, TrialStarted)]
    assert len(pids) == 2 and not set(pids[0]) & set(pids[1])  # fresh actors
    assert_no_leaks()


@pytest.mark.timeout(180)
def test_killed_rank_without_retries_left_fails(local_ray):
    options = DriverOptions(max_trial_retries=0)
    (result,) = run_sweep(tiny_spec(steps=20), MemorySink(), on_event=_kill_rank(0, {1}),
                          options=options)
    assert result.status == "failed" and result.attempts == 1
    assert "gave up after 1 attempt" in result.error and "max_trial_retries=0" in result.error
    (only,) = result.attempt_history
    assert only.status == "failed" and "died" in only.reason.lower()
    assert_no_leaks()
