"""Virtual CPU chips are a real partition: the ledger, pinning, and MFU <= 1 on a local Ray with
as many chips as this host has cores (2 here)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import ray

from workers import cpu_cores
from workers.driver import run_sweep
from workers.options import DriverOptions
from workers.placement import ChipRequest, TrialChips
from workers.worker_group import WorkerGroup, WorkerGroupContext

from .conftest import MemorySink, assert_consistent_metrics, assert_no_leaks, tiny_spec

STARTS_ITS_OWN_RAY = True  # tests/workers/conftest.py runs this module after the others

HOST_CORES = cpu_cores.usable_cores()


# ------------------------------------------------------------------ the partition, no Ray


@pytest.mark.parametrize("cores, chips, expected", [
    ((0, 1), 2, [(0,), (1,)]), ((0, 1, 2, 3), 2, [(0, 1), (2, 3)]),
    ((0, 1, 2), 2, [(0,), (1,)]), ((4, 5, 6, 7), 1, [(4, 5, 6, 7)]),
    ((0, 1), 4, [(0,), (1,), (0,), (1,)])], ids=lambda v: str(v).replace(" ", ""))
def test_chip_cores(cores, chips, expected):
    assert cpu_cores.chip_cores(cores, chips) == expected


def test_describe_says_cores_and_sharing():
    own = cpu_cores.CpuPartition(chips=(0, 1), cores=(0, 1), host_cores=2, chips_on_host=2)
    assert own.describe() == "cores=0-1(1 per chip)" and not own.shared
    shared = cpu_cores.CpuPartition(chips=(0, 1, 2, 3), cores=(0, 1), host_cores=2,
                                    chips_on_host=8)
    assert shared.describe() == "cores=0-1(0.5 per chip, shared: 8 cpu_chip on 2 cores)"
    assert cpu_cores.core_ranges([0, 1, 2, 3, 6, 8, 9]) == "0-3,6-6,8-9"


_HOLD = textwrap.dedent("""
    import sys, time
    from workers.cpu_cores import claim_chips
    part = claim_chips(int(sys.argv[1]), node_id="test-node", chips_on_host=4,
                       host_cores=(0, 1, 2, 3), timeout_s=0)
    print(",".join(map(str, part.chips)), flush=True)
    time.sleep(60)
