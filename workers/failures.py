"""Turn what went wrong in a trial into a status: oom, skipped, failed, or retry (dead actor /
node).

A fused kernel that refuses the point from inside the step (KernelUnavailable: a shape only the
running step sees, a library's own refusal) makes the trial `skipped` with its reason, as the
resolver's refusal before the step does. Statuses of results, not exceptions of the driver: a
sweep always finishes.
"""

from __future__ import annotations

import dataclasses
import re

import ray
from ray import exceptions as rex

from gdn_core.kernels import KernelUnavailable

from .errors import (ChipCapacityError, PlacementTimeoutError, RankOutOfMemoryError,
                     WorkerStartupError)
from .process_probe import read_oom_kills

_OOM_TEXT = re.compile(
    r"out of memory|can't allocate memory|cannot allocate memory|RESOURCE_EXHAUSTED|"
    r"std::bad_alloc|OutOfMemoryError|running low on memory|MemoryError", re.IGNORECASE)
TRACEBACK_TAIL_CHARS = 2000
"""How much of a failure's message and traceback a result keeps (the end, where it matters)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FailureVerdict:
    """How a failed attempt ends: a final status, or another attempt."""

    status: str
    """'oom', 'skipped' (a kernel's refusal) or 'failed' (the status if no retry is left)."""
    retry: bool
    """True for a dead actor or node (infrastructure, not the trial's fault)."""
    error: str
    peak_memory_bytes: int | None = None
    memory_source: str | None = None


def looks_like_oom(exc: BaseException) -> bool:
    """Whether an exception (or its message) says memory ran out (torch, XLA, Python, Ray)."""
    return isinstance(exc, (MemoryError, rex.OutOfMemoryError)) or bool(
        _OOM_TEXT.search(f"{type(exc).__name__}: {exc}"))


def tail(text: str, limit: int = TRACEBACK_TAIL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]


def classify(exc: BaseException) -> FailureVerdict:
    """Map an exception from a trial attempt to a verdict (see the module docstring)."""
    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        if isinstance(cause, KernelUnavailable):
            return FailureVerdict(status="skipped", retry=False, error=str(cause))
        if isinstance(cause, RankOutOfMemoryError):
            return FailureVerdict(status="oom", retry=False, error=tail(str(cause)),
                                  peak_memory_bytes=cause.peak_memory_bytes,
                                  memory_source=cause.memory_source)
        # str(RayTaskError) carries the remote traceback; keep its end.
        status = "oom" if looks_like_oom(cause) else "failed"
        return FailureVerdict(status=status, retry=False, error=tail(str(exc)))
    if isinstance(exc, rex.OutOfMemoryError):  # Ray's memory monitor killed the worker
        return FailureVerdict(status="oom", retry=False, error=tail(str(exc)))
    if isinstance(exc, rex.RayActorError) and exc.actor_init_failed:
        status = "oom" if looks_like_oom(exc) else "failed"
        return FailureVerdict(status=status, retry=False, error=tail(str(exc)))
    if isinstance(exc, (rex.RayActorError, rex.NodeDiedError, rex.WorkerCrashedError,
                        rex.ObjectLostError, rex.LocalRayletDiedError)):
        if looks_like_oom(exc):
            return FailureVerdict(status="oom", retry=False, error=tail(str(exc)))
        return FailureVerdict(status="failed", retry=True, error=tail(str(exc)))
    if isinstance(exc, WorkerStartupError):  # slow or lost workers: infrastructure, retry
        return FailureVerdict(status="failed", retry=True, error=str(exc))
    if isinstance(exc, (PlacementTimeoutError, ChipCapacityError)):
        return FailureVerdict(status="failed", retry=False, error=str(exc))
    if isinstance(exc, KernelUnavailable):
        return FailureVerdict(status="skipped", retry=False, error=str(exc))
    status = "oom" if looks_like_oom(exc) else "failed"
    return FailureVerdict(status=status, retry=False,
                          error=tail(f"{type(exc).__name__}: {exc}"))


@ray.remote(num_cpus=0, max_retries=0)
def _read_oom_kills_task(path: str) -> int | None:
    return read_oom_kills(path)


def kernel_oom_kill_seen(node_id: str, counter_path: str | None, baseline: int | None, *,
                         timeout_s: float = 10.0) -> bool:
    """Whether the kernel OOM-killed something in a dead rank's memory cgroup since `baseline`.

    A SIGKILL from the kernel's OOM killer looks like any other dead actor to Ray; the
    cgroup's oom_kill counter, read on the rank's node, tells them apart.
    """
    if counter_path is None or baseline is None:
        return False
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ref = _read_oom_kills_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node_id=node_id, soft=False)).remote(counter_path)
    try:
        count = ray.get(ref, timeout=timeout_s)
    except Exception:  # noqa: BLE001 - node gone or busy: no evidence of an OOM kill
        ray.cancel(ref, force=True)
        return False
    return count is not None and count > baseline


__all__ = ["FailureVerdict", "TRACEBACK_TAIL_CHARS", "classify", "kernel_oom_kill_seen",
           "looks_like_oom", "tail"]
