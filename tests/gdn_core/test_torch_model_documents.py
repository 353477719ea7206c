"""Packed documents through the whole torch hybrid decoder (issue 24 item 2): GDN layers and
gated attention each mix every document as if alone, on one chip and under CP (each GDN mode
with an attention CP mode, both layouts) on real gloo groups. The oracle is the one-chip model
run on each document by itself: loss sums and gradients add up over the documents (rotary at
global positions changes nothing: attention scores depend on position differences only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_core.cp_layout import local_positions
from gdn_core.cp_modes import CPSettings
from gdn_core.data import synthetic_tokens
from gdn_core.presets import get_preset
from gdn_core.testing import assert_close, rel_err
from gdn_core.torch_gdn import HybridLanguageModel, context_parallel

from .torch_dist import run_in_process_group

MODEL = get_preset("tiny", layers="hybrid", num_layers=4)  # GDN, GDN, GDN, attention
T, TOL = 64, 1e-4
# A 1-token document, a boundary at the shard edge (32) and one inside each zigzag segment.
CU_SEQLENS = [0, 9, 10, 32, 45, 64]
# (GDN mode, attention CP mode, layout) on 2 ranks: every GDN mode, every attn_cp, both layouts.
CP_CASES = [("p2p", "ring", "zigzag"), ("all_gather", "all_gather_kv", "contiguous"),
            ("log_scan", "ulysses", "zigzag"), ("ulysses", "ring", "contiguous")]


def _tokens() -> torch.Tensor:
    return torch.from_numpy(synthetic_tokens(batch_size=1, seq_len=T,
                                             vocab_size=MODEL.vocab_size, seed=3)).long()


def _model() -> HybridLanguageModel:
    torch.manual_seed(0)
    return HybridLanguageModel(MODEL, seed=1)


def _loss_and_grads(model, tokens_BT1, **kwargs) -> tuple[float, dict[str, np.ndarray]]:
    model.zero_grad(set_to_none=True)
    loss = model(tokens_BT1[:, :-1], tokens_BT1[:, 1:], **kwargs)
    loss.backward()
    return loss.item(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def _each_document_alone() -> tuple[float, dict[str, np.ndarray]]:
    model, tokens = _model(), _tokens()
    total, grads = 0.0, None
    for start, end in zip(CU_SEQLENS, CU_SEQLENS[1:]):
        # The document's tokens and, as packed, the targets that follow each of them.
        loss, g = _loss_and_grads(model, tokens[:, start:end + 1])
        total += loss
        grads = g if grads is None else {n: grads[n] + g[n] for n in g}
    return total, grads


def _packed_one_chip() -> tuple[float, dict[str, np.ndarray]]:
    return _loss_and_grads(_model(), _tokens(), cu_seqlens=torch.tensor(CU_SEQLENS))


def _cp_job(rank: int, world_size: int) -> dict:
    """Every case's global loss sum and summed gradients over the group (rank order)."""
    import torch.distributed as dist

    tokens, out = _tokens(), {}
    for mode, attn_cp, layout in CP_CASES:
        model = context_parallel(_model(), group=None,
                                 cp=CPSettings(mode=mode, chips=world_size, attn_cp=attn_cp,
                                               layout=layout))
        positions = torch.from_numpy(local_positions(chip=rank, chips=world_size, seq_len=T,
                                                     layout=layout))
        inputs, targets = tokens[:, :-1][:, positions], tokens[:, 1:][:, positions]
        model.zero_grad(set_to_none=True)
        loss = model(inputs, targets, cu_seqlens=torch.tensor(CU_SEQLENS))
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        grads = {}
        for name, p in model.named_parameters():
            dist.all_reduce(p.grad)
            grads[name] = p.grad.numpy().copy()
        out[mode, attn_cp, layout] = (total.item(), grads)
    return out


def _assert_equal(actual, expected) -> None:
    (loss, grads), (ref_loss, ref_grads) = actual, expected
    assert abs(loss - ref_loss) <= TOL * abs(ref_loss), (loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    # Each gradient relative to its norm, floored at 1e-3 of the whole gradient's (as verify).
    floor = 1e-3 * np.sqrt(sum(float((g ** 2).sum()) for g in ref_grads.values()))
    for name in grads:
        assert_close(name, ref_grads[name], grads[name], TOL, floor=floor)


@pytest.mark.timeout(60)
def test_packed_hybrid_model_equals_each_document_alone_on_one_chip():
    alone, packed = _each_document_alone(), _packed_one_chip()
    _assert_equal(packed, alone)
    # The documents matter: ignoring the boundaries gives other gradients, far past TOL.
    _, unpacked = _loss_and_grads(_model(), _tokens())
    worst = max(rel_err(alone[1][n], unpacked[n]) for n in unpacked)
    assert worst > 100 * TOL, worst


@pytest.mark.timeout(120)
def test_packed_hybrid_model_under_cp_equals_one_chip():
    expected = _packed_one_chip()
    results = run_in_process_group(_cp_job, world_size=2, timeout_s=100)
    for case in CP_CASES:
        for rank_result in results:
            _assert_equal(rank_result[case], expected)
