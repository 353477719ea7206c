"""Data parallel × context parallel JAX steps: dp replicas of a CP group on a 2-D mesh.

Legend: dp replicas (mesh axis "dp", the step's batch_axis), D chips of one replica's CP group
(axis "cp"), B sequences per replica, T tokens per sequence. Meshes are named dp{dp}xcp{D}
("cp2xdp2": the same chips with the replica axis minor). Oracle: the single-chip step
(jax_gdn.train) on the same global batch of dp·B sequences (step.synthetic_batch(…, dp)) and
the same weights. The gradients are checked through AdamW's moments after one step, as in
test_jax_cp_train (mu = 0.1·g, nu = 0.001·g²), and by verify's own comparison.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from gdn_core.cp_modes import CPSettings
from gdn_core.jax_gdn.cp import make_cp_train_step, run_cp_training
from gdn_core.jax_gdn.cp.step import cp_training_inputs, synthetic_batch
from gdn_core.jax_gdn.cp.train import comm_bytes_per_chip, compile_cp_train_step
from gdn_core.jax_gdn.cp.verify import verify_against_single_chip
from gdn_core.jax_gdn.hlo_comm import received_bytes_per_chip
from gdn_core.jax_gdn.params import init_model_params
from gdn_core.jax_gdn.plan import plan_cp_step
from gdn_core.jax_gdn.train import make_optimizer, make_train_step
from gdn_core.testing import assert_close
from gdn_core.train_config import TrainConfig

from .hlo_programs import LOSS, WEIGHTS, hlo_program
from .test_jax_cp_train import (HYBRID, MODEL, TOL, TRAIN, expected_cp_bytes, leaves,
                                weight_traffic_bytes)

MESHES = {"dp2xcp2": (("dp", 2), ("cp", 2)), "dp1xcp4": (("dp", 1), ("cp", 4)),
          "cp2xdp2": (("cp", 2), ("dp", 2))}


def dp_mesh(name: str) -> Mesh:
    axes = MESHES[name]
    shape = tuple(size for _, size in axes)
    devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
    return Mesh(devices, tuple(axis for axis, _ in axes))


def replicas(name: str) -> int:
    return dict(MESHES[name])["dp"]


def cp_chips(name: str) -> int:
    return dict(MESHES[name])["cp"]


def loss_sum_bytes(chips: int) -> int:
    """The loss psum's ring all-reduce of one float32 over `chips` (counted as CP traffic)."""
    return 2 * (chips - 1) * 4 // chips


@functools.cache
def single_chip_step(dp: int):
    """(params, opt_state, loss) after one replicated one-chip step on the dp·B global batch."""
    params = init_model_params(MODEL, jax.random.PRNGKey(TRAIN.seed))
    tokens_BT1 = synthetic_batch(MODEL, TRAIN, dp)
    args = (params, make_optimizer(TRAIN).init(params), tokens_BT1[:, :-1], tokens_BT1[:, 1:])
    step = make_train_step(MODEL, TRAIN, global_tokens=tokens_BT1[:, 1:].size)
    return jax.device_get(step.lower(*args).compile()(*args))


def assert_matches_single_chip(dp: int, params, opt_state, loss) -> None:
    params_ref, opt_state_ref, loss_ref = single_chip_step(dp)
    assert_close("loss", loss_ref, loss, TOL)
    for (name, ref), (_, got) in zip(leaves(params_ref), leaves(params), strict=True):
        assert_close(f"params{name}", ref, got, TOL)
    for (name, ref), (_, got) in zip(leaves(opt_state_ref), leaves(opt_state), strict=True):
        assert_close(f"opt_state{name}", ref, got, TOL)


