"""Packed documents in torch's training steps (TrainConfig.documents, issue 24 item 2).

One chip: run_training's first loss equals the hybrid decoder run on each document alone (loss
sums add up over the documents), and differs from the same tokens as one document. Under CP, on
a real 4-rank gloo group: run_cp_training with documents drawn from the seed, dp1×cp4 and
dp2×cp2 (each GDN mode, attention CP modes and both layouts over the four runs), has the one
chip's packed losses, and verify (loss and summed gradients against one chip on the same packed
global batch) stays within fp32 tolerance. Legend: dp replicas, T global tokens.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

from gdn_core.cp_modes import CPSettings
from gdn_core.data import synthetic_tokens
from gdn_core.packing import document_boundaries
from gdn_core.presets import get_preset
from gdn_core.torch_gdn import build_model, run_cp_training, run_training
from gdn_core.train_config import TrainConfig

from .torch_dist import run_in_process_group

MODEL = get_preset("tiny", layers="hybrid", num_layers=3)  # GDN, attention, GDN
T, TOL, CHIPS = 64, 1e-4, 4
DOCUMENTS = "uniform:5-24"  # several documents per sequence, some crossing shard edges
# (dp, GDN mode, attention CP mode, layout, param_sharding): two runs in the default tier (a
# 4-rank spawn costs most of its time), the other GDN modes in the slow tier.
RUNS = {
    "default": ((1, "p2p", "ring", "zigzag", "replicated"),
                (2, "ulysses", "ulysses", "contiguous", "fsdp")),
    "slow": ((1, "all_gather", "all_gather_kv", "contiguous", "zero1"),
             (2, "log_scan", "ring", "zigzag", "replicated")),
}


def train_cfg(dp: int = 1, **changes) -> TrainConfig:
    """batch_size per replica: two sequences in all, whatever the mesh."""
    return TrainConfig(batch_size=2 // dp, seq_len=T, documents=DOCUMENTS, **changes)


def run_name(run) -> str:
    dp, mode, attn_cp, layout, sharding = run
    return f"dp{dp}xcp{CHIPS // dp}-{mode}-{attn_cp}-{layout}-{sharding}"


def cp_job(rank: int, world_size: int, runs: tuple) -> dict:
    out = {}
    for run in runs:
        dp, mode, attn_cp, layout, sharding = run
        report = run_cp_training(MODEL, train_cfg(dp, param_sharding=sharding), group=None,
                                 cp=CPSettings(mode=mode, chips=world_size, dp=dp,
                                               attn_cp=attn_cp, layout=layout),
                                 steps=1, warmup_steps=1, verify=True)
        out[run_name(run)] = dataclasses.asdict(report)
    return out


@functools.cache
def cp_results(tier: str) -> list[dict]:
    return run_in_process_group(cp_job, world_size=CHIPS, args=(RUNS[tier],), timeout_s=150)


@functools.cache
def one_chip_losses(documents: str) -> list[float]:
    cfg = dataclasses.replace(train_cfg(), documents=documents)
    return run_training(MODEL, cfg, steps=1, warmup_steps=1).losses


def each_document_alone_loss() -> float:
    """The first step's loss: the seeded model on each document of each row by itself (its
    tokens and, as packed, the targets that follow them), summed over 2·T targets."""
    model = build_model(MODEL, train_cfg())
    tokens = torch.from_numpy(synthetic_tokens(batch_size=2, seq_len=T,
                                               vocab_size=MODEL.vocab_size)).long()
    cu = document_boundaries(DOCUMENTS, seq_len=T, seed=0)
    total = 0.0
    with torch.no_grad():
        for start, end in zip(cu, cu[1:]):
            piece = tokens[:, start:end + 1]
            total += model(piece[:, :-1], piece[:, 1:]).item()
    return total / tokens[:, 1:].numel()


@pytest.mark.timeout(120)
def test_one_chip_packed_loss_is_each_document_alone():
    cu = document_boundaries(DOCUMENTS, seq_len=T, seed=0)
    assert len(cu) >= 4, cu  # several documents, so a step that ignored them would differ
    packed = one_chip_losses(DOCUMENTS)[0]
    np.testing.assert_allclose(packed, each_document_alone_loss(), rtol=TOL)
    assert abs(packed - one_chip_losses("single")[0]) > 2e-5 * abs(packed)  # ~170 ulps


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("tier", "run"), [
    *(("default", run) for run in RUNS["default"]),
    *(pytest.param("slow", run, marks=pytest.mark.slow) for run in RUNS["slow"])],
    ids=lambda value: run_name(value) if isinstance(value, tuple) else value)
def test_cp_packed_step_equals_one_chip(tier, run):
    reports = [ranks[run_name(run)] for ranks in cp_results(tier)]
    losses = reports[0]["losses"]
    assert all(r["losses"] == losses for r in reports)
    np.testing.assert_allclose(losses, one_chip_losses(DOCUMENTS), rtol=TOL,
                               err_msg=run_name(run))
    assert reports[0]["verified_seq_len"] == T
    assert reports[0]["max_rel_err"] < TOL, (run_name(run), reports[0]["max_rel_err"])
