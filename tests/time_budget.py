"""A pytest plugin: the default tier's time budget per test.

A test not marked `slow` whose setup or call takes longer than GDN_SWEEP_TEST_BUDGET_S
(0 turns the check off) fails, naming its time: longer runs belong under `slow`, or share a
compiled program or a session fixture. Without it the default tier grows back.

The default is 20 s for a test run alone, 30 s in a pytest-xdist worker: scripts/test.sh runs
two workers on this 2-core machine, where a test shares the cores with its neighbour's and
takes up to about 1.5-2 times its time alone (measured: the dashboard's sweep 9.5 s alone,
20 s beside a JAX compile).
"""

from __future__ import annotations

import os

import pytest

BUDGET_ENV = "GDN_SWEEP_TEST_BUDGET_S"
DEFAULT_BUDGET_S = 20.0
BESIDE_ANOTHER_WORKER_BUDGET_S = 30.0


BUDGET_S = pytest.StashKey[float]()


def pytest_configure(config):
    default = (BESIDE_ANOTHER_WORKER_BUDGET_S if os.environ.get("PYTEST_XDIST_WORKER")
               else DEFAULT_BUDGET_S)
    config.stash[BUDGET_S] = float(os.environ.get(BUDGET_ENV, default))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    budget = item.config.stash[BUDGET_S]
    if (budget > 0 and call.when in ("setup", "call") and report.passed
            and item.get_closest_marker("slow") is None and report.duration > budget):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid}: its {call.when} took {report.duration:.1f} s, over "
                           f"the default tier's budget of {budget:g} s per test ({BUDGET_ENV}): "
                           "mark it slow, or make it quicker")
    return report
