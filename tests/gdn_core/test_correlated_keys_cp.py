"""Keys that share a direction through every PyTorch CP mode, against the float64 recurrence.

Spawned gloo ranks (tests/gdn_core/torch_dist.py) each run every mode on their contiguous
shard (value, final state, every input gradient); the gathered result must match the float64
token-by-token recurrence on the whole sequence. Inputs as in test_correlated_keys.py.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from gdn_core.cp_modes import CP_MODES, CPSettings
from gdn_core.testing import assert_close
from gdn_core.torch_gdn.cp import chunk_gated_delta_rule_cp

from .float64_reference import NAMES, float64_reference, loss_weights
from .rule_inputs import RuleCase, make_inputs
from .torch_dist import run_in_process_group

MODES = CP_MODES
TOL = 1e-5  # fp32 vs float64; measured ≤ 1e-6 (as the single-chip rule)


CASE = RuleCase(1, 192, 4, 8, 32, 16, "weak", 64, cosine=0.95)  # T/D = 96, 48: not ×64


@functools.cache
def inputs(D: int) -> dict[str, np.ndarray]:
    x = make_inputs(CASE, seed=D)
    x["g"][:, 7::29, 0] = -20.0  # a near-reset on some tokens of one head, near shard edges too
    return x


def rank_job(rank: int, D: int) -> dict:
    """Every mode on this rank's shard: o, the final state and the input gradients (numpy)."""
    x, w = inputs(D), loss_weights(inputs(D))
    t = x["q"].shape[1] // D
    seq = slice(rank * t, (rank + 1) * t)
    out = {}
    for mode in MODES:
        leaves = {n: torch.tensor(x[n] if n == "initial_state" else x[n][:, seq]).requires_grad_()
                  for n in NAMES}
        o, h = chunk_gated_delta_rule_cp(*(leaves[n] for n in NAMES[:5]), group=None, mode=mode,
                                         initial_state=leaves["initial_state"],
                                         output_final_state=True, use_qk_l2norm=True,
                                         chunk_size=CASE.chunk_size)
        # The final-state term weighted 1/D on every rank: the ranks' losses sum to the global one.
        loss = (o * torch.tensor(w["W_o"][:, seq])).sum() + (h * torch.tensor(w["W_h"])).sum() / D
        loss.backward()
        out[mode] = {n: (np.zeros_like(x[n][:, seq] if n != "initial_state" else x[n])
                         if leaves[n].grad is None else leaves[n].grad.numpy()) for n in NAMES}
        out[mode].update(o=o.detach().numpy(), final_state=h.detach().numpy())
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("D", [2, pytest.param(4, marks=pytest.mark.slow)], ids="D{}".format)
def test_torch_cp_modes_match_float64(D):
    ranks = run_in_process_group(rank_job, world_size=D, timeout_s=200)
    ref = float64_reference(inputs(D), loss_weights(inputs(D)), use_qk_l2norm=True)
    for mode in MODES:
        shards = [r[mode] for r in ranks]
        got = {n: np.concatenate([s[n] for s in shards], axis=1) for n in ("o",) + NAMES[:5]}
        got["initial_state"] = np.sum([s["initial_state"] for s in shards], axis=0)
        for s in shards:  # the final state is the global one on every rank
            assert_close(f"{mode} final_state", ref["final_state"], s["final_state"], TOL)
        for n in ("o",) + NAMES:
            assert_close(f"{mode} {'o' if n == 'o' else 'd' + n}", ref[n], got[n], TOL)


STEP_CASES = [("ulysses", "replicated", "none"), ("p2p", "fsdp", "full"),
              ("all_gather", "zero1", "gdn"), ("log_scan", "replicated", "full")]
STEP_TOL = 1e-4  # verify's metric (testing.max_verify_error); measured ≤ 1e-6


def step_job(rank: int, D: int) -> dict:
    """The CP training step's loss and gradients against one chip, with key weights that make
    a head's keys share a direction (test_torch_step_settings.realistic_gdn), per case."""
    from gdn_core.data import synthetic_tokens
    from gdn_core.torch_gdn.cp import context_parallel
    from gdn_core.torch_gdn.cp.sharding import shard_parameters
    from gdn_core.torch_gdn.cp.train import shard_batch, verify_against_single_chip
    from gdn_core.torch_gdn.train import build_model
    from gdn_core.train_config import TrainConfig

    from .test_torch_step_settings import CFG, mean_key_cosine, realistic_gdn

    errors = {}
    for mode, sharding, remat in STEP_CASES:
        train_cfg = TrainConfig(batch_size=1, seq_len=128, param_sharding=sharding, remat=remat)
        tokens_BT1 = torch.from_numpy(synthetic_tokens(batch_size=1, seq_len=128,
                                                       vocab_size=CFG.vocab_size)).long()
        model = realistic_gdn(build_model(CFG, train_cfg))
        cosine = mean_key_cosine(model, tokens_BT1[:, :-1])
        context_parallel(model, group=None, cp=CPSettings(mode=mode, chips=D))
        shard_parameters(model, train_cfg, group=None)
        inputs_Bt, targets_Bt = shard_batch(tokens_BT1, rank=rank, chips=D)
        errors[(mode, sharding, remat)] = (cosine, verify_against_single_chip(
            model, inputs_Bt, targets_Bt, tokens_BT1, model_cfg=CFG, train_cfg=train_cfg,
            group=None))
    return errors


@pytest.mark.timeout(240)
def test_cp_training_step_on_correlated_keys():
    """Every mode (with a sharding and remat each) equals one chip on keys sharing a direction."""
    errors = run_in_process_group(step_job, world_size=2, timeout_s=200)[0]
    for case, (cosine, err) in errors.items():
        assert cosine > 0.6, f"{case}: keys' mean |cosine| {cosine:.2f}: weights not realistic"
        assert err <= STEP_TOL, f"{case}: CP step vs one chip {err:.2e} > {STEP_TOL:.0e}"
