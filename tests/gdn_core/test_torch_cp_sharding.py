"""param_sharding × remat of the PyTorch CP training step, on real gloo process groups.

The oracle is the replicated single-chip AdamW step on the full sequence (no remat). One
spawned job per D runs every case on every rank and returns numpy arrays; the tests compare.
FSDP2's collectives bypass the counted CP wrappers, so a dispatch-mode spy here counts their
bytes independently of sharding.weight_sync_bytes (the analytic count the report uses).
Legend: D ranks, B batch, t tokens per rank, N parameters.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from gdn_core.cp_modes import CP_MODES, CPSettings
from gdn_core.data import synthetic_tokens
from gdn_core.testing import assert_close
from gdn_core.torch_gdn import build_training, context_parallel, run_cp_training, train_step
from gdn_core.torch_gdn.cp import count_comm
from gdn_core.torch_gdn.cp.sharding import (
    build_sharded_optimizer,
    full_tensors,
    shard_parameters,
    state_bytes_per_rank,
    weight_sync_bytes,
)
from gdn_core.torch_gdn.cp.train import _GradientsOnly, gradient_sync, shard_batch
from gdn_core.torch_gdn.train import build_model
from gdn_core.train_config import PARAM_SHARDINGS, REMATS

from .test_torch_cp_layer import model_cfg
from .test_torch_cp_train import B, TOL, UPDATE_TOL, slow_decay, train_cfg
from .torch_dist import run_in_process_group

PAIRS = [(s, r) for s in PARAM_SHARDINGS for r in REMATS]
MODE = "p2p"  # the step matrix; every other mode runs fsdp + full remat (slow: every pair)
MODES = CP_MODES
GRAD_TOL = 1e-5
# bf16: FSDP2 gathers bf16 weight copies (so the residual stream is bf16 too); one chip runs
# autocast over fp32 weights. Measured max_verify_error at D = 2 (p2p, this init): one chip
# bf16 vs fp32 2.4e-2; CP replicated bf16 vs one chip bf16 6.5e-3; CP fsdp bf16 vs one chip
# bf16 2.8e-2 (and vs fp32 2.8e-2: as far from fp32 as autocast is).
BF16_TOL = 5e-2


class FSDPCollectiveSpy(TorchDispatchMode):
    """Bytes this rank receives in FSDP2's all-gathers and reduce-scatters (the c10d ops of
    flat buffers, which the CP wrappers do not use), and how many of each ran."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = {"all_gather": 0, "reduce_scatter": 0}
        self.calls = {"all_gather": 0, "reduce_scatter": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith("c10d::_allgather_base_"):
            out, inp = args[0], args[1]  # received: the output minus this rank's own part
            self._add("all_gather", out.nbytes - inp.nbytes)
        elif name.startswith("c10d::_reduce_scatter_base_"):
            out, inp = args[0], args[1]  # ring convention: (D−1)/D of the input
            self._add("reduce_scatter", inp.nbytes - out.nbytes)
        return func(*args, **(kwargs or {}))

    def _add(self, kind: str, nbytes: int) -> None:
        self.bytes[kind] += nbytes
        self.calls[kind] += 1


def sharded_cp_model(D: int, cfg):
    """The CP model of build_cp_training, with slow decay set before sharding (see slow_decay)."""
    model = slow_decay(build_model(model_cfg(D), cfg))
    context_parallel(model, group=None, cp=CPSettings(mode=MODE, chips=D))
    shard_parameters(model, cfg, group=None)
    return model, build_sharded_optimizer(model, cfg, group=None)


def full_weights(model) -> dict[str, np.ndarray]:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().numpy().copy()
            for n, p in model.named_parameters()}


