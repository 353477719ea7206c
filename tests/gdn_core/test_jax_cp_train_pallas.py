"""kernels="fused" in the JAX CP training step runs the Pallas chunk rule (issue 39): on a CPU
under GDN_SWEEP_INTERPRET_KERNELS=1, through Pallas's interpreter, recorded so; its gradients
against one chip's reference step (run_cp_training's verify: max_rel_err) within 1e-4.
Without the switch the step refuses to build on a CPU, with the reason a skipped trial records.

Default tier: the tiny gdn_only model, p2p on 2 virtual chips; the other modes and one chip
under `slow`."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from gdn_core.cp_modes import CPSettings
from gdn_core.interpreted_kernels import INTERPRET_ENV
from gdn_core.jax_gdn.cp import run_cp_training
from gdn_core.kernels import KernelUnavailable
from gdn_core.presets import get_preset
from gdn_core.train_config import TrainConfig

TINY = get_preset("tiny", num_layers=2)  # gdn_only: the GDN rule alone decides the kernels
TRAIN = TrainConfig(batch_size=1, seq_len=128, seed=3)
TOL = 1e-4
INTERPRETED = "gdn_core pallas chunk rule (interpreted)"


def train(mode: str, chips: int, *, verify: bool = True):
    return run_cp_training(TINY, TRAIN, mesh=Mesh(np.array(jax.devices()[:chips]), ("cp",)),
                           axis="cp", steps=1, warmup_steps=0, verify=verify,
                           cp=CPSettings(mode=mode, chips=chips, kernels="fused"))


def check(mode: str, chips: int):
    report = train(mode, chips)
    assert report.gdn_kernel == INTERPRETED and report.attention_kernel is None
    assert report.verified_seq_len == TRAIN.seq_len
    assert report.max_rel_err < TOL, report.max_rel_err
    assert np.isfinite(report.losses).all()


@pytest.mark.timeout(600)
def test_fused_step_runs_the_pallas_rule_interpreted_and_verifies(monkeypatch):
    monkeypatch.setenv(INTERPRET_ENV, "1")
    check("p2p", 2)


@pytest.mark.timeout(120)
def test_fused_step_on_a_cpu_without_the_switch_is_refused_with_the_reason(monkeypatch):
    monkeypatch.delenv(INTERPRET_ENV, raising=False)
    with pytest.raises(KernelUnavailable, match="the Pallas chunk rule needs a TPU or GPU; on "
                                                "a CPU set GDN_SWEEP_INTERPRET_KERNELS=1"):
        train("p2p", 2, verify=False)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode, chips", [("ulysses", 2), ("all_gather", 2), ("log_scan", 2),
                                         ("p2p", 1)])
def test_fused_step_other_modes_and_one_chip(monkeypatch, mode, chips):
    monkeypatch.setenv(INTERPRET_ENV, "1")
    check(mode, chips)
