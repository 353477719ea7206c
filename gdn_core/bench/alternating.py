"""Interleaved timing of several implementations (no framework: torch and JAX benches share it)."""

from __future__ import annotations

import time
from collections.abc import Callable


def time_alternating(runners: dict[str, Callable[[], object]], *, warmup: int,
                     repeats: int) -> dict[str, list[float]]:
    """Warm up each implementation, then time ABCABC… so a noisy machine slows them alike;
    return the seconds of each timed run (each runner synchronises its own device)."""
    for _ in range(warmup):
        for run in runners.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times
