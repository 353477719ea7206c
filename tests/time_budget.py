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

What is held to the budget is the test's own time: its wall time less the time it was kept
waiting for a CPU that other work held. Linux counts, per thread, the time it was runnable but
not running (/proc/<pid>/task/<tid>/schedstat, second field); the phase's contention is the
largest such wait among the busy threads (running or waiting to run at least half the phase)
of the test process and its descendants (Ray's workers, servers, browsers): the waits of work
in parallel overlap, and an idle thread's are off the test's path. A test that sleeps or waits
on a socket is charged its whole wall time (it waits, but not for a CPU); one slowed down by
a neighbouring job is not charged the slowdown. Where schedstat is missing the wall time
counts. CI still prints every test's duration (--durations).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

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


_BUDGET_HELD = False
"""Whether this process holds tests to a budget (the readings cost a few ms a test)."""


def pytest_configure(config):
    global _BUDGET_HELD
    if BUDGET_ENV in os.environ:
        config.stash[BUDGET_S] = float(os.environ[BUDGET_ENV])
    else:
        base = (BESIDE_ANOTHER_WORKER_BUDGET_S if os.environ.get("PYTEST_XDIST_WORKER")
                else DEFAULT_BUDGET_S)
        config.stash[BUDGET_S] = round(base * host_slowness(), 1)
    _BUDGET_HELD = _BUDGET_HELD or config.stash[BUDGET_S] > 0


def pytest_report_header(config):
    if BUDGET_ENV in os.environ:
        return f"time budget per default-tier test: {config.stash[BUDGET_S]:g} s ({BUDGET_ENV})"
    return (f"time budget per default-tier test: {DEFAULT_BUDGET_S:g} s alone, "
            f"{BESIDE_ANOTHER_WORKER_BUDGET_S:g} s in an xdist worker, times the host's "
            f"slowness {os.environ[HOST_SLOWNESS_ENV]} (tests/time_budget.py)")


def _threads_below(pid: int) -> list[Path]:
    """The /proc task folders of `pid`'s threads and of every process below it (each thread's
    `children` file names the processes it started)."""
    tasks, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            tasks.append(task)
            try:
                todo.extend(int(child) for child in (task / "children").read_text().split())
            except OSError:  # exited meanwhile
                continue
    return tasks


def run_queue_waits() -> dict[tuple[int, int], tuple[int, int]]:
    """(nanoseconds on a CPU, nanoseconds runnable but waiting for one) of each thread of this
    process and its descendants, by (pid, tid); empty where the kernel does not say.
    Read between the phases, never inside the time pytest measures."""
    waits = {}
    for task in _threads_below(os.getpid()):
        try:
            running, waiting = (task / "schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        waits[int(task.parent.parent.name), int(task.name)] = int(running), int(waiting)
    return waits


def contention_s(before: dict, after: dict, wall_s: float) -> float:
    """The longest wait for a CPU added between the two readings by a thread that was busy
    (running or waiting to run) at least half of `wall_s`: the work the test waited on. A
    thread alive only at the end counts from zero; a mostly idle one (a sleeping main
    thread, a pool's idle worker) is left out, its waits being off the test's path."""
    longest = 0
    for key, (running, waiting) in after.items():
        ran_before, waited_before = before.get(key, (0, 0))
        added = waiting - waited_before
        if (running - ran_before + added) >= wall_s * 1e9 / 2:
            longest = max(longest, added)
    return longest / 1e9


_READINGS: dict[str, dict[str, tuple[dict, float]]] = {}
"""Per test node, the reading each phase started from ("setup", "call")."""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location):
    """The reading before setup (outside its timing), where a budget is held."""
    if _BUDGET_HELD:
        _READINGS[nodeid] = {"setup": (run_queue_waits(), time.perf_counter())}


def pytest_runtest_logfinish(nodeid, location):
    _READINGS.pop(nodeid, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    budget = item.config.stash[BUDGET_S]
    if budget <= 0 or call.when not in ("setup", "call"):
        return report
    # after the phase's timing ended: this reading ends it and starts the next
    now = run_queue_waits(), time.perf_counter()
    readings = _READINGS.setdefault(item.nodeid, {})
    (before, start), readings["call"] = readings.get(call.when, now), now
    exempt = any(item.get_closest_marker(name) is not None for name in EXEMPT_MARKERS)
    if not report.passed or exempt:
        return report
    waited = min(contention_s(before, now[0], now[1] - start), report.duration)
    own = report.duration - waited
    if own > budget:
        report.outcome = "failed"
        spent = (f"{report.duration:.1f} s" if waited < 0.05 else
                 f"{own:.1f} s of its own ({report.duration:.1f} s, {waited:.1f} s of it waiting "
                 "for a CPU that other work held)")
        report.longrepr = (f"{item.nodeid}: its {call.when} took {spent}, over the default "
                           f"tier's budget of {budget:g} s per test ({BUDGET_ENV}; "
                           "tests/time_budget.py): mark it slow, or make it quicker")
    return report