def one_step(rank: int, D: int, sharding: str, remat: str) -> dict:
    """Gradients (summed over the group) and weights after one AdamW step, plus bytes."""
    cfg = dataclasses.replace(train_cfg(D), param_sharding=sharding, remat=remat)
    tokens = torch.from_numpy(synthetic_tokens(batch_size=B, seq_len=cfg.seq_len,
                                               vocab_size=model_cfg(D).vocab_size)).long()
    inputs, targets = shard_batch(tokens, rank=rank, chips=D)
    kwargs = dict(global_tokens=B * cfg.seq_len, dtype=cfg.dtype,
                  grad_sync=gradient_sync(sharding, group=None))
    model, optimizer = sharded_cp_model(D, cfg)
    train_step(model, _GradientsOnly(model.parameters()), inputs, targets, **kwargs)
    names = [n for n, _ in model.named_parameters()]
    full_grads = full_tensors([p.grad for p in model.parameters()])
    grads = {n: g.numpy().copy() for n, g in zip(names, full_grads)}
    model.zero_grad(set_to_none=True)
    spy = FSDPCollectiveSpy()
    with count_comm() as comm, spy:
        share = train_step(model, optimizer, inputs, targets, **kwargs)
    loss = torch.tensor([share], dtype=torch.float64)
    dist.all_reduce(loss)
    return {"loss": loss.item(), "grads": grads, "weights": full_weights(model),
            "state_bytes": state_bytes_per_rank(model, optimizer),
            "cp_forward": comm.forward_bytes - comm.bytes_of("grad_sync", "forward"),
            "cp_backward": comm.backward_bytes - comm.bytes_of("grad_sync", "backward"),
            "grad_sync_counted": comm.bytes_of("grad_sync"),
            "weight_sync": weight_sync_bytes(model, optimizer, cfg, group=None),
            "spy_bytes": spy.bytes, "spy_calls": spy.calls}


def verified_run(D: int, mode: str, sharding: str, remat: str) -> dict:
    cfg = dataclasses.replace(train_cfg(D), param_sharding=sharding, remat=remat)
    return dataclasses.asdict(run_cp_training(model_cfg(D), cfg, group=None,
                                              cp=CPSettings(mode=mode, chips=D), steps=1,
                                              warmup_steps=0, verify=True))


def sharding_job(rank: int, D: int, pairs, runs) -> dict:
    out = {f"step-{s}-{r}": one_step(rank, D, s, r) for s, r in pairs}
    out.update({f"run-{m}-{s}-{r}": verified_run(D, m, s, r) for m, s, r in runs})
    return out


@functools.cache
def sharding_results(D: int) -> list[dict]:
    if D == 2:
        pairs = PAIRS
        runs = [(MODE, s, r) for s, r in PAIRS] + [(m, "fsdp", "full") for m in MODES
                                                     if m != MODE]
    else:  # the memory layout at larger D: replicated against fsdp
        pairs, runs = [("replicated", "none"), ("fsdp", "none")], []
    return run_in_process_group(sharding_job, world_size=D, args=(pairs, runs), timeout_s=400)


@functools.cache
def matrix_results(D: int) -> list[dict]:
    runs = [(m, s, r) for m in MODES for s, r in PAIRS]
    return run_in_process_group(sharding_job, world_size=D, args=([], runs), timeout_s=1200)


@functools.cache
def single_chip_step(D: int) -> dict:
    """The oracle: replicated, no remat, one chip, full sequence."""
    cfg = train_cfg(D)
    model, optimizer = build_training(model_cfg(D), cfg)
    before = full_weights(slow_decay(model))
    tokens = torch.from_numpy(synthetic_tokens(batch_size=B, seq_len=cfg.seq_len,
                                               vocab_size=model_cfg(D).vocab_size)).long()
    grads = {}
    loss = train_step(model, optimizer, tokens[:, :-1], tokens[:, 1:],
                      global_tokens=B * cfg.seq_len, dtype=cfg.dtype,
                      grad_sync=lambda m: grads.update(
                          {n: p.grad.numpy().copy() for n, p in m.named_parameters()}))
    return {"loss": loss, "before": before, "grads": grads, "weights": full_weights(model)}


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("sharding", "remat"), PAIRS, ids=[f"{s}-{r}" for s, r in PAIRS])
def test_one_step_equals_single_chip(sharding, remat):
    """Summed gradients and the weights after one AdamW step equal the one-chip step's, and
    are the same on both ranks (fsdp: the gathered shards)."""
    ranks, ref = [r[f"step-{sharding}-{remat}"] for r in sharding_results(2)], single_chip_step(2)
    case = f"{sharding}-{remat}-D2"
    assert abs(ranks[0]["loss"] - ref["loss"]) <= TOL * ref["loss"]
    assert list(ranks[0]["weights"]) == list(ref["weights"])
    for name, weight in ref["weights"].items():
        assert_close(f"{case}: grad {name}", ref["grads"][name], ranks[0]["grads"][name],
                     GRAD_TOL, floor=1e-3 * np.linalg.norm(ref["grads"][name]) + 1e-12)
        assert_close(f"{case}: {name}", weight, ranks[0]["weights"][name], TOL)
        assert_close(f"{case}: update of {name}", weight - ref["before"][name],
                     ranks[0]["weights"][name] - ref["before"][name], UPDATE_TOL)
        assert np.array_equal(ranks[1]["weights"][name], ranks[0]["weights"][name]), name


