"""The time budget (tests/time_budget.py) exempts `gpu`-marked tests: on a GPU machine their
first call pays a cold autotune or compile, and scripts/device-check.sh bounds them itself."""

from __future__ import annotations

import pytest

from tests.time_budget import EXEMPT_MARKERS

SLEEPY_GPU_TESTS = """
import time
import pytest

@pytest.mark.gpu
def test_sleepy_gpu():
    time.sleep(0.5)

@pytest.fixture
def sleepy_fixture():
    time.sleep(0.5)

@pytest.mark.gpu
def test_gpu_with_a_sleepy_setup(sleepy_fixture):
    pass

def test_sleepy_unmarked():
    time.sleep(0.5)
"""


@pytest.mark.timeout(60)
def test_gpu_marked_tests_are_outside_the_budget_and_unmarked_ones_are_not(pytester,
                                                                            monkeypatch):
    assert EXEMPT_MARKERS == ("slow", "gpu")
    monkeypatch.setenv("GDN_SWEEP_TEST_BUDGET_S", "0.25")
    pytester.makeini("[pytest]\nmarkers =\n    slow: long\n    gpu: needs a CUDA device\n")
    pytester.makepyfile(SLEEPY_GPU_TESTS)
    result = pytester.runpytest_inprocess("-p", "tests.time_budget")
    # Both gpu tests pass over the budget (call and setup); the unmarked one, as slow, fails:
    # the exemption is the marker's, not a budget turned off.
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_sleepy_unmarked: its call took 0.5 s, over the "
                                 "default tier's budget of 0.25 s*"])
    assert "test_sleepy_gpu: its" not in result.stdout.str()
