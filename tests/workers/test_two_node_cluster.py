"""A two-node Ray cluster on this machine: a trial's ranks must span both nodes.

Each node advertises 2 virtual chips, so a 4-chip trial has to take both: torch puts two
ranks on each node (one process group across them), JAX runs one process per node driving 2
chips each, joined by jax.distributed with gloo CPU collectives (2 processes x 2 chips).
"""

from __future__ import annotations

import collections

import pytest
import ray
from ray.cluster_utils import Cluster

from workers.driver import run_sweep
from workers.events import TrialStarted
from workers.process_probe import free_port

from .conftest import MemorySink, assert_consistent_metrics, assert_no_leaks, tiny_spec

STARTS_ITS_OWN_RAY = True  # tests/workers/conftest.py runs this module after the others


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()  # the local Ray of the other modules; the next one that needs it restarts it
    # A free dashboard port: another Ray on this machine may hold 8265, and the leak checks
    # read actors through the dashboard's state API.
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "resources": {"cpu_chip": 2},
                                      "dashboard_port": free_port()})
    cluster.add_node(num_cpus=1, resources={"cpu_chip": 2})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _run_spanning(spec):
    events = []
    (result,) = run_sweep(spec, MemorySink(), on_event=events.append)
    (started,) = [e for e in events if isinstance(e, TrialStarted)]
    return result, started


@pytest.mark.slow  # a 2-node Cluster (12 s quiet, 27 s beside other tests); the placement
# rules by default: test_placement.py, test_gpu_placement.py, test_tpu_placement.py
@pytest.mark.timeout(240)
def test_torch_ranks_span_both_nodes(two_nodes):
    result, started = _run_spanning(tiny_spec(modes=["p2p"], chips=[4]))
    assert_consistent_metrics(result)
    per_node = collections.Counter(w.node_id for w in started.workers)
    assert sorted(per_node.values()) == [2, 2]
    # Ranks of a node are adjacent: sequence neighbours talk within a node where they can.
    nodes = [w.node_id for w in started.workers]
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
    assert_no_leaks()


@pytest.mark.slow  # 21 s cold (two JAX processes compiling); torch across nodes runs by default
@pytest.mark.timeout(300)
def test_jax_two_processes_of_two_chips(two_nodes):
    result, started = _run_spanning(tiny_spec(frameworks=["jax"], modes=["all_gather"],
                                              chips=[4]))
    assert_consistent_metrics(result)
    assert len(started.workers) == 2
    assert started.workers[0].node_id != started.workers[1].node_id
    assert [len(w.bundles) for w in started.workers] == [2, 2]
    assert_no_leaks()
