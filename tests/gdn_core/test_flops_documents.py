"""Model FLOPs under packed documents (issue 24 item 2): attention is block-diagonal causal, so
its pairs are Σ d_i·(d_i + 1)/2 over the documents, not T·(T + 1)/2; the GDN rule and every
per-token matmul stay linear in T, unchanged. Counts recomputed by hand, pairs one by one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gdn_core.attention_documents import document_ids
from gdn_core.flops.attention import attention_layer_flops, causal_pairs, document_causal_pairs
from gdn_core.flops.executed import hardware_flops_per_step
from gdn_core.flops.model import model_flops_per_step, model_forward_flops
from gdn_core.packing import document_boundaries

from .test_flops import tiny_hybrid

PACKED_40 = (0, 7, 7, 19, 40)
"""Documents of 7, 0 (an empty one), 12 and 21 tokens in a 40-token sequence."""


def _visible_pairs(cu, seq_len: int) -> int:
    """(query, key) pairs a block-diagonal causal mask keeps, counted one by one."""
    doc = document_ids(cu, np.arange(seq_len))
    return sum(1 for q in range(seq_len) for k in range(q + 1) if doc[k] == doc[q])


@pytest.mark.parametrize("cu", [PACKED_40, (0, 40), (0, 1, 2, 40), tuple(range(41))],
                         ids=["7-0-12-21", "one-document", "1-1-38", "every-token"])
def test_document_pairs_are_the_visible_pairs_counted_one_by_one(cu):
    assert document_causal_pairs(40, cu) == _visible_pairs(cu, 40)
    assert document_causal_pairs(40, np.asarray(cu, dtype=np.int32)) == _visible_pairs(cu, 40)


def test_one_document_is_the_causal_count_and_bad_boundaries_name_themselves():
    assert document_causal_pairs(40) == document_causal_pairs(40, (0, 40)) == causal_pairs(40)
    with pytest.raises(ValueError, match=r"cu_seqlens=\[0, 7, 39\].*seq_len=40"):
        document_causal_pairs(40, (0, 7, 39))


def test_attention_layer_counts_pairs_per_document_and_projections_per_token():
    single = attention_layer_flops(batch=2, seq_len=40, hidden_size=32, num_heads=4,
                                   num_kv_heads=2, head_dim=8)
    packed = attention_layer_flops(batch=2, seq_len=40, hidden_size=32, num_heads=4,
                                   num_kv_heads=2, head_dim=8, cu_seqlens=PACKED_40)
    pairs = 7 * 8 // 2 + 0 + 12 * 13 // 2 + 21 * 22 // 2  # 28 + 78 + 231 = 337
    assert packed.scores == packed.weighted_values == 2 * 2 * 4 * 8 * pairs
    assert packed.projections == single.projections
    assert single.scores == 2 * 2 * 4 * 8 * (40 * 41 // 2)


def test_a_packed_step_counts_exactly_the_attention_pairs_it_skips_less():
    """model_flops_per_step differs from one document's by exactly the attention core of the
    pairs between documents (× 2 layers, × 3 for the step), and nothing else moves."""
    cfg, B, T = tiny_hybrid(), 2, 40
    single = model_flops_per_step(cfg, batch=B, seq_len=T)
    packed = model_flops_per_step(cfg, batch=B, seq_len=T, cu_seqlens=PACKED_40)
    skipped_pairs = causal_pairs(T) - 337
    qk_and_av, heads, head_dim, attention_layers = 2, 4, 8, 2
    attention_difference = (3 * attention_layers * qk_and_av * 2 * B * heads * head_dim
                            * skipped_pairs)
    assert single.total - packed.total == attention_difference > 0
    assert dataclasses.replace(packed, attention_core=single.attention_core) == single


def test_gdn_only_model_flops_do_not_depend_on_the_documents():
    """The GDN rule is linear in T (its state restarts per document, at no cost in matmuls)."""
    cfg = dataclasses.replace(tiny_hybrid(), layers="gdn_only")
    cu = document_boundaries("uniform:3-9", seq_len=64, seed=0)
    assert model_forward_flops(cfg, batch=1, seq_len=64, cu_seqlens=cu) == \
        model_forward_flops(cfg, batch=1, seq_len=64)


@pytest.mark.parametrize("attn_cp", ["all_gather_kv", "ring", "ulysses"])
def test_hardware_flops_take_the_packed_model_count_and_leave_attention_cp_uncounted(attn_cp):
    cfg, B, T = tiny_hybrid(), 1, 40
    shape = dict(mode="p2p", chips=2, batch=B, seq_len=T, framework="torch", attn_cp=attn_cp,
                 remat="full")
    single = hardware_flops_per_step(cfg, **shape)
    packed = hardware_flops_per_step(cfg, **shape, cu_seqlens=PACKED_40)
    assert packed.model == model_flops_per_step(cfg, batch=B, seq_len=T, cu_seqlens=PACKED_40)
    assert packed.attention_cp == 0 and packed.total >= packed.model.total
    assert (packed.rule, packed.cp_overhead, packed.solve) == (
        single.rule, single.cp_overhead, single.solve)
    # remat full recomputes the forward, attention per document too
    forward_difference = (model_forward_flops(cfg, batch=B, seq_len=T).attention_core
                          - model_forward_flops(cfg, batch=B, seq_len=T,
                                                cu_seqlens=PACKED_40).attention_core)
    assert single.recompute.layers - packed.recompute.layers == \
        forward_difference + single.attention_cp // 3
