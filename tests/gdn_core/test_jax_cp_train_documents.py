"""Packed documents in JAX's training steps (TrainConfig.documents, issue 24 item 2), on
virtual CPU chips (the default tier: one dp2×cp2 run, losses only; its gradients and the
other modes in the slow tier).

One chip: the step's first loss equals the hybrid decoder's loss on each document alone (loss
sums add up over the documents), and differs from the same tokens as one document. Under CP:
run_cp_training with documents drawn from the seed, dp1×cp4 and dp2×cp2 meshes, has the one
chip's packed losses, and verify (loss and summed gradients against one chip on the same
packed global batch) stays within fp32 tolerance. Legend: dp replicas, T global tokens.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest

from gdn_core.cp_modes import CPSettings
from gdn_core.jax_gdn.cp import run_cp_training
from gdn_core.jax_gdn.cp.step import synthetic_batch
from gdn_core.jax_gdn.model import model_loss
from gdn_core.jax_gdn.params import init_model_params
from gdn_core.jax_gdn.train import run_training
from gdn_core.packing import document_boundaries
from gdn_core.train_config import TrainConfig

from .test_jax_cp_train import HYBRID, TOL
from .test_jax_dp_cp import dp_mesh

T = 64
# Documents of 12 tokens (the last cut to 4): boundaries inside chunks and shards, and only
# two document shapes for the one-chip oracle to compile.
DOCUMENTS = "uniform:12-12"


def train_cfg(dp: int = 1, documents: str = DOCUMENTS) -> TrainConfig:
    """Two sequences in all, whatever the mesh (batch_size is per replica)."""
    return TrainConfig(batch_size=2 // dp, seq_len=T, documents=documents, seed=3)


@functools.cache
def one_chip_losses(documents: str) -> list[float]:
    return run_training(HYBRID, train_cfg(documents=documents), steps=1, warmup_steps=1).losses


@pytest.mark.timeout(200)
def test_one_chip_packed_loss_is_each_document_alone():
    cfg = train_cfg()
    cu = document_boundaries(DOCUMENTS, seq_len=T, seed=cfg.seed)
    assert len(cu) >= 4, cu  # several documents, so a step that ignored them would differ
    params = init_model_params(HYBRID, jax.random.PRNGKey(cfg.seed))
    tokens = synthetic_batch(HYBRID, cfg)
    alone = jax.jit(functools.partial(model_loss, model_cfg=HYBRID, global_tokens=2 * T))
    # Each document's tokens and, as packed, the targets that follow them; rotary positions
    # only shift, which attention scores do not see.
    total = sum(float(alone(params, tokens[:, a:b], tokens[:, a + 1:b + 1]))
                for a, b in zip(cu, cu[1:]))
    packed = one_chip_losses(DOCUMENTS)[0]
    np.testing.assert_allclose(packed, total, rtol=TOL)
    # Near-uniform predictions of a fresh model: a small gap, still ~170 float32 ulps.
    single = float(alone(params, tokens[:, :-1], tokens[:, 1:]))  # the tokens as one document
    assert abs(packed - single) > 2e-5 * abs(packed)


def _case(mesh, verify, slow=True, **cp):
    dp = int(mesh[2:mesh.index("x")])
    settings = CPSettings(chips=4, dp=dp, **cp)
    return pytest.param(mesh, settings, verify, marks=[pytest.mark.slow] if slow else [],
                        id=f"{mesh}-{settings.mode}-{settings.attn_cp}"
                           + ("-verify" if verify else ""))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mesh", "cp", "verify"), [
    # The default tier checks the losses; gradients (verify: two more compiles, ~30 s on a
    # cold compile cache) in the slow tier.
    _case("dp2xcp2", False, slow=False, mode="ulysses", attn_cp="all_gather_kv"),
    _case("dp2xcp2", True, mode="ulysses", attn_cp="all_gather_kv"),
    _case("dp1xcp4", True, mode="p2p", attn_cp="ring", layout="zigzag"),
    _case("dp1xcp4", True, mode="all_gather", attn_cp="ulysses"),
    _case("dp2xcp2", True, mode="log_scan", attn_cp="ring", layout="zigzag"),
])
def test_cp_packed_step_equals_one_chip(mesh, cp, verify):
    cfg = train_cfg(cp.dp)
    report = run_cp_training(HYBRID, dataclasses.replace(cfg, param_sharding="fsdp"),
                             mesh=dp_mesh(mesh), axis="cp", batch_axis="dp", cp=cp, steps=1,
                             warmup_steps=1, verify=verify)
    np.testing.assert_allclose(report.losses, one_chip_losses(DOCUMENTS), rtol=TOL)
    if verify:
        assert report.verified_seq_len == T
        assert report.max_rel_err is not None and report.max_rel_err < TOL, report.max_rel_err
