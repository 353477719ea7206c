"""Faults a cluster really has: a rank that never reaches the next collective (stopped, as a
hung host would be) and a worker node that leaves in the middle of a sweep. Each ends with one
result per trial and nothing left behind (placement groups removed, actors and processes gone).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

from workers.driver import run_sweep
from workers.events import TrialStarted
from workers.process_probe import free_port

from .conftest import MemorySink, assert_consistent_metrics, assert_no_leaks, tiny_spec

STARTS_ITS_OWN_RAY = True  # tests/workers/conftest.py runs this module after the others


def _gone(pids, timeout_s: float = 30.0) -> list[int]:
    """The pids still alive (zombies count as gone) after waiting up to timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


@pytest.mark.slow  # 15 s: a fault run (waits out a rendezvous timeout)
@pytest.mark.timeout(240)
def test_rank_that_never_arrives_times_out_and_its_peers_are_killed(local_ray):
    stopped: list[int] = []
    ranks: list[int] = []

    def stop_rank_1(event) -> None:
        if isinstance(event, TrialStarted) and not stopped:
            ranks.extend(w.pid for w in event.workers)
            stopped.append(event.workers[1].pid)
            os.kill(stopped[0], signal.SIGSTOP)  # rank 1 never reaches its next collective

    started = time.monotonic()
    (result,) = run_sweep(tiny_spec(chips=[2], steps=10_000, trial_timeout_s=10.0),
                          MemorySink(), on_event=stop_rank_1)
    assert stopped, "the trial never started"
    assert result.status == "timeout", (result.status, result.error)
    assert "timeout_s=10" in result.error and result.attempts == 1
    assert time.monotonic() - started < 120
    # Rank 0 waits in a collective, rank 1 is stopped: both must be killed, not left behind.
    assert _gone(ranks) == []
    assert_no_leaks()


@pytest.fixture
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()  # the module's local Ray; the next module that needs one starts it again
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "resources": {"cpu_chip": 2},
                                      "dashboard_port": free_port()})
    worker = cluster.add_node(num_cpus=1, resources={"cpu_chip": 2})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster, worker
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_worker_node_removed_mid_sweep_is_retried_on_the_node_left(two_nodes):
    cluster, worker = two_nodes
    removed = threading.Event()
    on_worker: list[str] = []

    def remove_worker_node(event) -> None:
        if (isinstance(event, TrialStarted) and not removed.is_set()
                and any(w.node_id == worker.node_id for w in event.workers)):
            on_worker.append(event.trial.key)
            removed.set()
            # From another thread: the driver thread must go on while the node shuts down.
            threading.Thread(target=cluster.remove_node, args=(worker,), daemon=True).start()

    # Two 2-chip trials at once: one per node. The one on the worker node loses its node.
    spec = tiny_spec(chips=[2], seq_lens=[64, 128], steps=40)
    results = run_sweep(spec, MemorySink(), max_concurrent_trials=2,
                        on_event=remove_worker_node)
    assert removed.is_set(), "no trial was placed on the worker node"
    by_key = {r.trial.key: r for r in results}
    assert len(results) == 2 == len(by_key)
    for result in results:
        assert_consistent_metrics(result)
    moved = by_key[on_worker[0]]
    assert moved.attempts == 2, moved.attempt_history
    first, second = moved.attempt_history
    assert first.status == "failed" and first.reason
    assert second.status == "succeeded"
    assert_no_leaks()