""")


@pytest.mark.timeout(60)
def test_ledger_hands_out_free_chips_and_frees_them_when_the_holder_dies(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv(cpu_cores.LEDGER_DIR_ENV, str(tmp_path))
    env = {**os.environ, cpu_cores.LEDGER_DIR_ENV: str(tmp_path)}

    def hold(count):
        proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(count)], env=env,
                                stdout=subprocess.PIPE, text=True)
        return proc, proc.stdout.readline().strip()

    first, chips_a = hold(1)
    second, chips_b = hold(2)
    try:
        assert (chips_a, chips_b) == ("0", "1,2")  # first free chips, never shared
        mine = cpu_cores.claim_chips(1, node_id="test-node", chips_on_host=4,
                                     host_cores=(0, 1, 2, 3), timeout_s=0)
        assert mine.chips == (3,) and mine.cores == (3,)
        with pytest.raises(RuntimeError, match="only 0 of 1 virtual CPU chips free"):
            cpu_cores.claim_chips(1, node_id="test-node", chips_on_host=4,
                                  host_cores=(0, 1, 2, 3), timeout_s=0)
        second.kill()  # a killed actor: the kernel drops its locks with the process
        second.wait()
        again = cpu_cores.claim_chips(2, node_id="test-node", chips_on_host=4,
                                      host_cores=(0, 1, 2, 3), timeout_s=5)
        assert again.chips == (1, 2) and again.cores == (1, 2)
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


@pytest.mark.timeout(60)
def test_pinning_moves_every_thread():
    code = textwrap.dedent("""
        import os, threading, time
        from workers.cpu_cores import pin_process
        stop = threading.Event()
        workers = [threading.Thread(target=stop.wait) for _ in range(3)]
        for t in workers:
            t.start()
        pin_process((0,))
        tids = os.listdir("/proc/self/task")
        masks = {tid: os.sched_getaffinity(int(tid)) for tid in tids}
        stop.set()
        late = threading.Thread(target=lambda: print(os.sched_getaffinity(0) == {0}))
        late.start(); late.join()
        print(len(tids) >= 4 and all(m == {0} for m in masks.values()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=50)
    assert out.stdout.split() == ["True", "True"], out.stderr


# ------------------------------------------------------------------ on Ray


@pytest.fixture(scope="module")
def ray_one_chip_per_core():
    """A local Ray advertising one cpu_chip per usable core (the connect_ray default)."""
    from workers.cluster import connect_ray

    if ray.is_initialized():
        ray.shutdown()
    info = connect_ray("", num_cpus=len(HOST_CORES))
    assert info.resources["cpu_chip"] == len(HOST_CORES)
    yield info
    ray.shutdown()


def _group(framework: str, chips: int) -> WorkerGroup:
    request = ChipRequest(framework=framework, chips=chips, accelerator_kind="cpu",
                          accelerator_type="cpu")
    placed = TrialChips.create(request, timeout_s=60)
    try:
        return WorkerGroup.create(WorkerGroupContext(
            chips=placed, options=DriverOptions()))
    except BaseException:
        placed.remove()
        raise


@pytest.mark.timeout(180)
def test_ranks_and_jax_processes_are_pinned_to_their_chips(ray_one_chip_per_core):
    if len(HOST_CORES) < 2:
        pytest.skip("needs 2 usable cores")
    torch_group = _group("torch", 2)
    try:
        first, second = (set(i.affinity) for i in torch_group.identities)
        assert first and second and not first & second  # a core of its own each
        assert first | second <= set(HOST_CORES)
        assert all(i.cpu_partition.endswith("(1 per chip)") for i in torch_group.identities)
    finally:
        torch_group.shutdown()
    jax_group = _group("jax", 2)
    try:
        (identity,) = jax_group.identities  # one process drives the host's chips
        assert len(identity.cpu_chips) == 2
        blocks = cpu_cores.chip_cores(HOST_CORES, len(HOST_CORES))
        assert set(identity.affinity) == {c for chip in identity.cpu_chips for c in blocks[chip]}
    finally:
        jax_group.shutdown()
    assert_no_leaks()


@pytest.mark.slow  # a fault run (8-15 s); chips freed when their holder dies by default:
# test_ledger_hands_out_free_chips_and_frees_them_when_the_holder_dies
@pytest.mark.timeout(240)
def test_warm_group_keeps_its_cores_and_a_dead_one_frees_them(ray_one_chip_per_core):
    if len(HOST_CORES) < 2:
        pytest.skip("needs 2 usable cores")
    idle = _group("torch", 1)  # as a warm, idle group in the pool: still holds its chip
    try:
        busy = _group("jax", 1)
        freed = busy.identities[0].cpu_chips
        try:
            assert not set(idle.identities[0].affinity) & set(busy.identities[0].affinity)
        finally:
            busy.shutdown()  # ray.kill: the ledger lock goes with the process
        again = _group("torch", 1)
        try:
            assert again.identities[0].cpu_chips == freed
        finally:
            again.shutdown()
    finally:
        idle.shutdown()
    assert_no_leaks()


@pytest.mark.timeout(420)
# JAX: 28 s (a 1024-token trial's compile); the bound itself, whatever the framework:
# test_metrics.py.
@pytest.mark.parametrize("framework", ["torch", pytest.param("jax", marks=pytest.mark.slow)])
def test_one_chip_mfu_is_at_most_one(ray_one_chip_per_core, framework):
    sink = MemorySink()
    spec = tiny_spec(frameworks=[framework], chips=[1], seq_lens=[1024],
                     model={"preset": "tiny", "num_layers": 2}, steps=3, warmup_steps=1,
                     trial_timeout_s=300)
    results = run_sweep(spec, sink)
    assert len(results) == 1
    for result in results:
        assert_consistent_metrics(result)
        m = result.metrics
        assert m.mfu is not None and 0 < m.mfu <= m.hfu <= 1, (result.trial.key, m)
        assert m.peak_flops_dtype == "float32"
        assert m.peak_flops_source.startswith(
            f"cpu_gemm_calibration:{result.trial.framework}:fp32:1024^3:")
        assert m.peak_flops_source.endswith("(1 per chip)")
        assert m.device_name and m.measured_steps == 3
        assert m.step_time_min_s <= m.step_time_s <= m.step_time_max_s
    assert_no_leaks()


@pytest.mark.timeout(60)
def test_sweep_asking_more_chips_than_cores_is_warned(ray_one_chip_per_core, caplog):
    from workers.cluster import cpu_chip_warnings

    assert cpu_chip_warnings([1, len(HOST_CORES)]) == []
    with caplog.at_level("WARNING", logger="workers.cluster"):
        (warning,) = cpu_chip_warnings([1, 2 * len(HOST_CORES)])
    assert f"up to {2 * len(HOST_CORES)} CPU chips" in warning and "share cores" in warning
    assert warning in caplog.text


@pytest.mark.slow  # 12 s; warm groups in the default tier: test_warm_pool.py
@pytest.mark.timeout(180)
def test_concurrent_trials_of_one_shape_on_all_chips_share_the_warm_group(
        ray_one_chip_per_core):
    # Every chip in one shape, two trials at once: the second must wait for the first's warm
    # group, not count on it while reserving chips of its own (that blocked it until the
    # placement timeout, the chips held by the idle group — the README demo on 2 cores).
    chips = len(HOST_CORES)
    spec = tiny_spec(modes=["all_gather", "p2p"], chips=[chips], seq_lens=[16 * chips,
                                                                        32 * chips])
    options = DriverOptions(placement_timeout_s=20)
    results = run_sweep(spec, MemorySink(), max_concurrent_trials=2, options=options)
    assert len(results) == 4
    assert all(r.status == "succeeded" for r in results), [(r.trial.key, r.error)
                                                           for r in results]
    assert_no_leaks()
