"""The default tier's time budget (tests/time_budget.py) fails a slow unmarked test, and only
that one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.time_budget import HOST_SLOWNESS_ENV, MAX_SLOWNESS, REFERENCE_LOOP_S, host_slowness

SLEEPY_TESTS = """
import time
import pytest

def test_quick():
    pass

def test_sleepy():
    time.sleep(0.5)

@pytest.mark.slow
def test_sleepy_but_marked():
    time.sleep(0.5)

@pytest.fixture
def sleepy_fixture():
    time.sleep(0.5)

def test_with_a_sleepy_setup(sleepy_fixture):
    pass
"""


@pytest.mark.timeout(60)
def test_an_unmarked_test_over_the_budget_fails_naming_its_time(pytester, monkeypatch):
    monkeypatch.setenv("GDN_SWEEP_TEST_BUDGET_S", "0.25")
    pytester.makeini("[pytest]\nmarkers =\n    slow: long\n")
    pytester.makepyfile(SLEEPY_TESTS)
    result = pytester.runpytest_inprocess("-p", "tests.time_budget")
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*test_sleepy: its call took 0.5 s, over the default tier's budget of 0.25 s per test*"])
    result.stdout.fnmatch_lines(["*test_with_a_sleepy_setup: its setup took 0.5 s*"])


@pytest.mark.timeout(60)
def test_a_zero_budget_turns_the_check_off(pytester, monkeypatch):
    monkeypatch.setenv("GDN_SWEEP_TEST_BUDGET_S", "0")
    pytester.makeini("[pytest]\nmarkers =\n    slow: long\n")
    pytester.makepyfile(SLEEPY_TESTS)
    pytester.runpytest_inprocess("-p", "tests.time_budget").assert_outcomes(passed=4)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker, slowness, budget", [(None, "1.00", "20"), ("gw1", "1.00", "30"),
                                                      (None, "1.75", "35"), ("gw1", "2.00", "60")])
def test_the_default_budget_is_20_s_alone_and_30_s_beside_another_worker_on_the_reference_host(
        pytester, monkeypatch, worker, slowness, budget):
    monkeypatch.delenv("GDN_SWEEP_TEST_BUDGET_S", raising=False)
    monkeypatch.setenv(HOST_SLOWNESS_ENV, slowness)
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    pytester.makeini("[pytest]\nmarkers =\n    slow: long\n")
    pytester.makepyfile("import time\n\ndef test_over():\n    time.sleep(0.05)\n")
    pytester.makeconftest(
        "def pytest_sessionfinish(session):\n"
        "    from tests.time_budget import BUDGET_S\n"
        "    print('budget', session.config.stash[BUDGET_S])\n")
    result = pytester.runpytest_inprocess("-p", "tests.time_budget", "-s")
    result.stdout.fnmatch_lines([f"*budget {budget}.0*"])


@pytest.mark.timeout(60)
def test_the_host_is_timed_once_and_its_slowness_passed_on(monkeypatch):
    """Unset, the slowness is measured, bounded, and left in the environment for xdist's
    workers (which then read it instead of timing the host beside each other)."""
    monkeypatch.delenv(HOST_SLOWNESS_ENV, raising=False)
    slowness = host_slowness()
    assert 1.0 <= slowness <= MAX_SLOWNESS
    assert os.environ[HOST_SLOWNESS_ENV] == f"{slowness:.2f}"
    monkeypatch.setenv(HOST_SLOWNESS_ENV, "3.5")
    assert host_slowness() == 3.5
    assert REFERENCE_LOOP_S > 0


CONTENDED_TESTS = """
import time

def test_spins(tmp_path_factory):
    start, cpu = time.perf_counter(), time.process_time()
    while time.process_time() - cpu < {cpu_s}:
        pass
    print("WALL", time.perf_counter() - start)

def test_sleeps():
    time.sleep({sleep_s})
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/task/%d/schedstat" % os.getpid()),
                    reason="the kernel reports no per-thread run-queue wait (schedstat)")
@pytest.mark.timeout(60)
def test_time_spent_waiting_for_a_cpu_other_work_held_is_not_charged(pytester, monkeypatch):
    """Pinned to one core beside two busy processes, a test that needs 0.4 s of CPU takes about
    three times as long: over a 0.8 s budget in wall time, within it in its own; a test that
    sleeps 1.2 s is charged all of it (it waits, but not for a CPU)."""
    import subprocess
    import sys

    monkeypatch.setenv("GDN_SWEEP_TEST_BUDGET_S", "0.8")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(  # the inner run imports tests.time_budget
        filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")])))
    pytester.makeini("[pytest]\nmarkers =\n    slow: long\n")
    pytester.makepyfile(CONTENDED_TESTS.format(cpu_s=0.4, sleep_s=1.2))
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # the hogs and the inner run inherit one core
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        result = pytester.runpytest_subprocess("-p", "tests.time_budget", "-s",
                                               "-p", "no:cacheprovider")
    finally:
        os.sched_setaffinity(0, cores)
        for hog in hogs:
            hog.kill()
            hog.wait()
    wall = float(next(line.split()[-1] for line in result.outlines if "WALL" in line))
    assert wall > 0.8, f"the hogs did not contend (spin took {wall:.2f} s)"
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_sleeps: its call took 1.2 s, over the default "
                                 "tier's budget of 0.8 s*"])
    assert "test_spins: its" not in result.stdout.str()
