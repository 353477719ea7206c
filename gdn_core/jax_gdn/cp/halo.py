"""The causal conv's halo under sequence sharding: the K−1 tokens before each segment.

Each segment's halo is the last K−1 pre-conv tokens of the segment before it in the sequence,
on whichever chip holds it (common.Segments): contiguous, the previous chip's; zigzag, chip
r−1's first segment for chip r's first, chip r+1's second segment for chip r's second (chip
D−1's second segment follows its own first: no transfer). Segment 0 gets zeros.
"""

from __future__ import annotations

import jax.numpy as jnp

from ...cp_layout import Layout
from .common import AxisName, Segments, chip_count


def segment_halos(x_BtC, *, halo: int, axis: AxisName, layout: Layout = "contiguous"):
    """The `halo` tokens before each of this chip's segments: [S, B, halo, C], slot order.

    Call inside shard_map. x_BtC is this chip's shard [B, t, C], its S segments in slot order.
    One ppermute per pair of slots (contiguous: i → i+1, B·halo·C elements; zigzag: i → i+1
    and i+1 → i, so a chip receives at most two halos). Prepend a segment's halo to it before
    a causal conv of kernel halo+1 (the backward is the reversed ppermute, returning the halo's
    gradient to its owner). Raises ValueError when a segment is shorter than the halo or
    halo < 0.
    """
    B, t, C = x_BtC.shape
    seg = Segments(chip_count(axis), layout)
    s = t // seg.slots
    if halo < 0:
        raise ValueError(f"halo={halo} must be >= 0")
    if s < halo:
        what = "local shard" if seg.slots == 1 else f"{layout} segment (of {seg.slots} per chip)"
        raise ValueError(f"{what} of {s} tokens is shorter than the conv halo of {halo} "
                         f"tokens; use fewer chips or a longer sequence")
    if halo == 0:
        return jnp.zeros((seg.slots, B, 0, C), x_BtC.dtype)
    tails = [x_BtC[:, (slot + 1) * s - halo:(slot + 1) * s] for slot in range(seg.slots)]
    received = seg.send(tails, [(e - 1, e) for e in range(1, seg.count)], axis=axis)
    zeros_BhC = jnp.zeros_like(tails[0])
    # A chip that no move targets in a slot (segment 0's) got zeros from the ppermute.
    return jnp.stack([zeros_BhC if got is None else got[0] for got in received])


def conv_halo(x_BTC, *, halo: int, axis: AxisName):
    """Return the `halo` tokens before this chip's contiguous shard: [B, halo, C], zeros on
    chip 0 (segment_halos with layout="contiguous")."""
    return segment_halos(x_BTC, halo=halo, axis=axis)[0]
