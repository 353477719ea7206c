"""dp × cp trials end to end on a local Ray (issue 24 item 1): the sweep's dp reaches the step
in both frameworks (torch: one process group, CP sub-groups per replica; JAX: a (dp, cp) mesh),
each trial verifies against one chip on the global batch, and its metrics count every
replica's tokens over all the mesh's chips."""

from __future__ import annotations

import pytest

from workers.driver import run_sweep

from .conftest import MemorySink, assert_consistent_metrics, assert_no_leaks, tiny_spec


def _check(results, expected_meshes):
    assert {(r.trial.chips, r.trial.dp, r.trial.mode) for r in results} == expected_meshes
    for result in results:
        assert_consistent_metrics(result)
        m, t = result.metrics, result.trial
        assert m.max_rel_err < 1e-3  # against one chip on dp × batch_size sequences
        assert m.verified_seq_len == t.seq_len
    assert_no_leaks()


@pytest.mark.timeout(240)
def test_torch_pure_data_parallel_beside_cp_on_two_chips(local_ray):
    """chips 2 as dp 1 × cp 2 (p2p) and as dp 2 × cp 1 (no CP: mode none, run once)."""
    results = run_sweep(tiny_spec(modes=["p2p"], chips=[2], dp=[1, 2], verify=True),
                        MemorySink())
    _check(results, {(2, 1, "p2p"), (2, 2, "none")})
    pure = next(r for r in results if r.trial.dp == 2)
    assert pure.trial.key.endswith("/chips=2/dp=2/seq_len=64/dtype=float32"
                                   "/param_sharding=replicated/remat=none")
    assert pure.metrics.cp_comm_bytes_per_step_per_chip == 0  # replicas exchange no state


@pytest.mark.slow  # 22 s cold; JAX's (dp, cp) mesh by default: tests/gdn_core/test_jax_dp_cp.py
@pytest.mark.timeout(240)
def test_jax_pure_data_parallel_on_a_two_axis_mesh(local_ray):
    results = run_sweep(tiny_spec(frameworks=["jax"], modes=["p2p"], chips=[2], dp=[2],
                                  verify=True), MemorySink())
    _check(results, {(2, 2, "none")})


@pytest.mark.slow  # 4 rank processes / a 4-chip JAX compile per trial on 2 cores
@pytest.mark.timeout(600)
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_dp2_x_cp2_trials(local_ray, framework):
    results = run_sweep(tiny_spec(frameworks=[framework], modes=["all_gather", "ulysses"],
                                  chips=[4], dp=[2], verify=True,
                                  param_shardings=["zero1"]), MemorySink())
    _check(results, {(4, 2, "all_gather"), (4, 2, "ulysses")})