@pytest.mark.timeout(420)
@pytest.mark.parametrize("remat", REMATS)
def test_remat_reissues_one_forward_of_exchanges(remat):
    """CP bytes: remat none = forward + backward; full and gdn recompute every GDN layer's
    forward once in backward, so its exchanges are received once more (and counted)."""
    for rank, r in enumerate(sharding_results(2)):
        base, step = r["step-replicated-none"], r[f"step-replicated-{remat}"]
        extra = 0 if remat == "none" else base["cp_forward"]
        assert step["cp_forward"] == base["cp_forward"] + extra, rank
        assert step["cp_backward"] == base["cp_backward"], rank


@pytest.mark.timeout(420)
@pytest.mark.parametrize("sharding", PARAM_SHARDINGS)
def test_weight_sync_bytes(sharding):
    """replicated: the counted all-reduce (2·(D−1)/D·4N); zero1: that plus the broadcast of
    the other rank's parameters; fsdp: no all-reduce, and weight_sync_bytes equals the spy's
    count of FSDP2's all-gathers (forward + backward of each block, the root once) and
    reduce-scatters. CP bytes do not depend on the sharding."""
    D, n_params = 2, sum(w.size for w in single_chip_step(2)["weights"].values())
    n_blocks = model_cfg(2).num_layers
    for rank, r in enumerate(sharding_results(2)):
        step = r[f"step-{sharding}-none"]
        assert step["cp_forward"] == r["step-replicated-none"]["cp_forward"], rank
        if sharding == "fsdp":
            assert step["grad_sync_counted"] == 0
            assert step["spy_calls"] == {"all_gather": 2 * n_blocks + 1,
                                         "reduce_scatter": n_blocks + 1}, step["spy_calls"]
            assert step["weight_sync"] == sum(step["spy_bytes"].values()) > 0
            continue
        assert step["grad_sync_counted"] == 2 * (D - 1) * 4 * n_params // D
        assert step["spy_calls"] == {"all_gather": 0, "reduce_scatter": 0}
        if sharding == "zero1":
            assert 0 < step["weight_sync"] < 4 * n_params
        else:
            assert step["weight_sync"] == 0
    if sharding == "zero1":  # every parameter reaches the D − 1 ranks that do not own it
        total = sum(r["step-zero1-none"]["weight_sync"] for r in sharding_results(2))
        assert total == (D - 1) * 4 * n_params


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("sharding", "remat"), PAIRS, ids=[f"{s}-{r}" for s, r in PAIRS])
def test_run_cp_training_verify_and_bytes(sharding, remat):
    """verify_against_single_chip holds under every pair; the report's grad_sync bytes are the
    counted all-reduce plus weight_sync_bytes, its comm_source names the analytic part."""
    for r in sharding_results(2):
        rep, step = r[f"run-{MODE}-{sharding}-{remat}"], r[f"step-{sharding}-{remat}"]
        assert rep["max_rel_err"] < TOL, rep["max_rel_err"]
        assert rep["grad_sync_bytes_per_step"] == step["grad_sync_counted"] + step["weight_sync"]
        assert rep["cp_comm_bytes_per_step"] == step["cp_forward"] + step["cp_backward"]
        assert rep["comm_source"].startswith("counted_collectives")
        assert (sharding == "replicated") == (rep["comm_source"] == "counted_collectives")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("mode", [m for m in MODES if m != MODE])