# Every GDN mode on dp2xcp2 and dp1xcp4, every param_sharding on dp2xcp2; the replica axis
# minor once (cp2xdp2). By default log_scan replicated (~17 s cold, the oracle's compile
# included; zero1 compiles ~15 s more), fsdp on dp2xcp2 in the report test below.
STEP_CASES = [("log_scan", "dp2xcp2", "replicated")] + [
    pytest.param(*case, marks=pytest.mark.slow) for case in [
        ("ulysses", "dp2xcp2", "fsdp"), ("p2p", "dp2xcp2", "replicated"),
        ("all_gather", "dp2xcp2", "fsdp"), ("log_scan", "dp2xcp2", "zero1"),
        ("ulysses", "dp1xcp4", "replicated"), ("p2p", "dp1xcp4", "zero1"),
        ("all_gather", "dp1xcp4", "replicated"), ("log_scan", "dp1xcp4", "fsdp"),
        ("p2p", "cp2xdp2", "zero1"), ("ulysses", "cp2xdp2", "replicated")]]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode,mesh_name,sharding", STEP_CASES)
def test_dp_cp_step_matches_single_chip(mode, mesh_name, sharding):
    mesh, dp = dp_mesh(mesh_name), replicas(mesh_name)
    train_cfg = dataclasses.replace(TRAIN, param_sharding=sharding)
    program = compile_cp_train_step(MODEL, train_cfg, mesh=mesh, axis="cp",
                                    cp=CPSettings(mode=mode, chips=mesh.devices.size,
                                                  dp=dp), batch_axis="dp")
    inputs = cp_training_inputs(MODEL, train_cfg, mesh=mesh, axis="cp", batch_axis="dp")
    assert inputs[2].shape == (dp * TRAIN.batch_size, TRAIN.seq_len)
    assert_matches_single_chip(dp, *jax.device_get(program.compiled(*inputs)))
    # CP bytes per chip are one replica's; the weights' traffic spans all dp·D chips.
    D = cp_chips(mesh_name)
    assert program.cp_comm_bytes_per_step == (expected_cp_bytes(mode, D, TRAIN.seq_len)
                                              - loss_sum_bytes(D) + loss_sum_bytes(dp * D))
    assert program.grad_sync_bytes_per_step == weight_traffic_bytes(sharding, "none", dp * D)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["log_scan", pytest.param("ulysses", marks=pytest.mark.slow),
                                  pytest.param("p2p", marks=pytest.mark.slow),
                                  pytest.param("all_gather", marks=pytest.mark.slow)])
def test_cp_bytes_per_chip_are_one_replicas(mode):
    # dp2xcp2 against a dp1xcp2 run of the same per-replica shape (compiled, not run): the
    # CP exchanges stay inside a replica, so each chip receives the same bytes, apart from the
    # loss sum, which spans all four chips instead of two. The gradient all-reduce spans all.
    with_replicas = compile_cp_train_step(MODEL, TRAIN, mesh=dp_mesh("dp2xcp2"), axis="cp",
                                          cp=CPSettings(mode=mode, chips=4, dp=2),
                                          batch_axis="dp")
    one_replica = compile_cp_train_step(MODEL, TRAIN, mesh=Mesh(np.array(jax.devices()[:2]),
                                                                ("cp",)), axis="cp",
                                        cp=CPSettings(mode=mode, chips=2))
    assert (with_replicas.cp_comm_bytes_per_step - loss_sum_bytes(4)
            == one_replica.cp_comm_bytes_per_step - loss_sum_bytes(2))
    assert one_replica.cp_comm_bytes_per_step == expected_cp_bytes(mode, 2, TRAIN.seq_len)
    assert with_replicas.grad_sync_bytes_per_step == weight_traffic_bytes("replicated", "none", 4)


@pytest.mark.timeout(300)
def test_run_cp_training_reports_every_chip_of_the_mesh():
    train_cfg = dataclasses.replace(TRAIN, param_sharding="fsdp")
    report = run_cp_training(MODEL, train_cfg, mesh=dp_mesh("dp2xcp2"), axis="cp",
                             batch_axis="dp", cp=CPSettings(mode="p2p", chips=4, dp=2),
                             steps=1, warmup_steps=0)
    assert (report.mode, report.chips, report.dp) == ("p2p", 4, 2)
    assert report.memory_source == "process_rss_peak/4_chips"
    assert_close("first loss", single_chip_step(2)[2], report.losses[0], TOL)
    assert report.cp_comm_bytes_per_step == (expected_cp_bytes("p2p", 2, TRAIN.seq_len)
                                             - loss_sum_bytes(2) + loss_sum_bytes(4))
    assert report.grad_sync_bytes_per_step == weight_traffic_bytes("fsdp", "none", 4)


