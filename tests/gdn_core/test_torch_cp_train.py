"""Context-parallel training step and runner, every mode, on real gloo process groups.

The oracle is the single-chip training step (`train_step`, `run_training`) on the full
sequence. One spawned job per D runs every case on every rank and returns numpy arrays and
reports; the tests only compare. Legend: D ranks, t tokens per rank, B batch, N parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gdn_core.cp_modes import CP_MODES, CPSettings
from gdn_core.data import synthetic_tokens
from gdn_core.memory.step import predict_step_memory
from gdn_core.memory.verify import verify_reference_memory
from gdn_core.testing import assert_close
from gdn_core.torch_gdn import (
    GatedDeltaNet,
    build_training,
    run_cp_training,
    run_training,
    train_step,
)
from gdn_core.torch_gdn.cp import context_parallel, sum_gradients
from gdn_core.torch_gdn.cp.train import shard_batch
from gdn_core.train_config import TrainConfig

from .test_torch_cp_layer import layer_comm_bytes, model_cfg
from .torch_dist import run_in_process_group

MODES = CP_MODES
# D = 2 in the default tier; D = 4 and 8 in the slow tier (test_torch_cp.py keeps D = 4 at the
# rule level: p2p's multi-hop wavefront and log_scan's second round).
DS = [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)]
B, T_LOCAL, TOL = 2, 24, 1e-4  # t = 24: not a multiple of the 16-token chunk
STEPS, WARMUP = 2, 1
# AdamW's first update is ≈ lr·g/(|g| + 1e-8): elements with tiny gradients pass their fp32
# round-off on at full size. Measured ≤ 5.2e-5 (in_proj_qkv, D = 2); weights ≤ 7.6e-6.
UPDATE_TOL = 1e-3
# bf16 autocast on both sides; CP sums gradients of bf16 activations in another order.
# Measured max_rel_err 2.4e-3 (ulysses and p2p, D = 2).
BF16_TOL = 1e-2



def train_cfg(D: int, t: int = T_LOCAL) -> TrainConfig:
    return TrainConfig(batch_size=B, seq_len=D * t, learning_rate=3e-3, weight_decay=0.1)


@torch.no_grad()
def slow_decay(model):
    """Set every GDN layer's A to 0.02 … 0.5 (decay per token ≥ e^−0.7), in place.

    At the init's A up to 16 the A_log, dt_bias and in_proj_a gradients of the fast heads are
    ~1e-10 and fp32 round-off moves them by a few %; AdamW's first step (≈ g/(|g| + 1e-8))
    passes that on: one chip at chunk 32 vs 16 differs by 4e-3 in in_proj_a after one step,
    CP by 2e-3. With slow decay every gradient is well conditioned and 1e-4 tests CP.
    """
    for layer in model.modules():
        if isinstance(layer, GatedDeltaNet):
            layer.A_log.copy_(torch.linspace(0.02, 0.5, layer.A_log.numel()).log())
    return model


def np_weights(model) -> dict[str, np.ndarray]:
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def one_cp_step(rank: int, D: int, mode: str) -> dict:
    """One AdamW step under CP: the global loss and every weight afterwards (this rank)."""
    cfg = train_cfg(D)
    model, optimizer = build_training(model_cfg(D), cfg)
    context_parallel(slow_decay(model), group=None, cp=CPSettings(mode=mode, chips=D))
    tokens = torch.from_numpy(synthetic_tokens(batch_size=B, seq_len=cfg.seq_len,
                                               vocab_size=model_cfg(D).vocab_size)).long()
    inputs, targets = shard_batch(tokens, rank=rank, chips=D)
    share = train_step(model, optimizer, inputs, targets, global_tokens=B * cfg.seq_len,
                       dtype=cfg.dtype, grad_sync=functools.partial(sum_gradients, group=None))
    loss = torch.tensor([share], dtype=torch.float64)
    dist.all_reduce(loss)
    return {"loss": loss.item(), "weights": np_weights(model)}


def report_dict(report) -> dict:
    return dict(dataclasses.asdict(report), comm_bytes_per_step=report.comm_bytes_per_step)


def train_job(rank: int, D: int, runs: list[tuple[str, int, str]]) -> dict:
    """Everything one rank computes for world size D (runs inside the spawned process)."""
    out = {f"step-{m}": one_cp_step(rank, D, m) for m in MODES}
    for mode, t, dtype in runs:
        cfg = dataclasses.replace(train_cfg(D, t), dtype=dtype)
        report = run_cp_training(model_cfg(D), cfg, group=None,
                                 cp=CPSettings(mode=mode, chips=D), steps=STEPS,
                                 warmup_steps=WARMUP, verify=t == T_LOCAL)
        out[f"run-{mode}-t{t}-{dtype}"] = report_dict(report)
    for name, cfg, chips in (
            ("indivisible", TrainConfig(batch_size=B, seq_len=D * T_LOCAL + 1), D),
            ("wrong_chips", train_cfg(D), D + 1)):
        try:
            run_cp_training(model_cfg(D), cfg, group=None,
                            cp=CPSettings(mode="p2p", chips=chips), steps=1)
            out[name] = "no error"
        except ValueError as e:
            out[name] = str(e)
    return out


def runs_for(D: int) -> list[tuple[str, int, str]]:
    """(mode, t, dtype) of the run_cp_training cases: every mode at two shard lengths (the
    shorter one verified), plus bf16 for two modes at D = 2."""
    runs = [(m, t, "float32") for m in MODES for t in (T_LOCAL, 2 * T_LOCAL)]
    return runs + ([(m, T_LOCAL, "bfloat16") for m in ("ulysses", "p2p")] if D == 2 else [])


@functools.cache
def train_results(D: int) -> list[dict]:
    """Spawn D gloo ranks once per D and run every case there."""
    return run_in_process_group(train_job, world_size=D, args=(runs_for(D),), timeout_s=180)


@functools.cache
def single_chip_step(D: int) -> dict:
    """One single-chip AdamW step on the full sequence: loss, weights before and after."""
    cfg = train_cfg(D)
    model, optimizer = build_training(model_cfg(D), cfg)
    before = np_weights(slow_decay(model))
    tokens = torch.from_numpy(synthetic_tokens(batch_size=B, seq_len=cfg.seq_len,
                                               vocab_size=model_cfg(D).vocab_size)).long()
    loss = train_step(model, optimizer, tokens[:, :-1], tokens[:, 1:],
                      global_tokens=B * cfg.seq_len, dtype=cfg.dtype)
    return {"loss": loss, "before": before, "weights": np_weights(model)}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", MODES)
def test_cp_step_matches_single_chip(mode, D):
    """After one AdamW step every weight equals the single-chip step's, bitwise equal on all
    ranks; the global loss equals the single-chip loss; the update itself matches too."""
    ranks, ref = [r[f"step-{mode}"] for r in train_results(D)], single_chip_step(D)
    case = f"{mode}-D{D}-B{B}-t{T_LOCAL}"
    assert abs(ranks[0]["loss"] - ref["loss"]) <= TOL * ref["loss"], (ranks[0]["loss"], ref)
    assert all(r["loss"] == ranks[0]["loss"] for r in ranks)
    assert list(ranks[0]["weights"]) == list(ref["weights"])
    for name, weight in ref["weights"].items():
        assert all(np.array_equal(r["weights"][name], ranks[0]["weights"][name]) for r in ranks)
        assert_close(f"{case}: {name}", weight, ranks[0]["weights"][name], TOL)
        # AdamW's first update is ≈ lr·sign(grad): a wrong gradient shows here at full size.
        assert_close(f"{case}: update of {name}", weight - ref["before"][name],
                     ranks[0]["weights"][name] - ref["before"][name], UPDATE_TOL)


@functools.cache
def single_chip_losses(D: int, t: int) -> list[float]:
    return run_training(model_cfg(D), train_cfg(D, t), steps=STEPS, warmup_steps=WARMUP).losses


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", MODES)
def test_run_cp_training_report(mode, D):
    """Global losses equal on all ranks and to run_training's; one time per measured step;
    verify's error < 1e-4 and the same on every rank."""
    for t in (T_LOCAL, 2 * T_LOCAL):
        reports = [r[f"run-{mode}-t{t}-float32"] for r in train_results(D)]
        ref = single_chip_losses(D, t)
        for rank, rep in enumerate(reports):
            assert rep["losses"] == reports[0]["losses"], rank
            assert len(rep["step_times_s"]) == STEPS and min(rep["step_times_s"]) > 0
            assert (rep["mode"], rep["chips"]) == (mode, D)
            assert rep["peak_memory_bytes"] > 0 and rep["memory_source"] == "process_rss_peak"
            assert rep["comm_source"] == "counted_collectives"
            # what ran, as the step resolved it (a trial's result stores these)
            assert (rep["gdn_kernel"], rep["attention_kernel"]) == (
                "reference torch chunk rule", None)
        losses = reports[0]["losses"]
        assert len(losses) == STEPS + WARMUP and all(math.isfinite(x) for x in losses)
        assert losses[-1] < losses[0], losses
        np.testing.assert_allclose(losses, ref, rtol=TOL)
        if t == T_LOCAL:
            assert all(r["max_rel_err"] == reports[0]["max_rel_err"] for r in reports)
            assert reports[0]["max_rel_err"] < TOL, reports[0]["max_rel_err"]
            # This host holds the whole sequence on one chip.
            assert all(r["verified_seq_len"] == D * t for r in reports)
        else:
            assert all(r["max_rel_err"] is None and r["verified_seq_len"] is None
                       for r in reports)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", MODES)
