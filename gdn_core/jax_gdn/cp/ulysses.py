"""CP mode `ulysses`: all-to-all from sequence shards to head shards, the rule, and back.

Chip j gets the whole sequence of value heads j·Hv/D … (j+1)·Hv/D − 1 and of the G key (and
query) heads they use (`cp_modes.UlyssesHeads`: the contiguous key heads j·Hk/D … when D
divides Hk; with fewer key heads than chips, a key head goes to every chip whose value heads
use it, as DeepSpeed-Ulysses replicates KV heads). It then runs the single-chip chunk rule from
its slice of h0. Bytes received per chip per direction:
    (D−1)·B·t·(2·G·Dk·|q| + (Hv/D)·(Dv·|v| + |g| + |β|) + (Hv/D)·Dv·|o|)
(t = T/D local tokens, |x| the item size) — proportional to the local tokens. Unlike the
sequence-sharded modes, each chip holds the full sequence for Hv/D heads.

Under layout="zigzag" the all-to-all brings the chips' shards in chip order, i.e. the sequence
in zigzag shard order: each chip puts the received segments into sequence order locally before
the rule and back into shard order after it (`segments_in_sequence_order`), so the bytes are
the same as contiguous and nothing else crosses chips.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ...cp_layout import Layout, segments
from ...cp_modes import UlyssesHeads
from ..chunk import chunk_gated_delta_rule
from .common import AxisName, chip_count, chip_index


def key_heads_for_chips(x_BtGd, plan: UlyssesHeads):
    """[B, t, Hk, d] → [B, t, D·G, d]: block j holds chip j's key heads (copies where shared).

    The copies' gradients are summed locally (the gather's transpose): nothing more crosses.
    """
    heads = plan.send_key_heads
    if heads == tuple(range(x_BtGd.shape[2])):
        return x_BtGd
    return x_BtGd[:, :, np.asarray(heads)]


def segments_in_sequence_order(x_BT_, *, chips: int, layout: Layout, inverse: bool = False):
    """Reorder the whole sequence [B, T, ...] from the chips' shard order (chip 0's shard, then
    chip 1's, …) into sequence order; inverse: back. A local gather of segments; identity for
    the contiguous layout."""
    if layout == "contiguous":
        return x_BT_
    held = np.concatenate([segments(chip=c, chips=chips, layout=layout) for c in range(chips)])
    order = held if inverse else np.argsort(held)  # sequence order: segment e is held[...] = e
    B, T = x_BT_.shape[:2]
    x_BEs_ = x_BT_.reshape(B, len(held), T // len(held), *x_BT_.shape[2:])
    return x_BEs_[:, order].reshape(x_BT_.shape)


def ulysses_rule(q, k, v, g, beta, h0_BHKV, *, axis: AxisName, output_final_state: bool,
                 use_qk_l2norm: bool, chunk_size: int | None, layout: Layout = "contiguous",
                 cu_seqlens=None, rule=chunk_gated_delta_rule):
    """Per-shard rule. Shapes as sequence_sharded_rule; value heads must be divisible by D.

    Inside: q, k [B, T, G, Dk]; v [B, T, Hv/D, Dv]; g, beta [B, T, Hv/D]; state
    [B, Hv/D, Dk, Dv], the sequence put in order locally (segments_in_sequence_order). The
    final state is gathered over heads into [B, Hv, Dk, Dv]. cu_seqlens (global, packed
    documents) goes to the single-chip rule as it is: the chip holds the whole sequence.
    rule: the single-chip rule, ours or a kernel with the state in and out
    (kernel_rule.StateKernel; chunk_size None: the kernel has its own bound): one call per
    chip either way.
    """
    D, me = chip_count(axis), chip_index(axis)
    plan = UlyssesHeads(num_k_heads=k.shape[2], num_v_heads=v.shape[2], chips=D)
    Hv_local = plan.value_heads_per_chip

    def to_heads(x):  # [B, T/D, D·H', ...] -> [B, T, H', ...] in sequence order
        return segments_in_sequence_order(
            lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True), chips=D,
            layout=layout)

    q_keys, k_keys = (key_heads_for_chips(x, plan) for x in (q, k))
    h0_local_BHKV = lax.dynamic_slice_in_dim(h0_BHKV, me * Hv_local, Hv_local, axis=1)
    o_heads, final_local_BHKV = rule(
        *(to_heads(x) for x in (q_keys, k_keys, v, g, beta)), initial_state=h0_local_BHKV,
        output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm,
        **({} if chunk_size is None else {"chunk_size": chunk_size}),
        **({} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}))
    o = lax.all_to_all(segments_in_sequence_order(o_heads, chips=D, layout=layout,
                                                  inverse=True),
                       axis, split_axis=1, concat_axis=2, tiled=True).astype(q.dtype)
    if not output_final_state:
        return o, None
    # Every chip's heads into one replicated state by a psum of zero-padded slices (as
    # common.from_chip): its transpose is right with or without shard_map's check_vma, where
    # all_gather(to="invarying") under check_vma=False hands each chip D copies of the final
    # state's cotangent.
    placed = lax.dynamic_update_slice_in_dim(
        jnp.zeros((final_local_BHKV.shape[0], Hv_local * D, *final_local_BHKV.shape[2:]),
                  jnp.float32), final_local_BHKV.astype(jnp.float32), me * Hv_local, axis=1)
    return o, lax.psum(placed, axis)
