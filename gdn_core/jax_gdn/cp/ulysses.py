"""CP mode `ulysses`: all-to-all from sequence shards to head shards, the rule, and back.

Chip j gets the contiguous key heads j·Hk/D … and value heads j·Hv/D … of the whole sequence,
which keeps GQA intact (key head i serves value heads i·r … i·r+r−1). It then runs the
single-chip chunk rule from its slice of h0. Bytes received per chip per direction:
(D−1)/D of q, k, v, g, beta and o's local shards — proportional to the local tokens. Unlike the
sequence-sharded modes, each chip holds the full sequence for Hv/D heads.
"""

from __future__ import annotations

from jax import lax

from ..chunk import chunk_gated_delta_rule
from .common import AxisName, chip_count, chip_index


def ulysses_rule(q, k, v, g, beta, h0_BHKV, *, axis: AxisName, output_final_state: bool,
                 use_qk_l2norm: bool, chunk_size: int):
    """Per-shard rule. Shapes as sequence_sharded_rule; heads must be divisible by D.

    Inside: q, k [B, T, Hk/D, Dk]; v [B, T, Hv/D, Dv]; g, beta [B, T, Hv/D]; state
    [B, Hv/D, Dk, Dv]. The final state is all-gathered over heads into [B, Hv, Dk, Dv].
    """
    D, me = chip_count(axis), chip_index(axis)
    Hv_local = v.shape[2] // D

    def to_heads(x):  # [B, T/D, H, ...] -> [B, T, H/D, ...]
        return lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True)

    h0_local_BHKV = lax.dynamic_slice_in_dim(h0_BHKV, me * Hv_local, Hv_local, axis=1)
    o_heads, final_local_BHKV = chunk_gated_delta_rule(
        *(to_heads(x) for x in (q, k, v, g, beta)), initial_state=h0_local_BHKV,
        output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm,
        chunk_size=chunk_size)
    o = lax.all_to_all(o_heads, axis, split_axis=1, concat_axis=2, tiled=True)
    if not output_final_state:
        return o, None
    return o, lax.all_gather(final_local_BHKV, axis, axis=1, tiled=True, to="invarying")