def test_run_cp_training_comm_bytes(mode, D):
    """grad sync = 2·(D−1)/D × 4 × N; CP bytes = num_layers × the layer's table (fwd + bwd),
    independent of the sequence length for the sequence-sharded modes."""
    n_params = sum(w.size for w in single_chip_step(D)["weights"].values())
    for rank, r in enumerate(train_results(D)):
        by_t = {}
        for t in (T_LOCAL, 2 * T_LOCAL):
            rep = r[f"run-{mode}-t{t}-float32"]
            assert rep["grad_sync_bytes_per_step"] == 2 * (D - 1) * 4 * n_params // D
            per_layer = layer_comm_bytes(model_cfg(D).gdn, mode, D=D, rank=rank, B=B, t=t)
            assert rep["cp_comm_bytes_per_step"] == model_cfg(D).num_layers * sum(per_layer)
            assert rep["comm_bytes_per_step"] == (rep["cp_comm_bytes_per_step"]
                                                  + rep["grad_sync_bytes_per_step"])
            by_t[t] = rep["cp_comm_bytes_per_step"]
        if mode != "ulysses":
            assert by_t[T_LOCAL] == by_t[2 * T_LOCAL], (rank, by_t)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["ulysses", "p2p"])
def test_run_cp_training_bf16(mode):
    """bf16 autocast under CP: losses fall, verify stays close to one chip, and activations
    (halo, ulysses all-to-alls) cross in bf16 while the state stays fp32."""
    reports = [r[f"run-{mode}-t{T_LOCAL}-bfloat16"] for r in train_results(2)]
    losses = reports[0]["losses"]
    assert all(r["losses"] == losses for r in reports)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    assert reports[0]["max_rel_err"] < BF16_TOL, reports[0]["max_rel_err"]
    for rank, rep in enumerate(reports):
        per_layer = layer_comm_bytes(model_cfg(2).gdn, mode, D=2, rank=rank, B=B, t=T_LOCAL,
                                     itemsize=2)
        assert rep["cp_comm_bytes_per_step"] == model_cfg(2).num_layers * sum(per_layer), rank


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
def test_run_cp_training_shape_error(D):
    msg = train_results(D)[0]["indivisible"]
    assert f"seq_len={D * T_LOCAL + 1} is not divisible by chips={D}" in msg, msg
    msg = train_results(D)[0]["wrong_chips"]
    assert f"cp.chips={D + 1} but the process group has {D} ranks" in msg, msg


