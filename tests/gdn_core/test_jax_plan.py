"""Compile-only plans of the JAX CP step (gdn_core.jax_gdn.plan) and the FLOPs read from HLO.

The plans compile for D of this process's 8 virtual CPU chips (tests/conftest.py). Oracles:
the analytic counts of gdn_core.flops and gdn_core.memory, and independent compiles at the
bisection's boundary.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import pytest

from gdn_core.flops.executed import hardware_flops_per_step
from gdn_core.jax_gdn.hlo_flops import matmul_flops_per_chip
from gdn_core.jax_gdn.plan import largest_fitting_seq_len, plan_cp_step, seq_len_granule
from gdn_core.presets import get_preset
from gdn_core.train_config import TrainConfig

MODEL = get_preset("tiny", num_layers=1)
LOCAL_TOKENS = 64


def _train(seq_len: int) -> TrainConfig:
    return TrainConfig(batch_size=1, seq_len=seq_len, dtype="float32")


@pytest.mark.timeout(120)
def test_matmul_flops_count_every_loop_trip_where_xla_counts_the_body_once():
    trips, m, k, n = 10, 64, 32, 48

    def scanned(x, w):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=trips)[0]

    x, w = jnp.ones((m, k)), jnp.ones((k, n))
    w_square = jnp.ones((k, k))
    forward = jax.jit(scanned).lower(x, w_square).compile()
    assert matmul_flops_per_chip(forward)["flops"] == trips * 2 * m * k * k
    assert forward.cost_analysis()["flops"] < trips * 2 * m * k * k / 2  # why we count ourselves

    backward = jax.jit(jax.grad(lambda w: scanned(x, w).sum())).lower(w_square).compile()
    counted = matmul_flops_per_chip(backward)
    assert counted["flops"] == 3 * trips * 2 * m * k * k and not counted["trip_count_unknown"]

    plain = jax.jit(lambda x, w: x @ w).lower(x, w).compile()
    assert matmul_flops_per_chip(plain)["flops"] == 2 * m * k * n

    def depthwise(x, kernel):
        return jax.lax.conv_general_dilated(x, kernel, (1,), [(3, 0)],
                                            dimension_numbers=("NWC", "WIO", "NWC"),
                                            feature_group_count=x.shape[-1])

    conv = jax.jit(depthwise).lower(jnp.ones((2, 100, 24)), jnp.ones((4, 1, 24))).compile()
    assert matmul_flops_per_chip(conv)["flops"] == 2 * (2 * 100 * 24) * 4


@pytest.mark.slow  # 5 to 9 compiles (40 s at D = 2, 3, 4 cold); plan trials run by default in
# tests/workers/test_plan_trials.py and test_matmul_flops_* above
@pytest.mark.timeout(400)
@pytest.mark.parametrize("chip_counts", [(2, 3, 4), tuple(range(2, 9))],
                         ids=lambda ds: f"D{ds[0]}-{ds[-1]}x{len(ds)}")
def test_plans_at_a_fixed_local_shard(chip_counts):
    """Sequence-sharded modes: memory per chip flat in D at a fixed local shard, compiled FLOPs
    per chip the analytic count's, p2p's bytes one state each way, all_gather's growing.
    By default D = 2, 3 (the first with a middle chip) and 4; every D from 2 to 8 under slow."""
    with ThreadPoolExecutor(2) as pool:  # XLA compiles without the GIL: both cores
        plans = dict(zip(chip_counts, pool.map(
            lambda D: plan_cp_step(MODEL, _train(D * LOCAL_TOKENS), mode="p2p", chips=D),
            chip_counts)))
    memory = [p.estimated_memory_bytes for p in plans.values()]
    assert max(memory) <= 1.05 * min(memory), memory
    for D, plan in plans.items():
        assert plan.chips == D and plan.seq_len == D * LOCAL_TOKENS
        analytic = hardware_flops_per_step(MODEL, mode="p2p", chips=D, batch=1,
                                           seq_len=D * LOCAL_TOKENS, framework="jax",
                                           remat="none").total / D
        assert 0.8 <= plan.matmul_flops_per_chip / analytic <= 1.25, (D, plan, analytic)
        assert not plan.trip_count_unknown
        assert plan.grad_sync_bytes_per_step > 0  # replicated weights: gradient all-reduce
    # p2p: a middle chip receives one state forward and one backward, whatever D (plus the
    # loss's scalar all-reduce, 2·(D−1)/D · 4 bytes).
    middle = [plans[D].cp_comm_bytes_per_step for D in chip_counts if D >= 3]
    assert max(middle) - min(middle) <= 8, middle
    low, high = chip_counts[0], chip_counts[-1]
    gathered = [plan_cp_step(MODEL, _train(D * LOCAL_TOKENS), mode="all_gather",
                             chips=D).cp_comm_bytes_per_step for D in (low, high)]
    # (D − 1) pairs: 3 against 1 at D = 4 (7 at D = 8), with room for the halo and the loss.
    assert gathered[1] > (high - 1) / (low - 1) / 2 * gathered[0], gathered


@pytest.mark.slow  # 5 compiles; plan trials run by default (test_plans_at_a_fixed_local_shard)
@pytest.mark.timeout(400)
def test_bisection_finds_the_boundary_that_compiles_confirm():
    D = 2
    granule = seq_len_granule(MODEL, chips=D)
    below, above = (plan_cp_step(MODEL, _train(k * granule), mode="p2p", chips=D)
                    for k in (3, 4))
    assert below.estimated_memory_bytes < above.estimated_memory_bytes
    budget = (below.estimated_memory_bytes + above.estimated_memory_bytes) // 2

    search = largest_fitting_seq_len(MODEL, _train(granule), mode="p2p", chips=D,
                                     budget_bytes=budget, max_seq_len=8 * granule)
    assert search.fits.seq_len == 3 * granule and search.exceeds.seq_len == 4 * granule
    assert search.fits.estimated_memory_bytes <= budget < search.exceeds.estimated_memory_bytes
    # The independent compiles either side say the same: the boundary is real.
    assert search.fits.estimated_memory_bytes == below.estimated_memory_bytes
    assert search.exceeds.estimated_memory_bytes == above.estimated_memory_bytes
    assert len(search.probes) <= 2 + 3  # both ends, then log2(8) halvings

    nothing = largest_fitting_seq_len(MODEL, _train(granule), mode="p2p", chips=D,
                                      budget_bytes=1, max_seq_len=8 * granule)
    assert nothing.fits is None and nothing.exceeds.seq_len == granule


def test_bisection_refuses_a_range_below_one_granule():
    with pytest.raises(ValueError, match="below one granule"):
        largest_fitting_seq_len(MODEL, _train(32), mode="p2p", chips=4, budget_bytes=10 ** 9,
                                max_seq_len=seq_len_granule(MODEL, chips=4) - 1)


def test_plan_refuses_more_chips_than_devices():
    with pytest.raises(ValueError, match="needs 16 devices"):
        plan_cp_step(MODEL, _train(16 * 16), mode="p2p", chips=16)
