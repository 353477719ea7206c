"""failures.classify and the errors that cross Ray processes (Ray's own exception classes)."""

from __future__ import annotations

import pickle

import pytest
from ray import exceptions as rex

from workers.errors import (ChipCapacityError, PlacementTimeoutError, RankOutOfMemoryError,
                            WorkerStartupError)
from workers.failures import TRACEBACK_TAIL_CHARS, classify, looks_like_oom, tail


def _task_error(cause: BaseException) -> rex.RayTaskError:
    return rex.RayTaskError("TorchRankActor.run", f"Traceback (most recent call last):\n  ...\n"
                            f"{type(cause).__name__}: {cause}", cause)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("error", [
    PlacementTimeoutError(4, {"cpu_chip": 1}, 2.0, 1.0, 8.0),
    WorkerStartupError("joining the process group", 30.0),
    RankOutOfMemoryError("rank 1: RuntimeError: can't allocate memory", 123, "process_rss_hwm",
                         1 << 30),
    ChipCapacityError(16, "cpu_chip", 8.0),
], ids=lambda e: type(e).__name__)
def test_errors_pickle_and_name_the_setting(error):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert any(word in str(error) for word in ("DriverOptions.", "cpu_chip", "--cpu-chips"))


@pytest.mark.timeout(30)
def test_rank_oom_is_oom_with_memory():
    cause = RankOutOfMemoryError("rank 0: RuntimeError: DefaultCPUAllocator: can't allocate "
                                 "memory", 5_000_000, "process_rss_hwm", 1 << 28)
    verdict = classify(_task_error(cause))
    assert (verdict.status, verdict.retry) == ("oom", False)
    assert verdict.peak_memory_bytes == 5_000_000 and verdict.memory_source == "process_rss_hwm"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cause, status", [
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
    (RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate"), "oom"),
    (MemoryError(), "oom"),
    (ValueError("mode='ulysses' needs key heads (2) divisible by chips=4"), "failed"),
], ids=["cuda", "xla", "python", "value-error"])
def test_exception_in_a_rank(cause, status):
    verdict = classify(_task_error(cause))
    assert (verdict.status, verdict.retry) == (status, False)
    assert str(cause).split(".")[0] in verdict.error  # message and traceback tail kept


@pytest.mark.timeout(30)
def test_dead_actor_is_retried_unless_memory_monitor_killed_it():
    assert classify(rex.ActorDiedError()).retry
    assert classify(rex.NodeDiedError("node 1 died")).retry
    killed = rex.OutOfMemoryError("1 worker(s) were killed due to the node running low on memory")
    assert (classify(killed).status, classify(killed).retry) == ("oom", False)


@pytest.mark.timeout(30)
def test_slow_start_is_retried():
    verdict = classify(WorkerStartupError("joining the process group", 30.0))
    assert (verdict.status, verdict.retry) == ("failed", True)
    assert "worker_start_timeout_s" in verdict.error


@pytest.mark.timeout(30)
def test_placement_timeout_is_failed_not_retried():
    verdict = classify(PlacementTimeoutError(4, {"cpu_chip": 1}, 2.0, 1.0, 8.0))
    assert (verdict.status, verdict.retry) == ("failed", False)
    assert "placement_timeout_s" in verdict.error


@pytest.mark.timeout(30)
def test_tail_keeps_the_end():
    text = "x" * 10_000 + "RuntimeError: the cause"
    assert tail(text).endswith("the cause") and len(tail(text)) <= TRACEBACK_TAIL_CHARS + 1
    assert looks_like_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not looks_like_oom(RuntimeError("shape mismatch"))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("wrapped", [True, False], ids=["from-a-rank", "in-the-driver"])
def test_a_kernel_refusal_inside_the_step_is_skipped_with_its_reason(wrapped):
    """KernelUnavailable raised by the running step (splash's segment rule, fla's own refusal)
    is the same verdict as the resolver's before the step: skipped, the reason kept whole,
    no retry; it survives the trip through Ray (pickles as itself)."""
    from gdn_core.kernels import KernelUnavailable

    reason = ("splash attention needs segments of a multiple of 128 tokens (its blocks, ≤ 512, "
              "divide them), got segment_len=96")
    cause = pickle.loads(pickle.dumps(KernelUnavailable(reason)))
    verdict = classify(_task_error(cause) if wrapped else cause)
    assert (verdict.status, verdict.retry, verdict.error) == ("skipped", False, reason)
    other = classify(_task_error(RuntimeError("segment_len=96 broke something")))
    assert other.status == "failed"
