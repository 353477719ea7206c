"""The warm pool's bookkeeping: what it keeps, evicts and shuts down (groups stand in for
WorkerGroups by their chip request; the real groups run in the driver and fault tests)."""

from __future__ import annotations

import types

from workers.warm_pool import WarmPool


class _Group:
    def __init__(self, resource: str = "cpu_chip", chips: int = 2, framework: str = "torch",
                 accelerator_kind: str = "cpu"):
        request = types.SimpleNamespace(resource=resource, chips=chips, framework=framework,
                                        accelerator_kind=accelerator_kind,
                                        shape=(framework, chips, resource))
        self.chips = types.SimpleNamespace(request=request)
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


def test_a_group_given_back_while_a_trial_waits_for_its_kind_of_chip_is_shut_down():
    pool = WarmPool(enabled=True)
    with pool.waiting_for("cpu_chip", evict_idle=False):
        cpu, gpu = _Group(), _Group(resource="GPU")
        pool.give(cpu)
        pool.give(gpu)
    assert cpu.shut_down and pool.take(cpu.chips.request.shape) is None
    assert not gpu.shut_down and pool.take(gpu.chips.request.shape) is gpu


def test_a_retry_evicts_idle_groups_of_its_kind_and_the_pool_keeps_groups_again_after():
    pool = WarmPool(enabled=True)
    idle, other = _Group(), _Group(resource="GPU")
    pool.give(idle)
    pool.give(other)
    with pool.waiting_for("cpu_chip", evict_idle=True):
        assert idle.shut_down and not other.shut_down
        assert pool.idle_chips("cpu_chip") == 0
    later = _Group()
    pool.give(later)
    assert not later.shut_down and pool.idle_chips("cpu_chip") == 2


def test_jax_groups_on_gpu_or_tpu_are_never_reused_so_each_trial_measures_its_own_peak():
    pool = WarmPool(enabled=True)
    kept = [_Group(framework="jax"), _Group(resource="GPU", accelerator_kind="gpu")]
    fresh = [_Group(resource="GPU", framework="jax", accelerator_kind="gpu"),
             _Group(resource="TPU", framework="jax", accelerator_kind="tpu")]
    for group in kept + fresh:
        pool.give(group)
    assert [g.shut_down for g in kept] == [False, False]  # JAX on CPU, torch on GPU: reset
    assert [g.shut_down for g in fresh] == [True, True]
    assert pool.take(fresh[0].chips.request.shape) is None