def test_other_modes_under_fsdp_and_full_remat(mode):
    """FSDP2's gathers and the recomputed exchanges interleave with every mode's own."""
    for r in sharding_results(2):
        assert r[f"run-{mode}-fsdp-full"]["max_rel_err"] < TOL, mode


@pytest.mark.slow
@pytest.mark.timeout(1300)
@pytest.mark.parametrize("D", [4, 8], ids="D{}".format)
@pytest.mark.parametrize("mode", MODES)
def test_verify_matrix(mode, D):
    """Every mode × param_sharding × remat at D = 4 and 8 matches one chip (verify)."""
    for r in matrix_results(D):
        for sharding, remat in PAIRS:
            err = r[f"run-{mode}-{sharding}-{remat}"]["max_rel_err"]
            assert err < TOL, (mode, sharding, remat, D, err)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("D", [2, pytest.param(4, marks=pytest.mark.slow),
                               pytest.param(8, marks=pytest.mark.slow)], ids="D{}".format)
def test_fsdp_state_bytes_per_rank(D):
    """Parameters, gradients and AdamW state per rank: replicated holds 4N + 4N + 8N bytes;
    fsdp ≈ that ÷ D, plus the padding of dim 0 to a multiple of D (≤ D−1 rows a tensor)."""
    n_params = sum(w.size for w in single_chip_step(D)["weights"].values())
    for r in sharding_results(D):
        rep = r["step-replicated-none"]["state_bytes"]
        shard = r["step-fsdp-none"]["state_bytes"]
        assert rep["params"] == rep["grads"] == 4 * n_params
        assert rep["optimizer"] >= 8 * n_params
        total_rep, total_shard = sum(rep.values()), sum(shard.values())
        assert total_shard < total_rep / D * 1.1 + 16 * 1024, (total_shard, total_rep, D)
        assert total_shard > total_rep / D * 0.8, (total_shard, total_rep, D)


@pytest.mark.timeout(420)
def test_zero1_shards_only_optimizer_state():
    n_params = sum(w.size for w in single_chip_step(2)["weights"].values())
    states = [r["step-zero1-none"]["state_bytes"] for r in sharding_results(2)]
    assert all(s["params"] == s["grads"] == 4 * n_params for s in states)
    assert sum(s["optimizer"] for s in states) == sharding_results(2)[0][
        "step-replicated-none"]["state_bytes"]["optimizer"]
    assert all(0 < s["optimizer"] < 8 * n_params for s in states)


def bf16_job(rank: int, D: int) -> dict:
    out = {}
    for sharding in ("replicated", "fsdp"):
        cfg = dataclasses.replace(train_cfg(D), param_sharding=sharding, remat="full",
                                  dtype="bfloat16")
        report = run_cp_training(model_cfg(D), cfg, group=None,
                                 cp=CPSettings(mode=MODE, chips=D), steps=2, warmup_steps=1,
                                 verify=True)
        out[sharding] = dataclasses.asdict(report)
    return out


@pytest.mark.timeout(300)
def test_bf16_fsdp_verify():
    """bf16 (fsdp: bf16 gathered weights, fp32 reduce) against one chip's bf16 autocast; the
    gathers move bf16, so fsdp's all-gather bytes are half of fp32's; losses fall."""
    results = run_in_process_group(bf16_job, world_size=2, args=(), timeout_s=280)
    fp32 = sharding_results(2)[0]["step-fsdp-full"]
    for sharding in ("replicated", "fsdp"):
        rep = results[0][sharding]
        assert rep["max_rel_err"] < BF16_TOL, (sharding, rep["max_rel_err"])
        assert rep["losses"][-1] < rep["losses"][0], rep["losses"]
    gathered_fp32 = fp32["spy_bytes"]["all_gather"]
    reduced_fp32 = fp32["spy_bytes"]["reduce_scatter"]
    assert results[0]["fsdp"]["grad_sync_bytes_per_step"] == gathered_fp32 // 2 + reduced_fp32
