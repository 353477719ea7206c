"""The default tier's time budget (tests/time_budget.py) fails a slow unmarked test, and only
that one."""

from __future__ import annotations

import os

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
