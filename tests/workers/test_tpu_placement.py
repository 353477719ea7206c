"""TPU placement, tested without TPUs: fake TPU VM hosts whose slice worker id is not the
placement bundle order.

Two Ray nodes carry what Ray gives a v5p-16 slice's hosts (2x2x2, 4 chips per host): the
resources {"TPU": 4} (+ "TPU-v5p-16-head" on worker 0), the labels ray.io/tpu-worker-id,
ray.io/tpu-slice-name, ray.io/tpu-pod-type, and TPU_NAME / TPU_WORKER_ID in the environment.
Ray's own SlicePlacementGroup reserves the slice; probe actors started with the options
`jax_hosts.host_actor_options` builds call `jax_hosts.distributed_process_id`, the function
JaxHostActor.join passes to jax.distributed.initialize as process_id.
"""

from __future__ import annotations

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.tpu import SlicePlacementGroup

from workers import jax_hosts
from workers.placement import TPU_WORKER_ID_LABEL, ChipRequest, TrialChips, tpu_worker_id
from workers.worker_group import kill_actors

STARTS_ITS_OWN_RAY = True  # tests/workers/conftest.py runs this module after the others

SLICE = "fake-v5p-16"
REQUEST = ChipRequest(framework="jax", chips=8, accelerator_kind="tpu", accelerator_type="v5p")


@ray.remote(num_cpus=0)
class SliceProbe:
    """Reports the process id a JAX host process on this node would pass to jax.distributed."""

    def process_id(self, process_index: int, num_processes: int) -> tuple[str, int]:
        from workers.jax_hosts import distributed_process_id

        return (ray.get_runtime_context().get_node_id(),
                distributed_process_id("tpu", process_index, num_processes))


@pytest.fixture(scope="module")
def tpu_slice_nodes():
    if ray.is_initialized():
        ray.shutdown()  # the local Ray of other modules; the next one that needs it restarts it
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False})
    for worker in (0, 1):
        resources = {"TPU": 4} | ({"TPU-v5p-16-head": 1} if worker == 0 else {})
        cluster.add_node(num_cpus=1, resources=resources,
                         labels={TPU_WORKER_ID_LABEL: str(worker),
                                 "ray.io/tpu-slice-name": SLICE,
                                 "ray.io/tpu-pod-type": "v5p-16"},
                         env_vars={"TPU_NAME": SLICE, "TPU_WORKER_ID": str(worker)})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def node_of_worker(worker: int) -> str:
    (node,) = [n["NodeID"] for n in ray.nodes()
               if n["Alive"] and n.get("Labels", {}).get(TPU_WORKER_ID_LABEL) == str(worker)]
    return node


@pytest.mark.timeout(180)
def test_process_ids_follow_the_slice_worker_id_not_the_bundle_order(tpu_slice_nodes):
    # Bundle 0 on worker 1 and bundle 1 on worker 0: bundle order is not the slice's order.
    tpu_slice = SlicePlacementGroup(
        topology="2x2x2", accelerator_version="v5p", strategy="SPREAD",
        bundle_label_selector=[{TPU_WORKER_ID_LABEL: "1"}, {TPU_WORKER_ID_LABEL: "0"}],
        head_reservation_timeout_s=60)
    ray.get(tpu_slice.placement_group.ready(), timeout=60)
    chips = TrialChips.from_ready_group(REQUEST, tpu_slice.placement_group,
                                        chips_per_bundle=tpu_slice.chips_per_host,
                                        tpu_slice=tpu_slice)
    actors = []
    try:
        assert chips.chips_per_bundle == 4
        assert chips.bundle_nodes == (node_of_worker(1), node_of_worker(0))
        assert chips.bundle_tpu_worker_ids == (1, 0)
        processes = jax_hosts.host_actor_options(chips)
        assert [bundles for bundles, _ in processes] == [(1,), (0,)]  # process i = worker i
        assert all(o["resources"] == {"TPU": 4} and
                   o["runtime_env"]["env_vars"]["JAX_PLATFORMS"] == "tpu"
                   for _, o in processes)
        actors = [SliceProbe.options(**options).remote() for _, options in processes]
        seen = ray.get([a.process_id.remote(i, 2) for i, a in enumerate(actors)], timeout=120)
        assert seen == [(node_of_worker(0), 0), (node_of_worker(1), 1)]
        # Handing out ids in bundle order (the old behaviour) gives worker 1 id 0: refused.
        with pytest.raises(RuntimeError, match="slice worker 1 but was started as JAX "
                                               "process 0"):
            ray.get(actors[1].process_id.remote(0, 2), timeout=60)
        # One host alone runs no jax.distributed: any worker id is process 0.
        assert ray.get(actors[1].process_id.remote(0, 1), timeout=60)[1] == 0
    finally:
        kill_actors(actors)
        chips.remove()


@pytest.mark.timeout(180)
def test_trial_chips_reserve_the_slice_in_worker_order(tpu_slice_nodes):
    chips = TrialChips.create(REQUEST, timeout_s=60)
    try:
        assert sorted(chips.bundle_tpu_worker_ids) == [0, 1]
        slots = chips.process_slots(per_host=False)
        assert [chips.bundle_tpu_worker_ids[b] for (b,) in slots] == [0, 1]
        assert [chips.bundle_nodes[b] for (b,) in slots] == [node_of_worker(0),
                                                              node_of_worker(1)]
    finally:
        chips.remove()


@pytest.mark.timeout(30)
def test_process_slots_of_a_slice_follow_worker_ids():
    chips = TrialChips(request=REQUEST, placement_group=None, bundle_nodes=("a", "b", "c", "d"),
                       chips_per_bundle=4, bundle_tpu_worker_ids=(2, 0, 3, 1))
    assert chips.process_slots(per_host=False) == ((1,), (3,), (0,), (2,))


@pytest.mark.timeout(30)
def test_tpu_worker_id_label_then_environment():
    assert tpu_worker_id({TPU_WORKER_ID_LABEL: "3"}, {"TPU_WORKER_ID": "5"}) == 3
    assert tpu_worker_id({}, {"TPU_WORKER_ID": "2"}) == 2
    with pytest.raises(ValueError, match=r"ray.io/tpu-worker-id=None, TPU_WORKER_ID=None"):
        tpu_worker_id({}, {})
    with pytest.raises(ValueError, match=r"ray.io/tpu-worker-id='w1'"):
        tpu_worker_id({TPU_WORKER_ID_LABEL: "w1"})
    assert jax_hosts.distributed_process_id("gpu", 3, 4) == 3  # off TPU: the driver's order