def verify_prefix_job(rank: int, D: int, mode: str, budgets: dict) -> dict:
    """verified_seq_len and max_rel_err of a verified run under each named budget."""
    out = {}
    for name, budget in budgets.items():
        report = run_cp_training(model_cfg(D), train_cfg(D, 2 * T_LOCAL), group=None,
                                 cp=CPSettings(mode=mode, chips=D), steps=1, warmup_steps=0,
                                 verify=True,
                                 verify_memory_budget_bytes=budget)
        out[name] = (report.verified_seq_len, report.max_rel_err)
    return out


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["p2p", "ulysses"])
def test_verify_on_the_prefix_one_chip_holds(mode):
    """A budget that holds rank 0's state and the reference on 64 of the 96 tokens (valid
    prefixes: multiples of D × chunk = 32) verifies 64 tokens, on every rank; an ample budget
    the whole sequence; none that holds even 32 tokens verifies nothing."""
    D = 2
    cfg = train_cfg(D, 2 * T_LOCAL)
    resident = predict_step_memory(model_cfg(D), cfg, mode=mode, chips=D,
                                   framework="torch").resident_state
    reference = verify_reference_memory(model_cfg(D), cfg, seq_len=64, framework="torch").total
    budgets = {"tight": resident + reference, "ample": 2**40, "none": 0}
    ranks = run_in_process_group(verify_prefix_job, world_size=D, args=(mode, budgets),
                                 timeout_s=180)
    assert all(r == ranks[0] for r in ranks)
    (tight, tight_err), (ample, ample_err) = ranks[0]["tight"], ranks[0]["ample"]
    assert (tight, ample, ranks[0]["none"]) == (64, cfg.seq_len, (None, None))
    assert tight_err < TOL and ample_err < TOL, (tight_err, ample_err)