@pytest.mark.timeout(300)
def test_plan_compiles_a_dp_cp_mesh():
    # The report test's program (same mesh shape, settings and shapes): a compile it shares.
    train_cfg = dataclasses.replace(TRAIN, param_sharding="fsdp")
    plan = plan_cp_step(MODEL, train_cfg, mode="p2p", chips=4, dp=2)
    assert (plan.chips, plan.dp, plan.seq_len) == (4, 2, TRAIN.seq_len)
    assert plan.cp_comm_bytes_per_step == (expected_cp_bytes("p2p", 2, TRAIN.seq_len)
                                           - loss_sum_bytes(2) + loss_sum_bytes(4))
    assert plan.grad_sync_bytes_per_step == weight_traffic_bytes("fsdp", "none", 4)
    with pytest.raises(ValueError, match=r"dp=3 does not divide chips=4"):
        plan_cp_step(MODEL, train_cfg, mode="p2p", chips=4, dp=3)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode, sharding", [
    pytest.param("p2p", "replicated", marks=pytest.mark.slow),  # 10 s
    pytest.param("all_gather", "zero1", marks=pytest.mark.slow),
    pytest.param("ulysses", "fsdp", marks=pytest.mark.slow)])
def test_verify_on_correlated_keys_over_the_global_batch(mode, sharding):
    """verify's CP loss and gradients (dp2xcp2) equal one chip's on the whole global batch
    when a head's keys share a direction (test_torch_step_settings.realistic_gdn)."""
    import torch

    from gdn_core.jax_gdn.params import from_state_dict
    from gdn_core.torch_gdn import GDNLanguageModel

    from .test_torch_step_settings import mean_key_cosine, realistic_gdn

    torch_model = realistic_gdn(GDNLanguageModel(MODEL, seed=TRAIN.seed))
    train_cfg = dataclasses.replace(TRAIN, param_sharding=sharding)
    tokens_BT1 = synthetic_batch(MODEL, train_cfg, 2)
    assert mean_key_cosine(torch_model, torch.from_numpy(tokens_BT1[:, :-1]).long()) > 0.6
    mesh = dp_mesh("dp2xcp2")
    params, *_ = cp_training_inputs(MODEL, train_cfg, mesh=mesh, axis="cp", batch_axis="dp",
                                    params=from_state_dict(torch_model.state_dict()))
    error = verify_against_single_chip(params, tokens_BT1, MODEL, train_cfg, mesh=mesh, axis="cp",
                                       cp=CPSettings(mode=mode, chips=4, dp=2), batch_axis="dp")
    assert error < TOL, f"{mode} {sharding}: {error:.2e}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hybrid_dp_cp_trial_verifies_against_one_chip():
    # Attention layers (ulysses, zigzag) beside log_scan GDN layers, two replicas: the
    # attention exchanges and rotary positions stay inside a replica too.
    train_cfg = TrainConfig(batch_size=1, seq_len=64, seed=3)
    cp = CPSettings(mode="log_scan", chips=4, dp=2, attn_cp="ulysses", layout="zigzag")
    report = run_cp_training(HYBRID, train_cfg, mesh=dp_mesh("dp2xcp2"), axis="cp",
                             batch_axis="dp", cp=cp, steps=1, warmup_steps=0, verify=True)
    assert (report.chips, report.dp, report.attn_cp) == (4, 2, "ulysses")
    assert report.verified_seq_len == 64
    assert report.max_rel_err is not None and report.max_rel_err < TOL


