"""The causal conv's halo under sequence sharding: the previous chip's last K−1 tokens."""

from __future__ import annotations

import jax.numpy as jnp

from .common import AxisName, chip_count, permute


def conv_halo(x_BTC, *, halo: int, axis: AxisName):
    """Return the `halo` tokens before this chip's shard: [B, halo, C], zeros on chip 0.

    Call inside shard_map. x_BTC is this chip's shard [B, T_local, C]; one ppermute (i → i+1)
    of B·halo·C elements. Prepend the result to x_BTC before a causal conv of kernel halo+1
    (its backward is the reversed ppermute, returning the halo's gradient to its owner).
    Raises ValueError when the shard is shorter than the halo or halo < 0.
    """
    B, T_local, C = x_BTC.shape
    if halo < 0:
        raise ValueError(f"halo={halo} must be >= 0")
    if T_local < halo:
        raise ValueError(f"local shard of {T_local} tokens is shorter than the conv halo of "
                         f"{halo} tokens; use fewer chips or a longer sequence")
    if halo == 0:
        return jnp.zeros((B, 0, C), x_BTC.dtype)
    D = chip_count(axis)
    tail_BHC = x_BTC[:, T_local - halo:]
    return permute(tail_BHC, axis, [(i, i + 1) for i in range(D - 1)])
