"""The timed loop of a torch training step, as jax_gdn.train.run_timed_steps is JAX's: warm-up
steps, then `steps` timed ones, each timed with the device synchronised; and the extra step a
profiler may wrap after them (the same callable, so it is the timed step, packed documents and
all). run_training (one chip) and cp.train.run_cp_training (every rank) both run it.

A kernel that refuses the point from inside a step (fla-core's own refusal of its gated
backward, raised as a RuntimeError where it runs: gdn_kernels.kernel_refusal) leaves the loop as
kernels.KernelUnavailable with that reason, so the trial is recorded `skipped`, not `failed`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .gdn_kernels import kernel_refusal


class TimedSteps(NamedTuple):
    """What run_timed_steps ran: each step's return value (warm-up included), the timed steps'
    wall times, and what measure_first's context gave for the first timed step (None
    without one)."""

    results: list
    step_times_s: list[float]
    first_timed: Any


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a CPU step has none left when it returns."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_step(step: Callable[[], Any]) -> Any:
    """step(), with a kernel's own refusal (kernel_refusal) raised as KernelUnavailable."""
    try:
        return step()
    except RuntimeError as error:
        refusal = kernel_refusal(error)
        if refusal is None:
            raise
        raise refusal from error


def run_timed_steps(step: Callable[[], Any], *, steps: int, warmup_steps: int,
                    device: torch.device, before_each: Callable[[], None] | None = None,
                    measure_first: Callable[[], contextlib.AbstractContextManager] | None = None
                    ) -> TimedSteps:
    """Run warmup_steps + steps calls of `step`; time the last `steps`.

    A step's time starts after before_each (e.g. a barrier, so ranks start together) and the
    device synchronised, and ends with the device synchronised. measure_first: a context
    (e.g. cp.comm.count_comm) entered around the first timed step only; what it yields is
    returned as first_timed. Nothing is read back to the host: results are what `step`
    returned (loss tensors stay on the device until the caller reads them).
    """
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"steps={steps} must be >= 1 and warmup_steps={warmup_steps} >= 0")
    results, times, first_timed = [], [], None
    for index in range(warmup_steps + steps):
        if before_each is not None:
            before_each()
        synchronize(device)
        measuring = measure_first is not None and index == warmup_steps
        with (measure_first() if measuring else contextlib.nullcontext()) as seen:
            start = time.perf_counter()
            results.append(run_step(step))
            synchronize(device)
            elapsed = time.perf_counter() - start
        if index >= warmup_steps:
            times.append(elapsed)
        if measuring:
            first_timed = seen
    return TimedSteps(results, times, first_timed)


def one_more_step(step: Callable[[], Any], *, device: torch.device,
                  before_each: Callable[[], None] | None = None) -> Callable[[], None]:
    """A callable running `step` once more as the timed loop runs it (before_each, the step,
    the device synchronised; nothing recorded): the untimed step a profiler may wrap
    (run_cp_training's after_timed_steps)."""
    def extra_step() -> None:
        if before_each is not None:
            before_each()
        run_step(step)
        synchronize(device)

    return extra_step


__all__ = ["TimedSteps", "one_more_step", "run_step", "run_timed_steps", "synchronize"]
