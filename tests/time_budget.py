"""A pytest plugin: the default tier's time budget per test.

A test not marked `slow` whose setup or call takes longer than its budget fails, naming its
time: longer runs belong under `slow`, or share a compiled program or a session fixture.
Without it the default tier grows back. Tests marked `gpu` are exempt too: they are never in
the default tier (pyproject's addopts deselect them), and on a GPU machine their first call
pays a cold Triton autotune or a JAX GPU compile that no CPU host's budget measures;
scripts/device-check.sh bounds them with its own per-test --timeout and part limit.

The budget is 20 s for a test run alone, 30 s in a pytest-xdist worker (scripts/test.sh runs
two workers on this 2-core machine, where a test shares the cores with its neighbour's and
takes up to about 1.5-2 times its time alone: the dashboard's sweep 9.5 s alone, 20 s beside a
JAX compile), in seconds of the host these were set on. A slower host gets proportionally
more: the run times a fixed pure-Python loop once (host_loop, best of 3, before any worker
starts; workers inherit it through HOST_SLOWNESS_ENV) and multiplies the budget by its time
over REFERENCE_LOOP_S, never by less than 1 nor more than MAX_SLOWNESS. Measured: the same
commit's suite took 611 s on 2026-12-06's host and 1,255 s on 2026-12-07's, every test about
twice as long (the ulysses step 18.7 → 36.3 s), where this loop took 0.124 s: so about 0.06 s
on the host the budgets were set on (inferred from that ratio; the loop was not timed there).
GDN_SWEEP_TEST_BUDGET_S sets the budget outright (0 turns the check off; no scaling).
"""

from __future__ import annotations

import os
import time

import pytest

BUDGET_ENV = "GDN_SWEEP_TEST_BUDGET_S"
HOST_SLOWNESS_ENV = "GDN_SWEEP_HOST_SLOWNESS"
DEFAULT_BUDGET_S = 20.0
BESIDE_ANOTHER_WORKER_BUDGET_S = 30.0
REFERENCE_LOOP_S = 0.06
"""host_loop's time on the host the budgets were set on (see the module docstring)."""
EXEMPT_MARKERS = ("slow", "gpu")
"""Markers whose tests the budget does not hold (the module docstring says why)."""
MAX_SLOWNESS = 4.0
"""A host slower than this still gets 4 times the budget: past it, the check would say little."""


BUDGET_S = pytest.StashKey[float]()


def host_loop() -> float:
    """Seconds of a fixed pure-Python loop (2·10^6 additions), best of 3."""
    times = []
    for _ in range(3):
        start, total = time.perf_counter(), 0
        for i in range(2 * 10**6):
            total += i
        times.append(time.perf_counter() - start)
    return min(times)


def host_slowness() -> float:
    """This host's slowness against the one the budgets were set on: from HOST_SLOWNESS_ENV
    where the run already measured it (an xdist worker, or a caller's setting), else measured
    now and put there for the workers this run starts."""
    if HOST_SLOWNESS_ENV not in os.environ:
        slowness = min(MAX_SLOWNESS, max(1.0, host_loop() / REFERENCE_LOOP_S))
        os.environ[HOST_SLOWNESS_ENV] = f"{slowness:.2f}"
    return float(os.environ[HOST_SLOWNESS_ENV])


def pytest_configure(config):
    if BUDGET_ENV in os.environ:
        config.stash[BUDGET_S] = float(os.environ[BUDGET_ENV])
        return
    base = (BESIDE_ANOTHER_WORKER_BUDGET_S if os.environ.get("PYTEST_XDIST_WORKER")
            else DEFAULT_BUDGET_S)
    config.stash[BUDGET_S] = round(base * host_slowness(), 1)


def pytest_report_header(config):
    if BUDGET_ENV in os.environ:
        return f"time budget per default-tier test: {config.stash[BUDGET_S]:g} s ({BUDGET_ENV})"
    return (f"time budget per default-tier test: {DEFAULT_BUDGET_S:g} s alone, "
            f"{BESIDE_ANOTHER_WORKER_BUDGET_S:g} s in an xdist worker, times the host's "
            f"slowness {os.environ[HOST_SLOWNESS_ENV]} (tests/time_budget.py)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    budget = item.config.stash[BUDGET_S]
    exempt = any(item.get_closest_marker(name) is not None for name in EXEMPT_MARKERS)
    if (budget > 0 and call.when in ("setup", "call") and report.passed and not exempt
            and report.duration > budget):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid}: its {call.when} took {report.duration:.1f} s, over "
                           f"the default tier's budget of {budget:g} s per test ({BUDGET_ENV}; "
                           "tests/time_budget.py): mark it slow, or make it quicker")
    return report