@pytest.mark.timeout(60)
def test_dp_settings_errors_name_the_numbers():
    mesh = dp_mesh("dp2xcp2")
    with pytest.raises(ValueError, match=r"cp.dp=2 needs batch_axis"):
        run_cp_training(MODEL, TRAIN, mesh=mesh, axis="cp",
                        cp=CPSettings(mode="p2p", chips=4, dp=2), steps=1)
    with pytest.raises(ValueError, match=r"cp.dp=1 but batch_axis 'dp' spans 2 chips"):
        run_cp_training(MODEL, TRAIN, mesh=mesh, axis="cp", batch_axis="dp",
                        cp=CPSettings(mode="p2p", chips=2), steps=1)
    with pytest.raises(ValueError, match=r"cp.chips=8 / cp.dp=2 = 4 CP chips, but mesh axis "
                                         r"'cp' spans 2 chips"):
        run_cp_training(MODEL, TRAIN, mesh=mesh, axis="cp", batch_axis="dp",
                        cp=CPSettings(mode="p2p", chips=8, dp=2), steps=1)
    with pytest.raises(ValueError, match=r"dp=3 does not divide chips=4"):
        CPSettings(mode="p2p", chips=4, dp=3)
    with pytest.raises(ValueError, match=r"batch_axis='data' must name one axis of the mesh "
                                         r"\('dp', 'cp'\)"):
        make_cp_train_step(MODEL, TRAIN, mesh=mesh, axis="cp",
                           cp=CPSettings(mode="p2p", chips=4, dp=2), batch_axis="data")
    with pytest.raises(ValueError, match=r"batch_axis='cp' is also a sequence axis"):
        cp_training_inputs(MODEL, TRAIN, mesh=mesh, axis="cp", batch_axis="cp")
    with pytest.raises(ValueError, match=r"tokens_BT1 has shape \(2, 121\); the global batch "
                                         r"is \(4, 121\): dp=2"):
        verify_against_single_chip(None, synthetic_batch(MODEL, TRAIN), MODEL, TRAIN, mesh=mesh,
                                   axis="cp", cp=CPSettings(mode="p2p", chips=4, dp=2),
                                   batch_axis="dp")


# HLO of a step on a 4-chip dp × CP mesh: collectives over the CP axis alone have one replica
# group per replica (contiguous ids when the replica axis is major, strided when it is minor),
# those over both axes one group of all chips.
EXCHANGE = 'jit(shard_step)/shard_map/jvp()/all_to_all'


def four_chip_program(*collectives: str) -> str:
    return hlo_program(*collectives, partitions=4)


@pytest.mark.parametrize("groups", ["{{0,1},{2,3}}", "{{0,2},{1,3}}", "[2,2]<=[2,2]T(1,0)"],
                         ids=["replica-major", "replica-minor", "iota-transposed"])
def test_hlo_bytes_of_a_cp_collective_count_each_chip_in_its_own_replica(groups):
    text = four_chip_program(f'%a2a = f32[64]{{0}} all-to-all(%s), replica_groups={groups}, '
                       f'dimensions={{0}}, metadata={{op_name="{EXCHANGE}"}}')
    # Groups of G = 2: each chip receives the half of 256 bytes its partner sends, not 3/4.
    assert received_bytes_per_chip(text, 4)["per_chip"] == [128] * 4


def test_hlo_bytes_split_cp_traffic_from_all_chip_weight_traffic():
    text = four_chip_program(
        f'%ar = (f32[1024]{{0}}, f32[]) all-reduce(%g, %l), replica_groups={{{{0,1,2,3}}}}, '
        f'to_apply=%add, metadata={{op_name="{WEIGHTS}:{LOSS}"}}',
        f'%cp = f32[64]{{0}} collective-permute(%s), source_target_pairs={{{{0,1}},{{2,3}}}}, '
        f'metadata={{op_name="jit(shard_step)/shard_map/ppermute"}}')
    cp, weights = comm_bytes_per_chip(text, 4)
    assert weights == 2 * 3 * 4096 // 4  # the gradients' ring all-reduce over all four chips
    assert cp == 256 + loss_sum_bytes(4)  # chips 1 and 3 each receive from their replica's 0
