"""GPU placement, tested without GPUs: Ray nodes with fake GPUs and the actors a trial starts.

Two nodes of 2 logical GPUs each (`Cluster.add_node(num_gpus=2)`; no CUDA is needed): a
4-chip trial's placement group spans both. Probe actors started with exactly the options the
spawn functions build (`torch_ranks.rank_actor_options`, `jax_hosts.host_actor_options`)
report what a rank would see: ray.get_gpu_ids(), CUDA_VISIBLE_DEVICES and the CUDA device
index `cuda_device_index` picks from them (the one TorchRankActor / JaxHostActor.join use).
"""

from __future__ import annotations

import collections

import pytest
import ray
from ray.cluster_utils import Cluster

from gdn_core.device_memory import JAX_GPU_MEMORY_FRACTION
from workers import jax_hosts, torch_ranks
from workers.placement import ChipRequest, TrialChips, cuda_device_index
from workers.worker_group import kill_actors

STARTS_ITS_OWN_RAY = True  # tests/workers/conftest.py runs this module after the others

GPUS_PER_NODE = 2


@ray.remote(num_cpus=0)
class DeviceProbe:
    """Reports the GPU view of a process started with a rank's actor options."""

    def report(self) -> dict:
        import os

        from workers.placement import cuda_device_index

        visible, gpu_ids = os.environ.get("CUDA_VISIBLE_DEVICES"), ray.get_gpu_ids()
        return {"node": ray.get_runtime_context().get_node_id(), "gpu_ids": gpu_ids,
                "visible": visible, "index": cuda_device_index(gpu_ids, visible),
                "jax_platforms": os.environ.get("JAX_PLATFORMS")}


@pytest.fixture(scope="module")
def gpu_nodes():
    if ray.is_initialized():
        ray.shutdown()  # the local Ray of other modules; the next one that needs it restarts it
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1, num_gpus=GPUS_PER_NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def probe(options_per_process) -> list[dict]:
    actors = [DeviceProbe.options(**options).remote() for _, options in options_per_process]
    try:
        return ray.get([a.report.remote() for a in actors], timeout=120)
    finally:
        kill_actors(actors)


def assert_one_distinct_gpu_each(chips: TrialChips, bundles: list[int], seen: list[dict]):
    # Rank order is bundle order with a host's ranks adjacent, each rank on its bundle's node.
    assert bundles == [b for (b,) in chips.process_slots(per_host=False)]
    assert [s["node"] for s in seen] == [chips.bundle_nodes[b] for b in bundles]
    nodes = [s["node"] for s in seen]
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
    # One GPU each, no two ranks on the same physical GPU.
    assert all(len(s["gpu_ids"]) == 1 for s in seen)
    assert len({(s["node"], s["gpu_ids"][0]) for s in seen}) == 4
    # Every GPU of the node stays visible (NCCL finds NVLink peers only among visible GPUs),
    # so each rank selects its own: the index is its GPU id, distinct within the node.
    assert all(s["visible"] is None for s in seen)
    assert [s["index"] for s in seen] == [int(s["gpu_ids"][0]) for s in seen]
    per_node = collections.defaultdict(set)
    for s in seen:
        per_node[s["node"]].add(s["index"])
    assert sorted(map(sorted, per_node.values())) == [[0, 1], [0, 1]]


@pytest.mark.timeout(240)
def test_torch_and_jax_ranks_get_distinct_gpus_in_bundle_order(gpu_nodes):
    request = ChipRequest(framework="torch", chips=4, accelerator_kind="gpu",
                          accelerator_type="h100")
    chips = TrialChips.create(request, timeout_s=60)
    try:
        assert ray.util.placement_group_table(chips.placement_group)["bundles"] == {
            i: {"GPU": 1.0} for i in range(4)}
        torch_options = torch_ranks.rank_actor_options(chips)
        assert_one_distinct_gpu_each(chips, [b for b, _ in torch_options], probe(torch_options))
        jax_options = jax_hosts.host_actor_options(chips)  # JAX on GPU: one process per GPU
        assert [len(bundles) for bundles, _ in jax_options] == [1, 1, 1, 1]
        seen = probe(jax_options)
        assert_one_distinct_gpu_each(chips, [b[0] for b, _ in jax_options], seen)
        assert {s["jax_platforms"] for s in seen} == {"cuda"}
        # Measured on a GPU, JAX's allocator grows on demand up to the fraction admission
        # assumed usable (not 75% taken at start).
        for _, options in jax_options:
            env = options["runtime_env"]["env_vars"]
            assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
            assert float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == JAX_GPU_MEMORY_FRACTION
    finally:
        chips.remove()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("gpu_ids, visible, index", [
    ([2], None, 2),                          # all of the host's GPUs visible: the id itself
    (["1"], "0,1,2,3", 1),
    ([3], "2,3", 1),                         # a node started with CUDA_VISIBLE_DEVICES=2,3
    ([0], "0", 0),                           # Ray's default: only the assigned GPU visible
    (["GPU-9c1e"], "GPU-04aa,GPU-9c1e", 1),  # UUIDs
])
def test_cuda_device_index(gpu_ids, visible, index):
    assert cuda_device_index(gpu_ids, visible) == index


@pytest.mark.timeout(30)
@pytest.mark.parametrize("gpu_ids, visible, match", [
    ([], None, r"ray.get_gpu_ids\(\)=\[\]: a rank drives exactly one GPU"),
    ([0, 1], None, r"ray.get_gpu_ids\(\)=\[0, 1\]"),
    ([5], "0,1", r"GPU '5' that Ray assigned is not in CUDA_VISIBLE_DEVICES='0,1'"),
    (["GPU-9c1e"], None, r"GPU id 'GPU-9c1e' is not an index"),
])
def test_cuda_device_index_errors(gpu_ids, visible, match):
    with pytest.raises(ValueError, match=match):
        cuda_device_index(gpu_ids, visible)
