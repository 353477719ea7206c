"""Packed documents through a local Ray (workers.driver → trial_runner → torch ranks on gloo):
a documents=uniform:… trial runs its step on the packed sequence, its stored key ends
/documents=…, its result records the setting, and its model FLOPs count attention per
document (the boundaries its step drew)."""

from __future__ import annotations

import pytest

from gdn_core.flops.model import model_flops_per_step
from gdn_core.packing import document_boundaries
from workers.driver import run_sweep
from workers.result_sink import JsonLinesSink, read_jsonl

from .conftest import assert_consistent_metrics, assert_no_leaks, tiny_spec

PACKED = "uniform:8-24"


@pytest.mark.timeout(120)
def test_a_packed_torch_trial_on_two_gloo_ranks_runs_and_is_stored_as_packed(local_ray,
                                                                             tmp_path):
    spec = tiny_spec(modes=["p2p"], chips=[2], documents=[PACKED], layers=["hybrid"],
                     attn_cps=["ring"], model={"preset": "tiny", "num_layers": 2})
    path = tmp_path / "packed.jsonl"
    (result,) = run_sweep(spec, JsonLinesSink.create(path, spec))
    assert_consistent_metrics(result)
    assert result.trial.documents == PACKED
    assert result.trial.to_train_config().documents == PACKED

    (stored,) = [r for _, r in read_jsonl(path).results]
    assert stored.trial.key == ("torch/p2p/chips=2/seq_len=64/dtype=float32/param_sharding="
                                f"replicated/remat=none/layers=hybrid/attn_cp=ring/"
                                f"documents={PACKED}")
    assert stored.trial.documents == PACKED and stored.status == "succeeded"
    cu = document_boundaries(PACKED, seq_len=64, seed=0)
    model_cfg = result.trial.to_model_config()
    assert stored.metrics.model_flops_per_step == model_flops_per_step(
        model_cfg, batch=1, seq_len=64, cu_seqlens=cu).total
    assert stored.metrics.model_flops_per_step < model_flops_per_step(
        model_cfg, batch=1, seq_len=64).total
    assert 0 < stored.metrics.mfu <= 1
    assert_no_leaks()
